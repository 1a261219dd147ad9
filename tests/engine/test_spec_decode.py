"""Speculative decoding end to end on ``tiny``: every output is the output
without it (greedy, and seeded sampling: the rejection sampler emits the
target's own draw at each position), while drafts are proposed and
accepted; stop ids, max_tokens, logprobs, preemption, prefix caching,
aborts, sync and async scheduling, TP=1/2/3 and the decode-graph path.
Proposers: n-gram, and a draft model (``tiny`` drafting for itself, so
nearly every draft passes, a copy of it with fewer positions than
max_model_len, and a random model of tiny's vocabulary)."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from tests.helpers.multi_rank import tp_device

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
         "prompt_lookup_min": 1}
DRAFT = {"method": "draft_model", "model": "tiny", "num_speculative_tokens": 3}
SPECS = {"ngram": NGRAM, "draft_model": DRAFT}
# Repetitive (n-gram drafts pass) and not (they fail): tiny's byte tokenizer.
PROMPTS = ["abcabcabcabcabcabc", "the cat sat on the mat; the cat sat on the",
           "Quick zephyrs blow, vexing daft Jim", "1 2 3 4 5 6 7 8 9 10 11 12"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)


def _run(prompts, params, spec, **config):
    """(token ids per prompt, the scheduler's spec counters or None)."""
    with LLM(model="tiny", speculative_config=spec, **config) as llm:
        outs = llm.generate(prompts, params)
        stats = llm.engine.scheduler.spec_stats
    return [o.outputs[0].token_ids for o in outs], stats


def _assert_drafts_accepted(stats) -> None:
    assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens > 0
    assert stats.num_accepted_tokens < stats.num_draft_tokens  # some rejected too


@pytest.fixture(scope="module")
def plain_greedy():
    return _run(PROMPTS, GREEDY, None)[0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("async_scheduling", [True, False])
@pytest.mark.parametrize("method", list(SPECS))
def test_greedy_equals_plain_and_drafts_are_accepted(plain_greedy, async_scheduling, method):
    got, stats = _run(PROMPTS, GREEDY, SPECS[method], async_scheduling=async_scheduling)
    assert got == plain_greedy
    _assert_drafts_accepted(stats)
    assert sum(stats.num_accepted_tokens_per_pos) == stats.num_accepted_tokens
    assert stats.num_accepted_tokens_per_pos[0] >= stats.num_accepted_tokens_per_pos[-1]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("method", list(SPECS))
def test_seeded_sampling_equals_plain(method):
    params = [SamplingParams(temperature=t, top_k=k, top_p=p, seed=s, max_tokens=40,
                             ignore_eos=True, repetition_penalty=r)
              for t, k, p, s, r in [(0.7, 0, 1.0, 1, 1.0), (1.0, 20, 0.9, 2, 1.0),
                                    (0.3, 5, 1.0, 3, 1.3), (0.5, 0, 0.8, 4, 1.0)]]
    want, _ = _run(PROMPTS, params, None)
    got, stats = _run(PROMPTS, params, SPECS[method])
    assert got == want
    assert stats.num_accepted_tokens > 0


@pytest.mark.timeout(300)
def test_stop_ids_and_max_tokens_cut_an_accepted_run(plain_greedy):
    """A stop id or the length limit inside a run of accepted drafts ends the
    output there, exactly where the plain run ends it."""
    prompt, plain = PROMPTS[1], plain_greedy[1]
    stop = plain[2]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in
              (1, 2, 3, 5, 7, 11)]
    params.append(SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True,
                                 stop_token_ids=[stop]))
    got, stats = _run([prompt] * len(params), params, NGRAM)
    assert got[:-1] == [plain[:m] for m in (1, 2, 3, 5, 7, 11)]
    assert got[-1] == plain[: plain.index(stop) + 1]
    assert stats.num_accepted_tokens > 0


@pytest.mark.timeout(300)
def test_logprobs_of_every_emitted_token_equal_plain():
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=3)
    outs = {}
    for name, spec in (("plain", None), ("spec", NGRAM)):
        with LLM(model="tiny", speculative_config=spec) as llm:
            outs[name] = [o.outputs[0] for o in llm.generate(PROMPTS[:2], params)]
            if spec:
                assert llm.engine.scheduler.spec_stats.num_accepted_tokens > 0
    for plain, spec in zip(outs["plain"], outs["spec"]):
        assert spec.token_ids == plain.token_ids
        assert len(spec.logprobs) == len(spec.token_ids)
        for want, got, token in zip(plain.logprobs, spec.logprobs, spec.token_ids):
            assert set(got) == set(want) and token in got
            for t in want:
                assert got[t].logprob == pytest.approx(want[t].logprob, abs=1e-4)
                assert got[t].rank == want[t].rank


