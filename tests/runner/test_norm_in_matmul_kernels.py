"""The decode-size matmuls carrying the decoder norms (runner/layers/triton_norm_in_matmul.py)
against the torch references of runner/layers/norm_in_matmul.py: the
producer (the residual added into in place, and its parts) of the skinny and
medium matmuls, the consumer (each row's sums scaled by the rstd of its
parts) of the gate/up and qkv + rotary kernels, skinny and medium; split
over K or not, masked row and column tails, parts of one or several
columns. The interpreter on CPU, compiled with CUDA. Then the routing of
``row_parallel_matmul_add``, ``gate_up_silu`` and ``qkv_rotary_write_kv``
with parts, their fallbacks, and ``norms_in_matmuls``."""

import pytest
import torch
import torch.nn.functional as F

import runner.layers.triton_medium_matmul as medium
import runner.layers.triton_qkv_rotary as qkv_rotary
import runner.layers.triton_skinny_matmul as skinny
from runner import ops
from runner.layers.activation import gate_up_silu_ref
from runner.layers.norm_in_matmul import (
    embedding_with_parts_ref,
    row_parallel_matmul_add_ref,
    row_sum_of_squares,
)
from runner.layers.rotary import RotaryEmbedding, qkv_rotary_write_kv_ref
from runner.layers.split_k import COUNTERS
from runner.layers.triton_embedding import embedding_with_parts_triton
from runner.layers.triton_medium_matmul import (
    medium_gate_up_silu,
    medium_matmul_add,
    medium_qkv_rotary_write_kv,
)
from runner.layers.triton_norm_in_matmul import norms_in_matmuls
from runner.layers.triton_qkv_rotary import skinny_qkv_rotary_write_kv
from runner.layers.triton_skinny_matmul import skinny_gate_up_silu, skinny_matmul_add
from tests.helpers.kernel_device import KERNEL_DEVICE, kernel_dtypes

DEVICE = KERNEL_DEVICE
DTYPES = kernel_dtypes(torch.float32, torch.float16)
EPS = 1e-5
SKINNY_ROWS, MEDIUM_ROWS = 5, 20  # 11 and 12 masked rows of the 16- and 32-row tiles
N, K = 70, 104  # outputs: a masked tail of every block_n; K: a masked last tile of 32


def _tol(dtype):
    return dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=3e-2)


def _counters_at_zero():
    return not COUNTERS.at_least(8, DEVICE)[:8].any()


def _group_squares(residual, block_n):
    """[rows, cdiv(n, block_n)]: each column group's sum of squares, float32."""
    squares = residual.float() ** 2
    return torch.stack([g.sum(-1) for g in squares.split(block_n, dim=-1)], dim=-1)


def _split_parts(x, widths):
    """x's parts as a producer of column groups ``widths`` (unequal) writes them."""
    return torch.cat([row_sum_of_squares(c) for c in x.split(widths, dim=-1)], dim=-1)


PARTS_WIDTHS = {1: [K], 3: [17, 60, K - 77]}


def _raw_residual(rows, dtype, gen):
    """A residual stream's rows: scaled unevenly, the last one so small that
    eps weighs in its rstd."""
    x = torch.randn(rows, K, generator=gen) * torch.linspace(0.5, 8.0, rows)[:, None]
    x[-1] *= 1e-3
    return x.to(dtype)


# --- the producer: residual += x @ w.T in place, and its parts


