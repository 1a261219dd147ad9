"""The Triton layer kernels (RMSNorm with fused residual add, rotary, rotary
with the KV-cache write, SiLU-and-multiply) against their torch references. On CPU they run under the
Triton interpreter (see conftest); with CUDA they run compiled on the GPU."""

import pytest
import torch
import torch.nn.functional as F

from ipc.model_config import Llama3RopeScaling
from runner.attention.kv_write import write_kv
from runner.layers.rms_norm import rms_norm_ref
from runner.layers.rotary import RotaryEmbedding, rotary_ref
from runner.layers.triton_rms_norm import rms_norm_triton
from runner.layers.triton_rotary import rotary_triton, rotary_write_kv_triton
from runner.layers.triton_silu_mul import silu_mul_triton
from tests.helpers.kernel_device import KERNEL_DEVICE

DEVICE = KERNEL_DEVICE
DTYPES = [torch.float32, torch.bfloat16]


def _tol(dtype):
    # bf16: one rounding step of the output may differ (sum order, FMA).
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols", [(1, 64), (7, 100), (33, 512), (0, 64)])
def test_rms_norm_matches_reference(dtype, rows, cols):
    gen = torch.Generator().manual_seed(rows * 1000 + cols)
    x = (3 * torch.randn(rows, cols, generator=gen)).to(dtype)
    w = (1 + 0.1 * torch.randn(cols, generator=gen)).to(dtype)
    got = rms_norm_triton(x.to(DEVICE), w.to(DEVICE), 1e-5).cpu()
    torch.testing.assert_close(got, rms_norm_ref(x, w, 1e-5), **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm_writes_the_sum_into_residual(dtype):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(9, 256, generator=gen).to(dtype)
    res = torch.randn(9, 256, generator=gen).to(dtype)
    w = torch.randn(256, generator=gen).to(dtype)
    summed = x + res
    res_dev = res.clone().to(DEVICE)
    got = rms_norm_triton(x.to(DEVICE), w.to(DEVICE), 1e-6, residual=res_dev).cpu()
    if dtype == torch.float32 or DEVICE.type == "cuda":
        # The sum is rounded exactly as torch's add rounds it.
        assert torch.equal(res_dev.cpu(), summed)
    else:
        # The Triton interpreter's float32 -> bfloat16 cast truncates instead
        # of rounding to nearest: allow that one step.
        torch.testing.assert_close(res_dev.cpu(), summed, **_tol(dtype))
    torch.testing.assert_close(got, rms_norm_ref(summed, w, 1e-6), **_tol(dtype))


def test_rms_norm_of_a_strided_view_of_heads():
    # Qwen3's q/k norms see [T, H, D] views of the fused qkv output.
    qkv = torch.randn(5, 3 * 64 + 2 * 32)
    q = qkv[:, : 3 * 32].unflatten(-1, (3, 32))
    w = torch.randn(32)
    got = rms_norm_triton(q.to(DEVICE), w.to(DEVICE), 1e-6).cpu()
    torch.testing.assert_close(got, rms_norm_ref(q, w, 1e-6), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim,hq,hk", [(64, 4, 1), (128, 8, 8), (96, 6, 2)])
def test_rotary_matches_reference_on_qkv_views(dtype, head_dim, hq, hk):
    scaling = Llama3RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                original_max_position_embeddings=64)
    rope = RotaryEmbedding(head_dim, 512, 500000.0, scaling if head_dim == 128 else None)
    gen = torch.Generator().manual_seed(head_dim + hq)
    tokens = 11
    qkv = torch.randn(tokens, (hq + 2 * hk) * head_dim, generator=gen).to(dtype)
    q = qkv[:, : hq * head_dim].unflatten(-1, (hq, head_dim))
    k = qkv[:, hq * head_dim: (hq + hk) * head_dim].unflatten(-1, (hk, head_dim))
    positions = torch.randint(0, 512, (tokens,), generator=gen)
    want_q, want_k = rotary_ref(positions, q, k, rope.cos, rope.sin)
    qkv_dev = qkv.clone().to(DEVICE)
    q_dev = qkv_dev[:, : hq * head_dim].unflatten(-1, (hq, head_dim))
    k_dev = qkv_dev[:, hq * head_dim: (hq + hk) * head_dim].unflatten(-1, (hk, head_dim))
    got_q, got_k = rotary_triton(positions.to(DEVICE), q_dev, k_dev, rope.cos.to(DEVICE),
                                 rope.sin.to(DEVICE))
    torch.testing.assert_close(got_q.cpu(), want_q, **_tol(dtype))
    torch.testing.assert_close(got_k.cpu(), want_k, **_tol(dtype))
    assert torch.equal(qkv_dev.cpu(), qkv)  # the inputs are left alone


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,inter", [(1, 64), (6, 1500), (3, 2048), (0, 32)])
def test_silu_mul_matches_reference(dtype, tokens, inter):
    gen = torch.Generator().manual_seed(tokens + inter)
    x = (4 * torch.randn(tokens, 2 * inter, generator=gen)).to(dtype)
    gate, up = x.chunk(2, dim=-1)
    got = silu_mul_triton(x.to(DEVICE)).cpu()
    torch.testing.assert_close(got, F.silu(gate) * up, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim,hq,hk,block", [(64, 4, 1, 16), (128, 8, 8, 8), (96, 6, 2, 4)])
def test_rotary_write_kv_matches_rotary_then_kv_write(dtype, head_dim, hq, hk, block):
    rope = RotaryEmbedding(head_dim, 256, 10000.0, None)
    gen = torch.Generator().manual_seed(head_dim * hq + block)
    tokens, num_blocks = 9, 12
    qkv = torch.randn(tokens + 2, (hq + 2 * hk) * head_dim, generator=gen).to(dtype)
    heads = qkv.unflatten(-1, (hq + 2 * hk, head_dim))
    q, k, v = heads[:, :hq], heads[:, hq: hq + hk], heads[:, hq + hk:]
    positions = torch.randint(0, 256, (tokens + 2,), generator=gen)
    # Shuffled slots, one padding token (-1); the last two tokens have no
    # slot_mapping entry at all (a padded graph batch) and store nothing.
    slots = torch.randperm(num_blocks * block, generator=gen)[:tokens]
    slots[4] = -1
    cache = torch.randn(2, num_blocks, block, hk, head_dim, generator=gen).to(dtype)

    want_q, want_k = rotary_ref(positions, q, k, rope.cos, rope.sin)
    want_cache = cache.clone()
    write_kv(want_k[:tokens], v[:tokens], want_cache, slots)

    got_cache = cache.clone().to(DEVICE)
    qkv_dev = qkv.clone().to(DEVICE)
    heads_dev = qkv_dev.unflatten(-1, (hq + 2 * hk, head_dim))
    got_q = rotary_write_kv_triton(
        positions.to(DEVICE), heads_dev[:, :hq], heads_dev[:, hq: hq + hk],
        heads_dev[:, hq + hk:], rope.cos.to(DEVICE), rope.sin.to(DEVICE), got_cache,
        slots.to(DEVICE))
    torch.testing.assert_close(got_q.cpu(), want_q, **_tol(dtype))
    torch.testing.assert_close(got_cache.cpu(), want_cache, **_tol(dtype))
    untouched = torch.ones(num_blocks * block, dtype=torch.bool)
    untouched[slots[slots >= 0]] = False
    flat = got_cache.cpu().flatten(1, 2)
    assert torch.equal(flat[:, untouched], cache.flatten(1, 2)[:, untouched])
