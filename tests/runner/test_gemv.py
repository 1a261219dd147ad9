"""The one-row products streamed through registers (runner/layers/triton_gemv.py)
against the torch reference: the producer's residual += x @ w.T in place and
its parts, and the LM head's x @ w.T, bit for bit on integer inputs, with
inputs wider than one loop step and masked tails of both K and the output
columns. The interpreter on CPU, compiled with CUDA. Then the routing that
sends one row of a narrow input here and everything else to the skinny
kernel, and the LM head's routing (one row here, 2..64 rows to the medium
kernel, more to cuBLAS)."""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import runner.layers.triton_skinny_matmul as skinny
from runner.distributed import TensorParallelGroup
from runner.layers.norm_in_matmul import row_parallel_matmul_add_ref, row_sum_of_squares
from runner.layers.triton_gemv import (
    GEMV_BLOCK_K,
    GEMV_BLOCK_N,
    GEMV_MAX_K,
    LM_HEAD_BLOCK_K,
    LM_HEAD_BLOCK_N,
    gemv,
    gemv_matmul_add,
    uses_gemv,
)
from runner.layers.triton_skinny_matmul import lm_head_matmul
from runner.layers.vocab_parallel import ParallelLMHead, VocabParallelEmbedding
from runner.ops import triton_ops
from tests.helpers.kernel_device import KERNEL_DEVICE, kernel_dtypes
from tests.helpers.proc_utils import ROOT, pythonpath

DEVICE = KERNEL_DEVICE
DTYPES = kernel_dtypes(torch.float32, torch.float16)
N = 29  # a masked tail of the last column group (GEMV_BLOCK_N, LM_HEAD_BLOCK_N a group)
assert N % GEMV_BLOCK_N and N % LM_HEAD_BLOCK_N
WIDTHS = [104, GEMV_BLOCK_K + 300]  # one masked loop step; two, the second masked


def _tol(dtype):
    return dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=3e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", WIDTHS)