def _producer_case(rows, dtype, seed):
    """Integer inputs, so the float32 sums are exact on any device and the
    rounding of the epilogue is checked bit for bit (sums of a few
    thousand: most not representable in half precision); a residual of
    fractions, a view into a larger buffer filled with a marker."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(-8, 9, (rows, K), generator=gen).to(dtype)
    w = torch.randint(-64, 65, (N, K), generator=gen).to(dtype)
    buffer = torch.full((rows + 2, N + 8), -3.0).to(dtype)
    buffer[1:rows + 1, 3:N + 3] = (torch.randn(rows, N, generator=gen) * 300).to(dtype)
    return x, w, buffer


def _check_producer(launch, rows, dtype, block_n, seed):
    x, w, buffer = _producer_case(rows, dtype, seed)
    before = buffer[1:rows + 1, 3:N + 3]
    want = (F.linear(x.float(), w.float()).to(dtype).float() + before.float()).to(dtype)
    want_ref = before.clone()
    want_parts = row_parallel_matmul_add_ref(x, w, want_ref)
    torch.testing.assert_close(want_ref, want, **_tol(dtype))

    got_buffer = buffer.to(DEVICE)
    residual = got_buffer[1:rows + 1, 3:N + 3]
    storage = residual.data_ptr()
    parts = launch(x.to(DEVICE), w.to(DEVICE), residual)
    assert residual.data_ptr() == storage
    assert torch.equal(residual.cpu(), want)  # the residual itself, rounded twice
    around = buffer.clone()
    around[1:rows + 1, 3:N + 3] = want
    assert torch.equal(got_buffer.cpu(), around)  # and nothing else
    parts = parts.cpu()
    assert parts.shape == (rows, -(-N // block_n)) and parts.dtype == torch.float32
    torch.testing.assert_close(parts, _group_squares(want, block_n), rtol=1e-6, atol=0)
    torch.testing.assert_close(parts.sum(-1), row_sum_of_squares(want)[:, 0], rtol=1e-6, atol=0)
    torch.testing.assert_close(parts.sum(-1), want_parts[:, 0], rtol=1e-6, atol=0)
    assert _counters_at_zero()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split_k", [1, 3])
def test_skinny_matmul_add(dtype, split_k):
    """Three splits of four K tiles: the last split reads nothing."""
    _check_producer(lambda x, w, r: skinny_matmul_add(x, w, r, block_n=32, block_k=32,
                                                      split_k=split_k),
                    SKINNY_ROWS, dtype, 32, seed=split_k)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split_k,tma", [(1, False), (3, True)])
def test_medium_matmul_add(dtype, split_k, tma):
    _check_producer(lambda x, w, r: medium_matmul_add(x, w, r, block_n=16, block_k=32,
                                                      split_k=split_k, num_stages=2, tma=tma),
                    MEDIUM_ROWS, dtype, 16, seed=10 + split_k)


# --- the consumers: each row's sums scaled by the rstd of its parts


def _gate_up_case(rows, dtype, seed, num_parts):
    gen = torch.Generator().manual_seed(seed)
    x = _raw_residual(rows, dtype, gen)
    w = (torch.randn(2 * 40, K, generator=gen) / K ** 0.5).to(dtype)
    return x, w, _split_parts(x, PARTS_WIDTHS[num_parts])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_parts", [1, 3])
def test_skinny_gate_up_silu_with_parts(dtype, num_parts):
    x, w, parts = _gate_up_case(SKINNY_ROWS, dtype, num_parts, num_parts)
    got = skinny_gate_up_silu(x.to(DEVICE), w.to(DEVICE), block_n=16, block_k=32,
                              parts=parts.to(DEVICE), eps=EPS).cpu()
    torch.testing.assert_close(got, gate_up_silu_ref(x, w, parts, EPS), **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_parts,split_k,tma", [(1, 1, False), (3, 2, True)])
def test_medium_gate_up_silu_with_parts(dtype, num_parts, split_k, tma):
    x, w, parts = _gate_up_case(MEDIUM_ROWS, dtype, 20 + split_k, num_parts)
    got = medium_gate_up_silu(x.to(DEVICE), w.to(DEVICE), block_n=16, block_k=32,
                              split_k=split_k, num_stages=2, tma=tma, parts=parts.to(DEVICE),
                              eps=EPS).cpu()
    torch.testing.assert_close(got, gate_up_silu_ref(x, w, parts, EPS), **_tol(dtype))
    assert _counters_at_zero()


NUM_BLOCKS, BLOCK_SIZE, HQ, HK, HEAD_DIM = 4, 8, 2, 1, 64


def _qkv_case(rows, dtype, seed, num_parts):
    """The raw residual, its parts, a qkv weight, positions, slots (one -1,
    the last row unmapped) and a cache filled with a marker."""
    gen = torch.Generator().manual_seed(seed)
    x = _raw_residual(rows, dtype, gen)
    w = (torch.randn((HQ + 2 * HK) * HEAD_DIM, K, generator=gen) / K ** 0.5).to(dtype)
    positions = torch.randint(0, 200, (rows,), generator=gen)
    slots = torch.randperm(NUM_BLOCKS * BLOCK_SIZE, generator=gen)[:rows - 1]
    slots[1] = -1
    cache = torch.full((2, NUM_BLOCKS, BLOCK_SIZE, HK, HEAD_DIM), -7.0).to(dtype)
    return x, w, positions, slots, cache, _split_parts(x, PARTS_WIDTHS[num_parts])


def _check_qkv(fn, rows, dtype, seed, num_parts, **config):
    x, w, positions, slots, cache, parts = _qkv_case(rows, dtype, seed, num_parts)
    rope = RotaryEmbedding(HEAD_DIM, 256, 10000.0, None)
    want_cache = cache.clone()
    want_q = qkv_rotary_write_kv_ref(x, w, positions, rope.cos, rope.sin, want_cache, slots,
                                     HQ, HK, parts, EPS)
    got_cache = cache.to(DEVICE)
    got_q = fn(x.to(DEVICE), w.to(DEVICE), positions.to(DEVICE), rope.cos.to(DEVICE),
               rope.sin.to(DEVICE), got_cache, slots.to(DEVICE), HQ, HK, **config,
               parts=parts.to(DEVICE), eps=EPS)
    torch.testing.assert_close(got_q.cpu(), want_q, **_tol(dtype))
    torch.testing.assert_close(got_cache.cpu(), want_cache, **_tol(dtype))
    assert _counters_at_zero()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_parts,split_k", [(1, 1), (3, 3)])
def test_skinny_qkv_rotary_with_parts(dtype, num_parts, split_k):
    _check_qkv(skinny_qkv_rotary_write_kv, SKINNY_ROWS, dtype, 30 + split_k, num_parts,
               block_p=16, block_k=32, num_stages=2, split_k=split_k)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_parts,split_k", [(1, 1), (3, 3)])
def test_medium_qkv_rotary_with_parts(dtype, num_parts, split_k):
    _check_qkv(medium_qkv_rotary_write_kv, MEDIUM_ROWS, dtype, 40 + split_k, num_parts,
               block_p=16, block_k=32, num_stages=2, split_k=split_k)


@pytest.mark.parametrize("family", ["skinny", "medium"])
def test_a_producers_parts_feed_a_consumer(family):
    """down's parts (one a column group) are the next gate/up's norm: the
    chain equals the references' chain."""
    rows = SKINNY_ROWS if family == "skinny" else MEDIUM_ROWS
    gen = torch.Generator().manual_seed(50)
    h = torch.randn(rows, K, generator=gen)
    down = torch.randn(N, K, generator=gen) / K ** 0.5
    gate_up = torch.randn(2 * 24, N, generator=gen) / N ** 0.5
    residual = torch.randn(rows, N, generator=gen) * 4
    want_residual = residual.clone()
    want = gate_up_silu_ref(want_residual, gate_up,
                            row_parallel_matmul_add_ref(h, down, want_residual), EPS)
    residual = residual.to(DEVICE)
    if family == "skinny":
        parts = skinny_matmul_add(h.to(DEVICE), down.to(DEVICE), residual, block_n=16,
                                  block_k=32)
        got = skinny_gate_up_silu(residual, gate_up.to(DEVICE), block_n=16, block_k=32,
                                  parts=parts, eps=EPS)
    else:
        parts = medium_matmul_add(h.to(DEVICE), down.to(DEVICE), residual, block_n=16,
                                  block_k=32, num_stages=2)
        got = medium_gate_up_silu(residual, gate_up.to(DEVICE), block_n=16, block_k=32,
                                  num_stages=2, parts=parts, eps=EPS)
    assert parts.shape == (rows, 5)
    torch.testing.assert_close(residual.cpu(), want_residual, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)