@pytest.mark.timeout(300)
@pytest.mark.parametrize("method", list(SPECS))
def test_preemption_with_drafts_in_flight_and_prefix_caching(method):
    """Few KV blocks: requests with drafts in flight are preempted and come
    back; equal prompts (n > 1) share cached blocks."""
    prompts = [PROMPTS[0], PROMPTS[0], PROMPTS[1], PROMPTS[1], PROMPTS[3], PROMPTS[2]]
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    config = dict(num_gpu_blocks_override=14, block_size=8, max_model_len=14 * 8)
    want, _ = _run(prompts, params, None, **config)
    with LLM(model="tiny", speculative_config=SPECS[method], **config) as llm:
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        scheduler = llm.engine.scheduler
        assert scheduler.num_preemptions > 0
        assert scheduler.kv.prefix_hits > 0
        assert scheduler.spec_stats.num_accepted_tokens > 0
    assert got == want


@pytest.mark.timeout(300)
@pytest.mark.parametrize("method", list(SPECS))
def test_requests_that_reach_max_model_len(method):
    """Outputs that run to ``max_model_len`` (32): the last steps have no
    room for drafts, yet the proposer still guesses past the end (the
    draft model at positions its rotary table does not hold); every output
    is the plain one, "length" at the context's end. The prompts' lengths
    differ, so one draft-model proposal holds rows past the end beside
    rows inside it (one request alone, with its draft counts worked by
    hand: test_a_draft_model_drafts_up_to_the_end_of_max_model_len)."""
    prompts = [PROMPTS[0], PROMPTS[1][:20], PROMPTS[3][:25]]
    params = SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)
    want, _ = _run(prompts, params, None, max_model_len=32)
    with LLM(model="tiny", speculative_config=SPECS[method], max_model_len=32) as llm:
        outs = llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outs] == want
    for out in outs:
        assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 32
        assert out.outputs[0].finish_reason == "length"


@pytest.mark.timeout(300)
def test_chunked_prefill_and_a_small_budget(plain_greedy):
    """A 16-token budget: prompts are chunked while others decode, and drafts
    are cut to what the budget leaves."""
    got, stats = _run(PROMPTS, GREEDY, NGRAM, max_num_batched_tokens=16)
    assert got == plain_greedy
    _assert_drafts_accepted(stats)


@pytest.mark.timeout(300)
def test_abort_with_drafts_in_flight(plain_greedy):
    engine = LLMEngine(EngineConfig(model="tiny", speculative_config=NGRAM))
    try:
        for i, prompt in enumerate(PROMPTS[:2]):
            engine.add_request(prompt, GREEDY, req_id=f"r{i}")
        tokens = {"r0": [], "r1": []}
        finished = {}
        steps = 0
        while engine.has_unfinished_requests():
            for delta in engine.step():
                tokens[delta.req_id] += delta.new_token_ids
                if delta.finished:
                    finished[delta.req_id] = delta.finish_reason
            steps += 1
            if steps == 4:
                aborted = engine.abort(["r0"])
                assert [d.finish_reason for d in aborted] == ["abort"]
                finished["r0"] = "abort"
        assert finished == {"r0": "abort", "r1": "length"}
        assert tokens["r1"] == plain_greedy[1]
        assert tokens["r0"] == plain_greedy[0][: len(tokens["r0"])]
        assert engine.scheduler.spec_stats.num_accepted_tokens > 0
        assert not engine.scheduler.kv.req_to_blocks  # every block returned
    finally:
        engine.shutdown()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("method", list(SPECS))
def test_uniform_decodes_take_the_graph_path(plain_greedy, monkeypatch, method):
    """The padded (1 + k)-token decode path that CUDA graphs replay, emulated
    on CPU, gives the same tokens; it ran."""
    import runner.model_runner as model_runner
    from runner.cuda_graphs import CudaGraphManager

    replays = []

    class Emulated(CudaGraphManager):
        def __init__(self, sizes):
            super().__init__([1, 2, 4, 8], emulate=True)

        def replay(self, size):
            replays.append(size)
            return super().replay(size)

    monkeypatch.setattr(model_runner, "CudaGraphManager", Emulated)
    got, stats = _run(PROMPTS, GREEDY, SPECS[method], executor="uni")
    assert got == plain_greedy
    assert replays and stats.num_accepted_tokens > 0


