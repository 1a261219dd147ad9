"""The LM head of one row with its greedy argmax in one launch
(runner/layers/triton_lm_head_greedy.py): its logits are the unfused GEMV's
bit for bit and its token is torch.argmax of them (first index on ties, a
NaN as the maximum, padding rows past the vocabulary never chosen), stored
at the row's slot, launch after launch. The interpreter on CPU, compiled
with CUDA. Then its routing, the model runner's decode graph with it on
against it off, and its memory accesses after the PDL wait as compiled
for Hopper."""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import runner.layers.triton_lm_head_greedy as fused
import runner.layers.triton_skinny_matmul as skinny
from checkpoint.tiny_model import ensure_tiny_model
from runner.layers.triton_gemv import LM_HEAD_BLOCK_K, LM_HEAD_BLOCK_N, gemv
from runner.layers.triton_lm_head_greedy import gemv_argmax, lm_head_greedy
from runner.layers.vocab_parallel import lm_head_greedy_ref
from runner.ops import triton_ops
from tests.helpers.kernel_device import KERNEL_DEVICE, kernel_dtypes
from tests.helpers.proc_utils import ROOT, pythonpath
from tests.helpers.runner_steps import decode_step, make_runner
from tests.helpers.runner_steps import run_prefill_then_decode as _run

DEVICE = KERNEL_DEVICE
DTYPES = kernel_dtypes(torch.float32, torch.float16)
N = 29  # weight rows: the last program's group is masked (LM_HEAD_BLOCK_N a program)
assert N % LM_HEAD_BLOCK_N
K = 40
BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def _case(name: str, dtype: torch.dtype, gen: torch.Generator):
    """(x [1, K], w [N, K], vocab_size) of integer values (exact sums)
    whose logits hold the case's feature; the expected token is never
    written here, only torch.argmax of the returned logits."""
    x = torch.randint(1, 5, (1, K), generator=gen).float()
    w = torch.randint(-30, 31, (N, K), generator=gen).float()
    vocab = N
    if name == "ties":  # the max at 5 (2nd program), 8 and 9 (one program), 27
        w[[8, 9, 27]] = w[5] = w.abs().max() + 1
    elif name == "ties-in-one-program":  # 13 and 14 tie, above 5 and 27 that tie too
        w[[5, 27]] = w.abs().max() + 1
        w[[13, 14]] = w.abs().max() + 2
    elif name == "padding":  # rows past the vocabulary hold the largest logits
        vocab = N - 3
        w[vocab:] = w.abs().max() + 5
    elif name == "nan":  # NaN logits at 11 and 20 (sign bit set): the first is the token
        w[[11, 20], 0] = -float("nan")
    elif name == "minus-inf":  # every logit -inf: token 0
        w[:, 0] = float("-inf")
    elif name == "zeros":  # max 0: -0 at 3 (a tiny negative the 16-bit store rounds to -0), +0 at 10
        x[0, 0] = 2.0 ** -14
        w[:] = 0.0
        w[:, 1] = -1.0
        w[3, 0], w[3, 1] = -(2.0 ** -12), 0.0
        w[10, 1] = 0.0
    elif name == "wide":  # two loop steps of the GEMV
        x = torch.randint(1, 3, (1, LM_HEAD_BLOCK_K + 300), generator=gen).float()
        w = torch.randint(-4, 5, (N, LM_HEAD_BLOCK_K + 300), generator=gen).float()
    return x.to(dtype), w.to(dtype), vocab