def test_rejects_parts_and_residuals_that_do_not_fit():
    x = torch.zeros(3, 32, device=DEVICE)
    w = torch.zeros(16, 32, device=DEVICE)
    parts = torch.ones(3, 2, device=DEVICE)
    for bad in (parts[:2], parts.half(), parts.T.contiguous().T, parts[:, :0]):
        with pytest.raises(ValueError, match="takes parts"):
            skinny_gate_up_silu(x, w, parts=bad)
    with pytest.raises(ValueError, match="takes parts"):
        medium_gate_up_silu(x, w, parts=parts[:2])
    residual = torch.zeros(3, 16, device=DEVICE)
    for bad in (residual[:2], residual.half(), residual.T.contiguous().T):
        with pytest.raises(ValueError, match="residual"):
            skinny_matmul_add(x, w, bad)
        with pytest.raises(ValueError, match="residual"):
            medium_matmul_add(x, w, bad)


# --- routing and fallbacks


class Parts(torch.Tensor):
    """A marker type for the parts a routing test passes along."""


def _record(monkeypatch, taken, module, names) -> None:
    """Replace ``names`` in ``module`` by recorders that append (name, the
    Parts they got, by keyword or positionally) to ``taken``."""
    def recorder(name):
        def record(*args, **kwargs):
            parts = kwargs.get("parts", next((a for a in args if isinstance(a, Parts)), None))
            taken.append((name, parts))
        return record

    for name in names:
        monkeypatch.setattr(module, name, recorder(name))


