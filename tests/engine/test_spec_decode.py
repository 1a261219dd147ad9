"""Speculative decoding end to end on ``tiny``: every output is the output
without it (greedy, and seeded sampling: the rejection sampler emits the
target's own draw at each position), while drafts are proposed and
accepted; stop ids, max_tokens, logprobs, preemption, prefix caching,
aborts, sync and async scheduling, TP=1/2/3 and the decode-graph path.
Proposers: n-gram, and a draft model (``tiny`` drafting for itself, so
nearly every draft passes, and a random model of tiny's vocabulary)."""

from __future__ import annotations

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


@pytest.mark.timeout(300)
def test_max_model_len_auto_stops_at_the_draft_models_positions(tmp_path):
    """A random Llama of 64 positions drafts for tiny (4096) with
    max_model_len "auto" and a cache of 640 tokens: the decided length is
    the draft's 64, as vLLM bounds a draft's length by its own. A request
    that fits is the target's own greedy output, drafted; a longer one is
    refused."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    prompt = {"prompt_token_ids": list(range(40, 80))}
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)  # 40 + 24 = 64
    want, _ = _run([prompt], params, None)
    with LLM(model="tiny", max_model_len=-1, num_gpu_blocks_override=40,
             speculative_config=dict(DRAFT, model=str(tmp_path))) as llm:
        assert llm.engine.max_model_len == 64
        got = [o.outputs[0].token_ids for o in llm.generate([prompt], params)]
        assert llm.engine.scheduler.spec_stats.num_draft_tokens > 0
        with pytest.raises(ValueError, match=r"prompt \(64 tokens\) .* exceeds max_model_len 64"):
            llm.generate([{"prompt_token_ids": list(range(1, 65))}], params)
    assert got == want


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
    (which never draft: their drafts would escape the grammar's mask) beside
    greedy ones that draft. The greedy outputs are the plain ones, drafts are
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
