"""TP=2 against TP=1 on the same checkpoint, logits compared directly.

A fixed batch (two prompts prefilled in one step, then decode steps fed
fixed tokens, so every size sees the same inputs) runs through the paged
model on each rank (tests/helpers/multi_rank.py: gloo on the CPU, NCCL on GPUs,
where TP=2 runs with the custom all-reduce over peer buffers, as the runner
builds its group, and without). Checks: the ranks' logits are equal bit for
bit (each rank samples from its own logits, so ranks that differ by one
rounding diverge); in float32 TP=2's logits are within 1e-3 of TP=1's,
relative to the largest logit; in bfloat16 TP=2's error against the float32
TP=1 logits is no larger than 1.25x TP=1 bfloat16's own (a lost term or a
reduction rounded too early shows as a larger error; another order of the
same sums does not).
"""

from __future__ import annotations

import pytest
import torch
import transformers  # the oracle: a test dependency, never skipped

from runner.attention.metadata import AttentionMetadata
from tests.helpers.multi_rank import RankInfo, assert_ranks_bitwise_equal, run_on_ranks

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
PROMPT_LENS = (37, 21)
DECODE_STEPS = 3
BLOCK_SIZE = 16
SMALL = dict(vocab_size=199, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)
# Wide enough that bfloat16 rounding is a real error, small enough to build quickly.
WIDE = dict(vocab_size=8000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
            num_attention_heads=16, num_key_value_heads=8)


def save_checkpoint(path, shape: dict, seed: int = 5) -> str:
    """A random float32 Llama with logits of std about 2 (tests/helpers/model_parity.py)."""
    from tests.helpers.model_parity import randomize

    config = transformers.LlamaConfig(**shape, max_position_embeddings=256, rms_norm_eps=1e-5,
                                      tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).float().eval()
    randomize(model, seed)
    model.save_pretrained(path)
    return str(path)