def test_routing_with_parts_by_rows(monkeypatch):
    """8B widths in bf16: 16 rows to the skinny kernels, 17 to the medium
    ones, 65 to the fallbacks; the consumers pass their parts on."""
    taken = []
    _record(monkeypatch, taken, skinny, [
        "skinny_matmul_add", "medium_matmul_add", "row_parallel_matmul_add_ref",
        "skinny_gate_up_silu", "medium_gate_up_silu", "cublas_gate_up_silu"])
    _record(monkeypatch, taken, qkv_rotary, [
        "skinny_qkv_rotary_write_kv", "medium_qkv_rotary_write_kv",
        "unfused_qkv_rotary_write_kv"])
    o_proj = torch.zeros(4096, 64, dtype=torch.bfloat16)
    gate_up = torch.zeros(2 * 4096, 64, dtype=torch.bfloat16)
    qkv = torch.zeros(48 * 128, 64, dtype=torch.bfloat16)
    cache = torch.zeros(2, 10, 8, 8, 128, dtype=torch.bfloat16)
    want = []
    for rows, kind in ((16, "skinny"), (17, "medium"), (65, None)):
        x = torch.zeros(rows, 64, dtype=torch.bfloat16)
        parts = torch.ones(rows, 2).as_subclass(Parts)
        skinny.row_parallel_matmul_add(x, o_proj, torch.zeros(rows, 4096, dtype=torch.bfloat16))
        skinny.gate_up_silu(x, gate_up, parts, EPS)
        qkv_rotary.qkv_rotary_write_kv(x, qkv, torch.arange(rows), None, None, cache,
                                       torch.arange(rows), 32, 8, parts, EPS)
        names = ((f"{kind}_matmul_add", f"{kind}_gate_up_silu", f"{kind}_qkv_rotary_write_kv")
                 if kind else ("row_parallel_matmul_add_ref", "cublas_gate_up_silu",
                               "unfused_qkv_rotary_write_kv"))
        want += [(names[0], None), (names[1], parts), (names[2], parts)]
    assert len(taken) == len(want)
    for (name, parts), (want_name, want_parts) in zip(taken, want):
        assert name == want_name and parts is want_parts


def test_fallbacks_with_parts_match_the_references():
    """Inputs no kernel takes (float32): ``row_parallel_matmul_add`` is the
    reference, the consumers' projection is ``normed_linear_ref``'s before
    the activation and rotary kernels."""
    gen = torch.Generator().manual_seed(60)
    x = torch.randn(3, 32, generator=gen)
    w = torch.randn(24, 32, generator=gen)
    residual = torch.randn(3, 24, generator=gen)
    want_residual = residual.clone()
    want_parts = row_parallel_matmul_add_ref(x, w, want_residual)
    parts = skinny.row_parallel_matmul_add(x, w, residual)
    assert torch.equal(residual, want_residual) and torch.equal(parts, want_parts)

    h = torch.randn(3, 24, generator=gen) * 3
    h_parts = _split_parts(h, [10, 14])
    got = skinny.gate_up_silu(h.to(DEVICE), w.T.contiguous().to(DEVICE), h_parts.to(DEVICE), EPS)
    torch.testing.assert_close(got.cpu(), gate_up_silu_ref(h, w.T.contiguous(), h_parts, EPS))

    _check_qkv(qkv_rotary.qkv_rotary_write_kv, 4, torch.float32, 61, 3)


def _weights(*shapes):  # the shapes only: the routing reads no element
    return tuple(torch.empty(1, k, dtype=torch.bfloat16).expand(n, k) for n, k in shapes)


def test_norms_in_matmuls_where_every_projection_takes_a_kernel(monkeypatch):
    """The 8B shapes in bf16: 1..16 rows (skinny) and 17..64 (medium); not
    65, nor float32, nor 17..64 with the medium kernels switched off."""
    shapes = _weights((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))

    def carries(rows, dtype=torch.bfloat16):
        return norms_in_matmuls(rows, dtype, torch.device("cpu"), *shapes, 128)

    assert all(carries(rows) for rows in (1, 16, 17, 32, 33, 64))
    assert not carries(65)
    assert not carries(8, torch.float32)
    monkeypatch.setattr(medium, "MEDIUM_MATMUL_ENABLED", False)
    assert not carries(17) and carries(16)