def test_gemv_matmul_add_is_the_unfused_pair(dtype, k):
    """Integer inputs: the float32 sums are exact in any order, so the
    residual is checked bit for bit (the product rounded, then the sum), in
    place inside a larger buffer that keeps every other value, and the parts
    are each column group's squares."""
    gen = torch.Generator().manual_seed(k)
    x = torch.randint(-8, 9, (1, k), generator=gen).to(dtype)
    w = torch.randint(-64, 65, (N, k), generator=gen).to(dtype)
    buffer = torch.full((3, N + 8), -3.0).to(dtype)
    buffer[1, 3:N + 3] = (torch.randn(N, generator=gen) * 300).to(dtype)
    before = buffer[1:2, 3:N + 3]
    want = (F.linear(x.float(), w.float()).to(dtype).float() + before.float()).to(dtype)
    want_ref = before.clone()  # the reference (its CPU bfloat16 product rounds its own way)
    want_parts = row_parallel_matmul_add_ref(x, w, want_ref)
    torch.testing.assert_close(want_ref, want, **_tol(dtype))

    got_buffer = buffer.to(DEVICE)
    residual = got_buffer[1:2, 3:N + 3]
    parts = gemv_matmul_add(x.to(DEVICE), w.to(DEVICE), residual).cpu()
    assert torch.equal(residual.cpu(), want)
    around = buffer.clone()
    around[1:2, 3:N + 3] = want
    assert torch.equal(got_buffer.cpu(), around)  # nothing else written
    assert parts.shape == (1, -(-N // GEMV_BLOCK_N)) and parts.dtype == torch.float32
    squares = want.float() ** 2
    torch.testing.assert_close(
        parts, torch.stack([g.sum(-1) for g in squares.split(GEMV_BLOCK_N, dim=-1)], dim=-1),
        rtol=1e-6, atol=0)
    torch.testing.assert_close(parts.sum(-1), row_sum_of_squares(want)[:, 0], rtol=1e-6, atol=0)
    torch.testing.assert_close(parts.sum(-1), want_parts[:, 0], rtol=1e-2, atol=0)


def test_gemv_matmul_add_rejects_what_it_cannot_take():
    w = torch.zeros(16, 64)
    with pytest.raises(ValueError, match="one row of width 64"):
        gemv_matmul_add(torch.zeros(2, 64), w, torch.zeros(2, 16))
    with pytest.raises(ValueError, match="one row of width 64"):
        gemv_matmul_add(torch.zeros(1, 32), w, torch.zeros(1, 16))
    with pytest.raises(ValueError, match="unit last strides"):
        gemv_matmul_add(torch.zeros(1, 128)[:, ::2], w, torch.zeros(1, 16))
    with pytest.raises(ValueError, match="residual"):
        gemv_matmul_add(torch.zeros(1, 64), w, torch.zeros(1, 8))


def test_one_row_of_a_narrow_input_goes_to_the_gemv_kernel(monkeypatch):
    """Where the skinny kernel applies (a device of 132 SMs, bf16): one row
    of an input up to GEMV_MAX_K wide takes the one-row kernel; two rows, or
    a wider input (the 8B shape's o and down projections), the skinny one."""
    taken = []
    for name in ("gemv_matmul_add", "skinny_matmul_add"):
        monkeypatch.setattr(skinny, name, lambda *args, name=name: taken.append(name))
    monkeypatch.setattr(skinny, "num_sms", lambda device: 132)
    bf16 = torch.bfloat16
    for rows, k, kind in ((1, GEMV_MAX_K, "gemv"), (2, GEMV_MAX_K, "skinny"),
                          (1, 4096, "skinny"), (1, 14336, "skinny")):
        x = torch.zeros(rows, k, dtype=bf16)
        weight = torch.zeros(2048, k, dtype=bf16)
        skinny.row_parallel_matmul_add(x, weight, torch.zeros(rows, 2048, dtype=bf16))
        assert taken.pop() == f"{kind}_matmul_add" and not taken
        assert uses_gemv(x, weight) == (kind == "gemv")



@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [104, LM_HEAD_BLOCK_K + 300])
def test_gemv_is_the_product_rounded_once(dtype, k):
    """Integer inputs: each output is the exact float32 sum, rounded once to
    the weight's dtype, as F.linear's float32 product then rounded; random
    inputs within the rounding of the sum's order."""
    gen = torch.Generator().manual_seed(k)
    x = torch.randint(-8, 9, (1, k), generator=gen).to(dtype)
    w = torch.randint(-64, 65, (N, k), generator=gen).to(dtype)
    got = gemv(x.to(DEVICE), w.to(DEVICE)).cpu()
    assert got.dtype == dtype and got.shape == (1, N)
    assert torch.equal(got, F.linear(x.float(), w.float()).to(dtype))
    x, w = torch.randn(1, k, generator=gen).to(dtype), torch.randn(N, k, generator=gen).to(dtype)
    torch.testing.assert_close(gemv(x.to(DEVICE), w.to(DEVICE)).cpu().float(),
                               F.linear(x.float(), w.float()), **_tol(dtype))


def test_gemv_rejects_what_it_cannot_take():
    w = torch.zeros(16, 64)
    with pytest.raises(ValueError, match="gemv takes one row of width 64"):
        gemv(torch.zeros(2, 64), w)
    with pytest.raises(ValueError, match="gemv takes one row of width 64"):
        gemv(torch.zeros(1, 32), w)
    with pytest.raises(ValueError, match="gemv needs unit last strides"):
        gemv(torch.zeros(1, 128)[:, ::2], w)


def test_the_lm_head_routes_one_row_to_gemv_and_2_to_64_to_the_medium_kernel(monkeypatch):
    """One half precision row takes the one-row kernel; 2..64 rows the
    medium kernel; 65 rows, float32, or the Triton kernels switched off
    (LM_HEAD_TRITON, for A/B runs) cuBLAS."""
    taken = []
    monkeypatch.setattr(skinny, "gemv", lambda x, w: taken.append("gemv"))
    monkeypatch.setattr(skinny, "medium_matmul", lambda x, w: taken.append("medium"))
    monkeypatch.setattr(F, "linear", lambda x, w: taken.append("linear"))
    half = torch.float16
    for rows, dtype, on, kind in ((1, half, True, "gemv"), (1, torch.bfloat16, True, "gemv"),
                                  (2, half, True, "medium"), (16, half, True, "medium"),
                                  (17, half, True, "medium"), (64, torch.bfloat16, True, "medium"),
                                  (65, half, True, "linear"), (1, torch.float32, True, "linear"),
                                  (1, half, False, "linear"), (32, half, False, "linear")):
        monkeypatch.setattr(skinny, "LM_HEAD_TRITON", on)
        lm_head_matmul(torch.zeros(rows, 64, dtype=dtype), torch.zeros(128256, 64, dtype=dtype))
        assert taken.pop() == kind and not taken
    monkeypatch.setattr(skinny, "LM_HEAD_TRITON", True)
    monkeypatch.setattr(skinny, "LM_HEAD_MEDIUM_MIN_ROWS", 17)  # an A/B variant's setting
    lm_head_matmul(torch.zeros(16, 64, dtype=half), torch.zeros(128256, 64, dtype=half))
    assert taken == ["linear"]


def test_the_lm_head_computes_its_logits_through_the_device_op(monkeypatch):
    """ParallelLMHead's local product is its device's ``lm_head_matmul``:
    with the Triton ops one row's logits are the kernel's, equal to the
    rounded float32 product, cut to the vocabulary."""
    monkeypatch.setattr("runner.layers.vocab_parallel.device_ops", triton_ops)
    calls = []
    real = skinny.gemv
    monkeypatch.setattr(skinny, "gemv", lambda x, w: calls.append(w.shape) or real(x, w))
    gen = torch.Generator().manual_seed(3)
    table = torch.randint(-9, 10, (128, 32), generator=gen).to(torch.float16)
    hidden = torch.randint(-4, 5, (1, 32), generator=gen).to(torch.float16)
    with torch.device(DEVICE):
        embedding = VocabParallelEmbedding(70, 32, TensorParallelGroup(), torch.float16)
        embedding.weight.copy_(table)
        head = ParallelLMHead(embedding, tied=True)
    logits = head(hidden.to(DEVICE), dtype=None).cpu()
    assert calls == [(128, 32)] and logits.shape == (1, 70) and logits.dtype == torch.float16
    assert torch.equal(logits, F.linear(hidden.float(), table.float())[:, :70].to(torch.float16))


# Compiles the kernel for a Hopper GPU (no GPU needed: only the compiler runs)
# and prints the PTX lines of the wait, the global loads and the stores.
COMPILE_CHILD = """
import json, sys
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
import runner.layers.triton_gemv as g

outputs = ({"residual_ptr": "*bf16", "parts_ptr": "*fp32"} if sys.argv[2] == "_gemv_add_kernel"
           else {"out_ptr": "*bf16"})
signature = {"x_ptr": "*bf16", "w_ptr": "*bf16", **outputs, "N": "i32", "K": "i32",
             "stride_w": "i32", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
             "EARLY": "constexpr", "PDL": "constexpr"}
constants = {"BLOCK_N": g.GEMV_BLOCK_N, "BLOCK_K": g.GEMV_BLOCK_K, "EARLY": sys.argv[1] == "1",
             "PDL": True}
kernel = compile(ASTSource(fn=getattr(g, sys.argv[2]), signature=signature, constexprs=constants),
                 target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
lines = kernel.asm["ptx"].splitlines()
print(json.dumps({what: [i for i, line in enumerate(lines) if what in line]
                  for what in ("griddepcontrol.wait", "ld.global", "st.global")}))
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kernel", ["_gemv_add_kernel", "_gemv_kernel"])
@pytest.mark.parametrize("early", [True, False])
def test_early_gemv_loads_its_first_weight_tile_before_the_wait(early, kernel):
    """Each kernel as compiled for a Hopper GPU with programmatic dependent
    launch, in a child process (the interpreter off): with EARLY global loads
    (the first weight tile's) come before the wait for the previous kernel,
    without it none; in both every store comes after the wait, and so does
    the first load of the input row, as the PDL invariant
    (runner/triton_dependent_launch.py) asks."""
    env = dict(os.environ, PYTHONPATH=pythonpath())
    env.pop("TRITON_INTERPRET", None)
    child = subprocess.run([sys.executable, "-c", COMPILE_CHILD, "1" if early else "0", kernel],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=150)
    assert child.returncode == 0, child.stderr
    found = json.loads(child.stdout.splitlines()[-1])
    (wait,) = found["griddepcontrol.wait"]
    loads, stores = found["ld.global"], found["st.global"]
    assert loads and stores and min(stores) > wait
    before = [i for i in loads if i < wait]
    assert bool(before) == early
    assert len(before) < len(loads)  # the input row and later tiles after the wait
