"""The one-row producer streamed through registers (runner/layers/triton_gemv.py)
against the torch reference: residual += x @ w.T in place, bit for bit on
integer inputs, and its parts, with inputs wider than one loop step and
masked tails of both K and the output columns. The interpreter on CPU,
compiled with CUDA. Then the routing that sends one row of a narrow input
here and everything else to the skinny kernel."""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import runner.layers.triton_skinny_matmul as skinny
from runner.layers.norm_in_matmul import row_parallel_matmul_add_ref, row_sum_of_squares
from runner.layers.triton_gemv import (
    GEMV_BLOCK_K,
    GEMV_BLOCK_N,
    GEMV_MAX_K,
    gemv_matmul_add,
    uses_gemv,
)
from tests.helpers.kernel_device import KERNEL_DEVICE, kernel_dtypes
from tests.helpers.proc_utils import ROOT, pythonpath

DEVICE = KERNEL_DEVICE
DTYPES = kernel_dtypes(torch.float32, torch.float16)
N = 29  # a masked tail of the last column group (GEMV_BLOCK_N a group)
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



# Compiles the kernel for a Hopper GPU (no GPU needed: only the compiler runs)
# and prints the PTX lines of the wait, the global loads and the stores.
COMPILE_CHILD = """
import json, sys
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from runner.layers.triton_gemv import GEMV_BLOCK_K, GEMV_BLOCK_N, _gemv_add_kernel

signature = {"x_ptr": "*bf16", "w_ptr": "*bf16", "residual_ptr": "*bf16", "parts_ptr": "*fp32",
             "N": "i32", "K": "i32", "stride_w": "i32", "BLOCK_N": "constexpr",
             "BLOCK_K": "constexpr", "EARLY": "constexpr", "PDL": "constexpr"}
constants = {"BLOCK_N": GEMV_BLOCK_N, "BLOCK_K": GEMV_BLOCK_K, "EARLY": sys.argv[1] == "1",
             "PDL": True}
kernel = compile(ASTSource(fn=_gemv_add_kernel, signature=signature, constexprs=constants),
                 target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
lines = kernel.asm["ptx"].splitlines()
print(json.dumps({what: [i for i, line in enumerate(lines) if what in line]
                  for what in ("griddepcontrol.wait", "ld.global", "st.global")}))
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("early", [True, False])
def test_early_gemv_loads_its_first_weight_tile_before_the_wait(early):
    """The kernel as compiled for a Hopper GPU with programmatic dependent
    launch, in a child process (the interpreter off): with EARLY global loads
    (the first weight tile's) come before the wait for the previous kernel,
    without it none; in both every store comes after the wait, and so does
    the first load of the input row, as the PDL invariant
    (runner/triton_dependent_launch.py) asks."""
    env = dict(os.environ, PYTHONPATH=pythonpath())
    env.pop("TRITON_INTERPRET", None)
    child = subprocess.run([sys.executable, "-c", COMPILE_CHILD, "1" if early else "0"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=150)
    assert child.returncode == 0, child.stderr
    found = json.loads(child.stdout.splitlines()[-1])
    (wait,) = found["griddepcontrol.wait"]
    loads, stores = found["ld.global"], found["st.global"]
    assert loads and stores and min(stores) > wait
    before = [i for i in loads if i < wait]
    assert bool(before) == early
    assert len(before) < len(loads)  # the input row and later tiles after the wait