def test_norms_in_matmuls_where_a_skinny_producer_splits_k():
    """The 1B shapes (2048 hidden): o_proj and down on the skinny kernel
    split K at 1..16 rows (64 column groups for 132 SMs) and still carry;
    17..64 rows take the medium kernels and carry."""
    shapes = _weights((3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192))
    x = torch.empty(1, 2048, dtype=torch.bfloat16).expand(8, 2048)
    assert skinny.uses_skinny_matmul(x, shapes[1]) and skinny.skinny_split_k(x, shapes[1]) > 1
    assert all(norms_in_matmuls(rows, torch.bfloat16, torch.device("cpu"), *shapes, 64)
               for rows in (1, 8, 16, 17, 32, 64))


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_with_parts(dtype):
    """The embedding as the first producer: each token's row copied into a
    new residual, bit for bit, and one part a row, the float32 sum of the
    stored row's squares; repeated and edge ids (0, the last row); a width
    that is no power of two (the masked tail of the block); ids of no row
    read zeros."""
    gen = torch.Generator().manual_seed(7)
    table = (torch.randn(50, 200, generator=gen) * 4).to(dtype)
    ids = torch.tensor([3, 0, 49, 3, 17], dtype=torch.int32)
    rows, parts = embedding_with_parts_triton(ids.to(DEVICE), table.to(DEVICE))
    assert torch.equal(rows.cpu(), table[ids.long()])
    assert parts.shape == (5, 1) and parts.dtype == torch.float32
    want = torch.stack([(table[i].float() ** 2).sum() for i in ids.tolist()])
    torch.testing.assert_close(parts.cpu()[:, 0], want, rtol=1e-6, atol=0)
    ref_rows, ref_parts = embedding_with_parts_ref(ids.long(), table)
    assert torch.equal(ref_rows, rows.cpu())
    torch.testing.assert_close(ref_parts, parts.cpu(), rtol=1e-6, atol=0)
    outside = torch.tensor([-1, 50], dtype=torch.int32)  # ids of no row: zeros
    rows, parts = embedding_with_parts_triton(outside.to(DEVICE), table.to(DEVICE))
    assert not rows.cpu().any() and not parts.cpu().any()
    empty_rows, empty_parts = embedding_with_parts_triton(ids[:0].to(DEVICE), table.to(DEVICE))
    assert empty_rows.shape == (0, 200) and empty_parts.shape == (0, 1)


def test_the_device_seam_names_the_kernels():
    kernels = ops.triton_ops(torch.device("cpu"))
    assert kernels.row_parallel_matmul_add is skinny.row_parallel_matmul_add
    assert kernels.gate_up_silu is skinny.gate_up_silu
    assert kernels.norms_in_matmuls is norms_in_matmuls
    assert kernels.embedding_with_parts is embedding_with_parts_triton


needs_hopper = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
    reason="needs a CUDA device of compute capability 9.0 or up")


def _norm_chain(residual, weights):
    """The MLP halves of decoder layers with their norms in the matmuls:
    gate/up scaled by the parts, down added into the residual."""
    parts = row_sum_of_squares(residual)
    for w_up, w_down in weights:
        parts = skinny_matmul_add(skinny_gate_up_silu(residual, w_up, parts=parts, eps=EPS),
                                  w_down, residual)
    return parts


@needs_hopper
def test_graph_with_pdl_equals_plain_launches(monkeypatch):
    """With PDL the next kernel starts after the K loop of one that carries a
    norm; a CUDA graph of the chain gives bit for bit the plain launches'."""
    torch.manual_seed(0)
    dev = torch.device("cuda")
    hidden, inter = 1024, 2048
    start = torch.randn(2, hidden, device=dev, dtype=torch.bfloat16)
    weights = [(torch.randn(2 * inter, hidden, device=dev, dtype=torch.bfloat16) / 32,
                torch.randn(hidden, inter, device=dev, dtype=torch.bfloat16) / 45)
               for _ in range(8)]
    monkeypatch.setattr(ops, "PDL_ENABLED", False)
    want_residual = start.clone()
    want_parts = _norm_chain(want_residual, weights)

    monkeypatch.setattr(ops, "PDL_ENABLED", True)
    residual = start.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up: compiles the PDL variants
        _norm_chain(residual, weights)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got_parts = _norm_chain(residual, weights)
    for _ in range(20):
        residual.copy_(start)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(residual, want_residual)
        assert torch.equal(got_parts, want_parts)