@pytest.mark.timeout(300)
def test_drafting_off_above_a_batch_size(monkeypatch):
    """disable_by_batch_size 2: while 2 or more requests run, one-token
    decodes (replaying the runner's one-token graphs, emulated); drafts once
    one is left. Outputs equal plain."""
    import runner.model_runner as model_runner
    from runner.cuda_graphs import CudaGraphManager

    replayed_rows = []

    class Emulated(CudaGraphManager):
        def __init__(self, sizes):
            super().__init__([1, 2, 4, 8], emulate=True)

        def replay(self, size):
            out = super().replay(size)
            replayed_rows.append(out.logits.shape[0] // size)  # tokens a row
            return out

    monkeypatch.setattr(model_runner, "CudaGraphManager", Emulated)
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (8, 48)]
    prompts = PROMPTS[:2]
    want, _ = _run(prompts, params, None)
    got, stats = _run(prompts, params, dict(NGRAM, disable_by_batch_size=2), executor="uni")
    assert got == want
    assert stats.num_accepted_tokens > 0
    assert 1 in replayed_rows and 4 in replayed_rows


@pytest.mark.timeout(300)
def test_a_different_draft_model_of_the_same_vocabulary(plain_greedy, tmp_path):
    """A random Llama with tiny's vocabulary drafts: its guesses are mostly
    wrong, the output is still the target's."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    got, stats = _run(PROMPTS, GREEDY, dict(DRAFT, model=str(tmp_path)))
    assert got == plain_greedy
    assert stats.num_draft_tokens > 0


def tiny_with_positions(path, positions: int) -> str:
    """A copy of tiny's model directory whose config gives ``positions``
    max_position_embeddings: tiny's weights, so as a draft for tiny every
    greedy draft is the target's own argmax and passes."""
    import shutil

    from checkpoint.resolve import resolve_model_dir

    shutil.copytree(resolve_model_dir("tiny"), path)
    config_path = path / "config.json"
    config = json.loads(config_path.read_text())
    config["max_position_embeddings"] = positions
    config_path.write_text(json.dumps(config))
    return str(path)


def _counts(stats) -> tuple:
    return (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens,
            list(stats.num_accepted_tokens_per_pos))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("max_model_len, length, async_scheduling", [
    (128, 128, False), (-1, 640, True)])  # auto: the cache's 40 blocks of 16
def test_a_draft_of_fewer_positions_drafts_below_them_then_decodes_on(
        tmp_path, caplog, max_model_len, length, async_scheduling):
    """As vLLM: a draft model of 64 positions for tiny (4096) bounds where
    requests draft, not the length they get (given, or "auto"). Worked by
    hand, k = 3, every draft accepted (tiny's weights): a prompt of 42
    tokens has T = 43 known after its prefill; a step verifies d = min(3,
    64 - T) drafts (all below position 64) and emits d + 1: T = 43, 47, 51,
    55, 59 with 3 drafts, T = 63 with 1, then none: 6 rows, 16 drafts, by
    position [6, 5, 5]; it runs on to 102 tokens. A prompt of 70 tokens
    never drafts. Both outputs are the plain greedy ones."""
    caplog.set_level(logging.INFO, logger="engine.llm_engine")
    draft = tiny_with_positions(tmp_path / "draft", 64)
    runs = [({"prompt_token_ids": list(range(40, 82))}, 60),
            ({"prompt_token_ids": [7 + 3 * i for i in range(70)]}, 20)]

    def outputs(llm, stats_after_each=None):
        got = []
        for prompt, max_tokens in runs:
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
            got.append(llm.generate([prompt], params)[0].outputs[0].token_ids)
            if stats_after_each is not None:
                stats_after_each.append(_counts(llm.engine.scheduler.spec_stats))
        return got

    with LLM(model="tiny") as llm:
        want = outputs(llm)
    stats = []
    with LLM(model="tiny", max_model_len=max_model_len, num_gpu_blocks_override=40,
             async_scheduling=async_scheduling,
             speculative_config=dict(DRAFT, model=draft)) as llm:
        config = llm.engine.scheduler.config
        assert llm.engine.max_model_len == config.max_model_len == length
        assert config.draft_max_model_len == 64
        got = outputs(llm, stats)
    assert got == want
    assert [len(tokens) for tokens in got] == [60, 20]
    assert stats == [(6, 16, 16, [6, 5, 5])] * 2  # the second request made none
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("draft model")]
    assert said == [f"draft model {draft} has 64 positions (max_position_embeddings), fewer "
                    f"than max_model_len {length}: a request drafts while its tokens and drafts "
                    "stay within 64, then decodes without drafts"]