def _metadata(chunks: list[tuple[int, int, int]], device: torch.device) -> AttentionMetadata:
    """One step over (request, start, end) rows; request r owns the blocks
    [r * per_req, (r + 1) * per_req)."""
    per_req = -(-(max(PROMPT_LENS) + DECODE_STEPS) // BLOCK_SIZE)
    lens = [end - start for _, start, end in chunks]
    qsl = torch.tensor([0, *lens]).cumsum(0).to(torch.int32)
    seq_lens = torch.tensor([end for _, _, end in chunks], dtype=torch.int32)
    slots = [(r * per_req + p // BLOCK_SIZE) * BLOCK_SIZE + p % BLOCK_SIZE
             for r, start, end in chunks for p in range(start, end)]
    table = torch.tensor([[r * per_req + b for b in range(per_req)] for r, _, _ in chunks],
                         dtype=torch.int32)
    return AttentionMetadata(
        num_reqs=len(chunks), num_tokens=len(slots),
        num_decodes=len(chunks) if max(lens) == 1 else 0, max_query_len=max(lens),
        max_seq_len=int(seq_lens.max()), query_start_loc=qsl.to(device),
        seq_lens=seq_lens.to(device), block_tables=table.to(device),
        slot_mapping=torch.tensor(slots, device=device), query_start_loc_cpu=qsl,
        seq_lens_cpu=seq_lens)


@torch.inference_mode()
def scenario_logits(rank: RankInfo, model_dir: str, dtypes: list[str],
                    custom_all_reduce: bool = False) -> dict[str, torch.Tensor]:
    """Rank function: for each dtype, float32 logits of every position of the
    fixed batch, the model loaded in that dtype. ``custom_all_reduce``: the
    group carries peer buffers, as the runner's does (CUDA only; elsewhere
    the group is unchanged)."""
    tp = rank.tp.with_peer_buffers(rank.device) if custom_all_reduce else rank.tp
    return {dtype: _logits(rank, tp, model_dir, dtype) for dtype in dtypes}


def _logits(rank: RankInfo, tp, model_dir: str, dtype: str) -> torch.Tensor:
    from tests.helpers.checkpoints import build_model_from_dir

    model = build_model_from_dir(model_dir, DTYPES[dtype], rank.device, tp)
    gen = torch.Generator().manual_seed(11)
    seqs = [torch.randint(0, model.config.vocab_size, (n + DECODE_STEPS,), generator=gen)
            for n in PROMPT_LENS]
    num_blocks = len(PROMPT_LENS) * -(-(max(PROMPT_LENS) + DECODE_STEPS) // BLOCK_SIZE)
    caches = [torch.zeros(model.kv_cache_shape(num_blocks, BLOCK_SIZE), dtype=DTYPES[dtype],
                          device=rank.device) for _ in range(model.config.num_hidden_layers)]
    steps = [[(r, 0, n) for r, n in enumerate(PROMPT_LENS)]]
    steps += [[(r, n + i, n + i + 1) for r, n in enumerate(PROMPT_LENS)]
              for i in range(DECODE_STEPS)]
    logits = []
    for chunks in steps:
        attn = _metadata(chunks, rank.device)
        ids = torch.cat([seqs[r][s:e] for r, s, e in chunks]).to(torch.int32)
        pos = torch.cat([torch.arange(s, e) for _, s, e in chunks])
        hidden = model(ids.to(rank.device), pos.to(rank.device), caches, attn)
        logits.append(model.compute_logits(hidden).float().cpu())
    return torch.cat(logits)


def relative_error(got: torch.Tensor, reference: torch.Tensor) -> float:
    """Largest absolute difference over the largest absolute reference logit."""
    return float((got - reference).abs().max() / reference.abs().max())


def rms_error(got: torch.Tensor, reference: torch.Tensor) -> float:
    return float((got - reference).pow(2).mean().sqrt())


def run_sizes(model_dir: str, backend: str, timeout_s: float = 180.0,
              custom_all_reduce: bool = False) -> dict:
    """{size: {dtype: rank 0's logits}} at TP=1 and TP=2; asserts that the
    ranks of each size agree bit for bit."""
    out = {}
    for size in (1, 2):
        kwargs = {"model_dir": model_dir, "dtypes": list(DTYPES),
                  "custom_all_reduce": custom_all_reduce}
        results = run_on_ranks(scenario_logits, size, kwargs, backend=backend,
                               timeout_s=timeout_s)
        assert_ranks_bitwise_equal(results)
        out[size] = results[0]
    return out


def check_float32(logits: dict) -> None:
    tp1, tp2 = logits[1]["float32"], logits[2]["float32"]
    assert relative_error(tp2, tp1) < 1e-3, relative_error(tp2, tp1)
    # The ranks split the work: TP=2 sums in another order than TP=1.
    assert not torch.equal(tp2, tp1)


def check_bfloat16(logits: dict) -> None:
    reference = logits[1]["float32"]
    tp1_error, tp2_error = (rms_error(logits[n]["bfloat16"], reference) for n in (1, 2))
    assert 0 < tp2_error <= 1.25 * tp1_error, (tp1_error, tp2_error)


# ---- CPU (gloo) ---------------------------------------------------------
@pytest.fixture(scope="module")
def gloo_logits(tmp_path_factory) -> dict:
    model_dir = save_checkpoint(tmp_path_factory.mktemp("tp_small"), SMALL)
    return run_sizes(model_dir, "gloo")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tp2_float32_logits_match_tp1_gloo(gloo_logits):
    assert gloo_logits[1]["float32"].shape == (sum(PROMPT_LENS) + 2 * DECODE_STEPS,
                                               SMALL["vocab_size"])
    check_float32(gloo_logits)


@pytest.mark.timeout(300)
def test_tp2_bfloat16_error_no_larger_than_tp1_gloo(gloo_logits):
    check_bfloat16(gloo_logits)


# ---- CUDA (NCCL) --------------------------------------------------------
needs_two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")


@pytest.fixture(scope="module")
def wide_checkpoint(tmp_path_factory) -> str:
    return save_checkpoint(tmp_path_factory.mktemp("tp_wide"), WIDE)


@pytest.fixture(scope="module", params=[True, False], ids=["custom_all_reduce", "nccl_only"])
def nccl_logits(request, wide_checkpoint) -> dict:
    return run_sizes(wide_checkpoint, "nccl", timeout_s=300, custom_all_reduce=request.param)


@pytest.mark.gpu
@needs_two_gpus
@pytest.mark.timeout(600)
def test_tp2_float32_logits_match_tp1_cuda(nccl_logits):
    check_float32(nccl_logits)


@pytest.mark.gpu
@needs_two_gpus
@pytest.mark.timeout(600)
def test_tp2_bfloat16_error_no_larger_than_tp1_cuda(nccl_logits):
    check_bfloat16(nccl_logits)
