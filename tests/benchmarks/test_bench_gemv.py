"""bench_gemv.py --medium's plan (no device needed): which rows it times,
and the qkv + rotary sweep's pruning."""

from benchmarks.bench_gemv import (
    QKV_ROTARY_ROW,
    SMEM_BYTES,
    heads_of,
    medium_plan,
    medium_sweep,
)
from runner.layers.split_k import MIN_TILES_PER_SPLIT


def test_plan_times_the_fused_qkv_row_after_qkv_and_projections_pick_rows():
    plan = medium_plan(["8b"], [32], None)
    assert [row[1] for row in plan] == ["qkv", QKV_ROTARY_ROW, "o_proj", "gate_up", "down"]
    (fused,) = medium_plan(["8b"], [64], None, [QKV_ROTARY_ROW])
    shape, name, n, k, rows, configs = fused
    assert (shape, name, n, k, rows) == ("8b", QKV_ROTARY_ROW, 6144, 4096, 64)
    assert configs and all(set(c) == {"block_p", "block_k", "split_k", "num_warps",
                                      "num_stages"} for c in configs)
    given = [dict(block_n=64)]
    picked = medium_plan(["1b"], [32], given, ["gate_up+silu", "qkv"])
    assert [(row[1], row[5]) for row in picked] == [("qkv", given), ("gate_up", given)]


def test_qkv_rotary_sweep_fits_the_heads_and_shared_memory():
    for head_dim, k, rows in ((128, 4096, 32), (128, 4096, 64), (64, 2048, 32), (64, 2048, 64)):
        configs = medium_sweep("qkv_rotary", k, rows, head_dim)
        pad = 32 if rows <= 32 else 64
        for c in configs:
            w_rows = 2 * c["block_p"]
            assert head_dim % w_rows == 0
            assert c["num_stages"] * (w_rows + pad) * c["block_k"] * 2 <= SMEM_BYTES
            assert c["num_warps"] == 4 or w_rows >= 128
            assert -(-k // c["block_k"]) // c["split_k"] >= MIN_TILES_PER_SPLIT
        assert {c["block_p"] for c in configs} == ({32, 64} if head_dim == 128 else {32})
        assert {c["split_k"] for c in configs} == {1, 2, 4}
    # Kernels to compile for 8b + 1b at 32 and 64 rows: the sweep's budget.
    assert len({(row[0], row[4], str(c)) for row in medium_plan(["8b", "1b"], [32, 64], None,
                                                                  [QKV_ROTARY_ROW])
                for c in row[5]}) <= 160


def test_heads_of_the_qkv_weight_rows():
    assert heads_of(6144) == (32, 8, 128)
    assert heads_of(3072) == (32, 8, 64)