CASES = ["random", "ties", "ties-in-one-program", "padding", "nan", "minus-inf", "zeros", "wide"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_launch_gives_the_gemvs_logits_and_their_argmax(dtype):
    """Launch after launch (the ticket and the best key back at 0 after each),
    each row stored at its own slot: the logits equal ``gemv``'s bit for bit
    (NaN included), the token is torch.argmax of them, and only the row's
    slot of ``last_tokens`` changes."""
    gen = torch.Generator().manual_seed(7)
    last = torch.full((9,), -3, dtype=torch.int64, device=DEVICE)
    expected_last = last.cpu().clone()
    for launch, name in enumerate(CASES):
        x, w, vocab = (t.to(DEVICE) if isinstance(t, torch.Tensor) else t
                       for t in _case(name, dtype, gen))
        slot = torch.tensor([(3 + 2 * launch) % 9], dtype=torch.int64, device=DEVICE)
        logits, tokens = gemv_argmax(x, w, vocab, slot, last)
        want_logits = gemv(x, w)[:, :vocab].cpu()
        assert logits.shape == (1, vocab) and logits.dtype == dtype
        assert torch.equal(logits.cpu().view(BITS[dtype]), want_logits.view(BITS[dtype])), name
        want = want_logits.argmax(dim=-1)
        assert tokens.dtype == torch.int64 and tokens.shape == (1,)
        assert torch.equal(tokens.cpu(), want), name
        expected_last[slot.item()] = want.item()
        assert torch.equal(last.cpu(), expected_last), name
        if name == "ties":
            assert want.item() == 5
        if name == "ties-in-one-program":
            assert want.item() == 13
        if name == "nan":
            assert want.item() == 11 and want_logits[0, 11].isnan()
        if name == "minus-inf":
            assert want.item() == 0
        if name == "padding":
            assert gemv(x, w)[0, vocab:].min() > want_logits.max()
        if name == "zeros" and dtype == torch.float16:  # the -0 / +0 tie is there
            assert want.item() == 3 and want_logits[0, 3].item() == 0.0
            assert torch.signbit(want_logits[0, 3]) and not torch.signbit(want_logits[0, 10])
    words = fused.WORDS.at_least(2, DEVICE)
    assert words[:2].tolist() == [0, 0]


def test_without_last_tokens_only_the_tokens_are_written():
    gen = torch.Generator().manual_seed(2)
    x, w, vocab = _case("ties", torch.float16, gen)
    logits, tokens = gemv_argmax(x.to(DEVICE), w.to(DEVICE), vocab)
    assert tokens.cpu().tolist() == [5] and logits.shape == (1, N)


def test_gemv_argmax_rejects_what_it_cannot_take():
    w = torch.zeros(16, 64)
    with pytest.raises(ValueError, match="gemv_argmax takes one row of width 64"):
        gemv_argmax(torch.zeros(2, 64), w, 16)
    with pytest.raises(ValueError, match="vocabulary of 1..16 rows, got 17"):
        gemv_argmax(torch.zeros(1, 64), w, 17)


def test_the_fused_launch_serves_one_half_precision_row_when_switched_on(monkeypatch):
    """With LM_HEAD_ARGMAX, where ``lm_head_matmul`` takes the one-row GEMV
    (one half precision row, its Triton kernels on) the fused launch serves
    ``lm_head_greedy``; elsewhere, and with it off, the LM head's product
    then ``greedy_argmax_triton``."""
    taken = []
    monkeypatch.setattr(fused, "gemv_argmax", lambda *args: taken.append("fused") or (None, None))
    monkeypatch.setattr(fused, "lm_head_matmul", lambda x, w: taken.append("matmul") or x)
    monkeypatch.setattr(fused, "greedy_argmax_triton", lambda *args: taken.append("argmax"))
    half, bf16 = torch.float16, torch.bfloat16
    for rows, dtype, on, triton_head, kinds in (
            (1, half, True, True, ["fused"]), (1, bf16, True, True, ["fused"]),
            (1, half, False, True, ["matmul", "argmax"]),
            (2, half, True, True, ["matmul", "argmax"]),
            (1, torch.float32, True, True, ["matmul", "argmax"]),
            (1, half, True, False, ["matmul", "argmax"])):
        monkeypatch.setattr(fused, "LM_HEAD_ARGMAX", on)
        monkeypatch.setattr(skinny, "LM_HEAD_TRITON", triton_head)
        lm_head_greedy(torch.zeros(rows, 64, dtype=dtype), torch.zeros(128, 64, dtype=dtype), 100)
        assert taken == kinds
        taken.clear()


@pytest.mark.parametrize("on", [False, True])
def test_the_device_op_is_its_reference(monkeypatch, on):
    """``lm_head_greedy`` (Triton, either way) against ``lm_head_greedy_ref``:
    the same logits (integer inputs: exact sums), tokens and slot writes."""
    monkeypatch.setattr(fused, "LM_HEAD_ARGMAX", on)
    gen = torch.Generator().manual_seed(11)
    x, w, vocab = _case("padding", torch.float16, gen)
    slots = torch.tensor([4])
    want_last = torch.zeros(6, dtype=torch.int64)
    want_logits, want = lm_head_greedy_ref(x, w, vocab, slots, want_last)
    assert torch.equal(want_logits, F.linear(x.float(), w.float())[:, :vocab].half())
    last = torch.zeros(6, dtype=torch.int64, device=DEVICE)
    logits, tokens = triton_ops(DEVICE).lm_head_greedy(x.to(DEVICE), w.to(DEVICE), vocab,
                                                       slots.to(DEVICE), last)
    assert torch.equal(logits.cpu(), want_logits)
    assert torch.equal(tokens.cpu(), want) and torch.equal(last.cpu(), want_last)


@pytest.mark.timeout(300)
def test_the_decode_graph_draws_the_same_tokens_with_the_fused_launch(tmp_path, monkeypatch):
    """The tiny model in float16 with its LM head on the Triton ops (the rest
    on the torch references), decoding one request through the emulated
    one-row decode graph, whose greedy argmax is drawn inside: the tokens
    with LM_HEAD_ARGMAX on are those with it off, and on, every decode
    step's LM head took the fused launch."""
    monkeypatch.setattr("runner.layers.vocab_parallel.device_ops", triton_ops)
    calls = []
    real = fused.gemv_argmax
    monkeypatch.setattr(fused, "gemv_argmax", lambda *args: calls.append(1) or real(*args))
    model_dir = ensure_tiny_model(str(tmp_path))
    tokens = {}
    for on in (False, True):
        monkeypatch.setattr(fused, "LM_HEAD_ARGMAX", on)
        runner = make_runner(model_dir, emulate_graphs=True, dtype="float16")
        tokens[on], _ = _run(runner, [list(range(3, 20))], steps=3)
        decode_step(runner, 4, ["r0"])
        t = runner.pending.tensors
        assert t.greedy is not None and torch.equal(t.greedy, t.logits.argmax(-1))
        tokens[on]["r0"] += runner.sample_tokens().get_output().rows()[0]
    assert len(calls) == 4
    assert tokens[True] == tokens[False] and len(tokens[True]["r0"]) == 5


# Compiles the kernel for a Hopper GPU (no GPU needed: only the compiler runs)
# and prints the PTX lines of the wait, the stores and the atomics.
COMPILE_CHILD = """
import json
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
import runner.layers.triton_gemv as g
import runner.layers.triton_lm_head_greedy as h

signature = {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "N": "i32", "K": "i32",
             "stride_w": "i32", "vocab_size": "i32", "words_ptr": "*i64", "tokens_ptr": "*i64",
             "slots_ptr": "*i64", "last_tokens_ptr": "*i64", "BLOCK_N": "constexpr",
             "BLOCK_K": "constexpr", "EARLY": "constexpr", "RECORD": "constexpr",
             "PDL": "constexpr"}
constants = {"BLOCK_N": g.LM_HEAD_BLOCK_N, "BLOCK_K": g.LM_HEAD_BLOCK_K, "EARLY": True,
             "RECORD": True, "PDL": True}
kernel = compile(ASTSource(fn=h._gemv_argmax_kernel, signature=signature, constexprs=constants),
                 target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
lines = kernel.asm["ptx"].splitlines()
print(json.dumps({what: [i for i, line in enumerate(lines) if what in line.split("//")[0]]
                  for what in ("griddepcontrol.wait", "st.global", "red.global", "atom.global")}))
"""


@pytest.mark.timeout(180)
def test_the_fused_kernel_touches_memory_only_after_the_wait():
    """As compiled for a Hopper GPU with programmatic dependent launch, in a
    child process (the interpreter off): every store and atomic (the
    logits, the best key's max, the ticket, the reset and the token) comes
    after the wait for the previous kernel, which may still be reading the
    words (runner/triton_dependent_launch.py)."""
    env = dict(os.environ, PYTHONPATH=pythonpath())
    env.pop("TRITON_INTERPRET", None)
    child = subprocess.run([sys.executable, "-c", COMPILE_CHILD], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=150)
    assert child.returncode == 0, child.stderr
    found = json.loads(child.stdout.splitlines()[-1])
    (wait,) = found["griddepcontrol.wait"]
    writes = found["st.global"] + found["red.global"] + found["atom.global"]
    assert found["red.global"] or found["atom.global"]
    assert len(found["atom.global"]) + len(found["red.global"]) >= 3  # max, ticket, reset
    assert writes and min(writes) > wait