@pytest.mark.timeout(300)
def test_a_draft_model_drafts_up_to_the_end_of_max_model_len():
    """tiny drafting for itself with max_model_len 64: a prompt of 40 and
    24 tokens out end at 64, the last steps proposing past the rotary
    tables' last row (63), which the proposer must not look up. By hand,
    every draft accepted: T = 41 .. 57 step 4 with 3 drafts, T = 61 with
    2 (max_tokens and max_model_len leave 2): 6 rows, 17 drafts, [6, 6, 5]."""
    prompt = {"prompt_token_ids": list(range(40, 80))}
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    want, _ = _run([prompt], params, None)
    got, stats = _run([prompt], params, DRAFT, max_model_len=64)
    assert got == want and len(got[0]) == 24
    assert _counts(stats) == (6, 17, 17, [6, 6, 5])


@pytest.mark.timeout(120)
def test_a_draft_model_of_another_vocabulary_is_refused(tmp_path):
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="vocabulary of 100 tokens, the target 320"):
        LLM(model="tiny", speculative_config=dict(DRAFT, model=str(tmp_path)))


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("method", list(SPECS))
def test_greedy_equals_plain_at_tp2(plain_greedy, method):
    device = tp_device(2)
    got, stats = _run(PROMPTS, GREEDY, SPECS[method], tensor_parallel_size=2, device=device)
    if device == EngineConfig(model="tiny").resolved_device:  # where plain_greedy ran
        assert got == plain_greedy
    else:
        assert got == _run(PROMPTS, GREEDY, None, device=device)[0]
    _assert_drafts_accepted(stats)


TP3_PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], list(range(40, 77)), [9, 3, 9, 3, 9, 3, 9]]


@pytest.fixture(scope="module")
def llama_6_heads(tmp_path_factory):
    """A random Llama whose 6 query and 3 KV heads split over 3 ranks, and
    transformers' greedy continuations of TP3_PROMPTS."""
    import transformers

    from tests.helpers.hf_models import save_with_greedy_reference

    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=96, intermediate_size=192, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=3, tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=127, max_position_embeddings=256)
    torch.manual_seed(4)
    model = transformers.LlamaForCausalLM(config)
    path = tmp_path_factory.mktemp("llama6h")
    return str(path), save_with_greedy_reference(model, path, TP3_PROMPTS, 40)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("tp", [1, 3])
def test_greedy_equals_transformers_at_tp3(llama_6_heads, tp):
    path, expected = llama_6_heads
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    with LLM(model=path, tensor_parallel_size=tp, device=tp_device(tp), speculative_config=NGRAM,
             max_num_seqs=4, kv_cache_memory_bytes=16 << 20) as llm:
        got = [o.outputs[0].token_ids for o in llm.generate(
            [{"prompt_token_ids": p} for p in TP3_PROMPTS], params)]
        stats = llm.engine.scheduler.spec_stats
    assert got == expected
    _assert_drafts_accepted(stats)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("async_scheduling", [True, False])
def test_constrained_requests_beside_drafting_ones(plain_greedy, async_scheduling):
    """One engine, n-gram drafts on: JSON- and regex-constrained requests
    (drafting under their grammar, tests/engine/test_spec_structured_outputs.py)
    beside greedy ones that draft. The greedy outputs are the plain ones, drafts are
    accepted for them, and the constrained outputs are valid and equal to the
    same requests run without speculative decoding."""
    from tests.engine.test_structured_outputs import (
        assert_regex,
        assert_valid_json,
        json_params,
        regex_params,
    )

    constrained = [json_params(s) for s in range(3)] + [regex_params(s) for s in range(2)]
    prompts = PROMPTS + ["Write a record:"] * len(constrained)
    params = [GREEDY] * len(PROMPTS) + constrained

    def run(spec):
        with LLM(model="tiny", speculative_config=spec,
                 async_scheduling=async_scheduling) as llm:
            outs = llm.generate(prompts, params)
            return outs, llm.engine.scheduler.spec_stats

    outs, stats = run(NGRAM)
    assert [o.outputs[0].token_ids for o in outs[:len(PROMPTS)]] == plain_greedy
    _assert_drafts_accepted(stats)
    assert assert_valid_json(outs[len(PROMPTS):len(PROMPTS) + 3]) >= 1
    assert_regex(outs[len(PROMPTS) + 3:])
    plain, _ = run(None)
    assert ([o.outputs[0].token_ids for o in outs[len(PROMPTS):]]
            == [o.outputs[0].token_ids for o in plain[len(PROMPTS):]])
