"""Structured outputs with speculative decoding, end to end on ``tiny``.

A request with a grammar takes n-gram drafts: the runner reports its
drafts for the next step with each step's tokens, the engine fills one
bitmask row per position the step verifies (row i after the drafts
1..i), and the rejection sampler verifies each draft against the masked
target. The reference is the same engine without speculative decoding:
greedy and seeded outputs, token ids and logprobs, are the same token for
token, under a regex and a JSON schema, with async scheduling on and off,
while drafts are proposed and accepted. The prompts repeat, so the model's
constrained output repeats too and the n-gram drafts copied from it pass;
the grammars refuse some of the tokens the prompt's runs suggest, so some
drafts are refused, and each refused draft is rejected (checked on the
messages the engine sends and the outputs it receives), also through
preemptions, aborts of requests with drafted steps in flight, the batch
crossing ``disable_by_batch_size``, and at TP=2."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.structured_outputs.params import StructuredOutputsParams
from executor.base import WorkerFailure
from tests.helpers.multi_rank import tp_device

pytestmark = pytest.mark.timeout(600)

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
         "prompt_lookup_min": 1}
RUNS = "abcabcabcabcabcabc"
ENUMS = {"type": "array", "items": {"type": "string", "enum": ["abc", "ab", "ca"]},
         "minItems": 10, "maxItems": 10}
CASES = [
    (RUNS, StructuredOutputsParams(regex="[a-c]{40}")),
    (RUNS, StructuredOutputsParams(regex="[ab]{40}")),  # refuses the runs' c
    (RUNS, StructuredOutputsParams(regex="(abc|ab|ca){15}")),
    ('["abc", "abc", "ab", "abc"', StructuredOutputsParams(json=ENUMS,
                                                           disable_any_whitespace=True)),
]
SAMPLINGS = [{"temperature": 0}, {"temperature": 0.8, "seed": 7}]


def _params() -> tuple[list[str], list[SamplingParams]]:
    prompts, params = [], []
    for prompt, so in CASES:
        for extra in SAMPLINGS:
            prompts.append(prompt)
            params.append(SamplingParams(max_tokens=60, logprobs=2, structured_outputs=so,
                                         **extra))
    return prompts, params


def _generate(spec, **config):
    """(outputs, the scheduler) of every case in one batch."""
    prompts, params = _params()
    with LLM(model="tiny", dtype="float32", speculative_config=spec, **config) as llm:
        outs = [o.outputs[0] for o in llm.generate(prompts, params)]
        return outs, llm.engine.scheduler


def _assert_same(got, want, tol: float) -> None:
    for (prompt, so, extra), a, b in zip(
            [(p, s, e) for p, s in CASES for e in SAMPLINGS], want, got):
        assert b.token_ids == a.token_ids, (prompt[:6], so, extra)
        assert b.finish_reason == a.finish_reason == "stop", (prompt[:6], so, extra)
        assert len(b.logprobs) == len(a.logprobs) == len(a.token_ids)
        for x, y in zip(a.logprobs, b.logprobs):
            assert set(y) == set(x)
            for t in x:
                assert y[t].logprob == pytest.approx(x[t].logprob, abs=tol)
                assert y[t].rank == x[t].rank


@pytest.fixture(scope="module")
def plain():
    return _generate(None)[0]


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_outputs_and_logprobs_equal_the_ones_without_drafts(plain, async_scheduling):
    got, scheduler = _generate(NGRAM, async_scheduling=async_scheduling)
    _assert_same(got, plain, 1e-4)
    stats = scheduler.spec_stats
    assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens > 0
    assert stats.num_accepted_tokens < stats.num_draft_tokens


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_through_preemptions_with_drafts_in_flight(plain, async_scheduling):
    """A cache of 7 blocks for 8 requests: requests are preempted (their
    drafts and in-flight tokens dropped) and come back; outputs are still
    the ones without drafts, without preemption."""
    got, scheduler = _generate(NGRAM, async_scheduling=async_scheduling,
                               num_gpu_blocks_override=7, max_model_len=112)
    _assert_same(got, plain, 1e-4)
    assert scheduler.num_preemptions > 0 and scheduler.spec_stats.num_accepted_tokens > 0


def _allowed(message, vocab: int) -> list[np.ndarray]:
    """Each bitmask row of ``message`` as a bool vector over the vocabulary."""
    words = (vocab + 31) // 32
    rows = np.frombuffer(message.bitmask, dtype="<i4").reshape(-1, words)
    bits = (rows[:, :, None].astype(np.int64) >> np.arange(32)) & 1
    return [r for r in bits.reshape(len(rows), -1)[:, :vocab].astype(bool)]


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_a_draft_the_grammar_refuses_is_rejected(async_scheduling):
    """Recorded where the engine sends and receives: for each request with
    a grammar and d drafts in a step, its bitmask has 1 + d rows; where
    draft i is not allowed by row i - 1 (the grammar after drafts before
    it), the step emits at most i tokens for it (the draft rejected), and
    every emitted token is allowed by its row. Such drafts occur."""
    prompts, params = _params()
    with LLM(model="tiny", dtype="float32", speculative_config=NGRAM,
             async_scheduling=async_scheduling) as llm:
        engine = llm.engine
        vocab = engine.model_config.vocab_size
        messages, drafts_used, outputs = {}, {}, {}
        sample, start = engine.executor.sample_tokens, engine.structured_outputs.start_bitmask
        absorb = engine.scheduler.update_from_output

        def record_message(message):
            messages[message.step_id] = message
            return sample(message)

        def record_drafts(plan, requests, *args, **kwargs):
            drafts_used[plan.step_id] = {r: list(q.next_drafts) for r, q in requests.items()}
            return start(plan, requests, *args, **kwargs)

        def record_output(plan, output):
            outputs[plan.step_id] = dict(zip(plan.scheduled_req_ids(), output.rows()))
            return absorb(plan, output)

        engine.executor.sample_tokens = record_message
        engine.structured_outputs.start_bitmask = record_drafts
        engine.scheduler.update_from_output = record_output
        llm.generate(prompts, params)
    refused = verified = 0
    for step_id, message in messages.items():
        rows = _allowed(message, vocab)
        counts = message.num_rows or [1] * len(message.req_ids)
        starts = np.concatenate([[0], np.cumsum(counts)])
        for req_id, first, n in zip(message.req_ids, starts, counts):
            emitted = outputs[step_id][req_id]
            assert len(emitted) <= n
            for i, token in enumerate(emitted):
                assert rows[first + i][token], (step_id, req_id, i)
            if req_id not in drafts_used[step_id]:
                continue  # finished before the fill: its rows allow every token
            drafts = drafts_used[step_id][req_id][:n - 1]
            for i, draft in enumerate(drafts, start=1):
                verified += 1
                if not rows[first + i - 1][draft]:
                    refused += 1
                    assert len(emitted) <= i, (step_id, req_id, drafts, emitted)
                    break
    assert refused > 0 and verified > refused


def _out_of_vocabulary(drafts: dict, vocab: int) -> dict:
    return {r: [vocab] + d[1:] for r, d in drafts.items()}


def _one_left_out(drafts: dict, vocab: int) -> dict:
    return dict(list(drafts.items())[1:])


def _one_too_many(drafts: dict, vocab: int) -> dict:
    return {r: d + d[:1] for r, d in drafts.items()}


@pytest.mark.parametrize("tamper, message", [
    (_out_of_vocabulary, "no token id of the vocabulary of"),
    (_one_left_out, "lacks the drafts of"),
    (_one_too_many, "reports 4 drafts for"),
])
def test_a_reply_whose_drafts_break_the_contract_fails_the_engine(tamper, message):
    """The first step output that carries drafts, as the worker sent it but
    for its drafts (changed by hand), reaches the scheduler where every
    output does: the engine fails with the fault named, and no grammar sees
    the drafts (no step's bitmask is filled over them)."""
    prompts, params = _params()
    with LLM(model="tiny", dtype="float32", speculative_config=NGRAM,
             async_scheduling=False) as llm:
        engine = llm.engine
        vocab = engine.model_config.vocab_size
        absorb, start = engine.scheduler.update_from_output, engine.structured_outputs.start_bitmask
        tampered, filled_after = [], []

        def tamper_output(plan, output):
            if output.next_draft_token_ids and not tampered:
                drafts = tamper(output.next_draft_token_ids, vocab)
                output = msgspec.structs.replace(output, next_draft_token_ids=drafts)
                tampered.append(plan.step_id)
            return absorb(plan, output)

        def record_fill(plan, *args, **kwargs):
            if tampered:
                filled_after.append(plan.step_id)
            return start(plan, *args, **kwargs)

        engine.scheduler.update_from_output = tamper_output
        engine.structured_outputs.start_bitmask = record_fill
        with pytest.raises(ValueError, match=message):
            llm.generate(prompts, params)
    assert tampered and filled_after == []


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_after_a_reply_that_breaks_the_contract_every_step_fails(async_scheduling):
    """As after a worker's failure: the next call fails at once with a
    WorkerFailure naming the reply, and sends the workers nothing."""
    prompts, params = _params()
    with LLM(model="tiny", dtype="float32", speculative_config=NGRAM,
             async_scheduling=async_scheduling) as llm:
        engine = llm.engine
        absorb = engine.scheduler.update_from_output

        def drop_drafts(plan, output):
            if output.next_draft_token_ids:
                output = msgspec.structs.replace(output, next_draft_token_ids={})
            return absorb(plan, output)

        engine.scheduler.update_from_output = drop_drafts
        with pytest.raises(ValueError, match="lacks the drafts of"):
            llm.generate(prompts, params)
        engine.scheduler.update_from_output = absorb
        sent = []
        execute, sample = engine.executor.execute_model, engine.executor.sample_tokens
        engine.executor.execute_model = lambda plan: sent.append(plan) or execute(plan)
        engine.executor.sample_tokens = lambda mask: sent.append(mask) or sample(mask)
        for _ in range(2):
            with pytest.raises(WorkerFailure, match=r"reply to step \d+: runner output of step "
                                                    r"\d+ lacks the drafts of"):
                llm.generate(prompts[:2], params[:2])
        with pytest.raises(WorkerFailure, match="lacks the drafts of"):
            engine.check_health()
        assert sent == []


@pytest.mark.slow
def test_at_tp2_outputs_and_logprobs_equal_the_ones_without_drafts(plain):
    """Two ranks: the output rank reports the drafts every rank proposed
    alike, and the ranks mask and verify alike."""
    device = tp_device(2)
    got, scheduler = _generate(NGRAM, tensor_parallel_size=2, device=device)
    want = plain if device == EngineConfig(model="tiny").resolved_device else _generate(
        None, tensor_parallel_size=2, device=device)[0]
    _assert_same(got, want, 1e-4 if device == "cpu" else 1e-3)
    assert scheduler.spec_stats.num_accepted_tokens > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("async_scheduling", [True, False])
def test_on_cuda_outputs_and_logprobs_equal_the_ones_without_drafts(async_scheduling):
    want, _ = _generate(None, device="cuda", async_scheduling=async_scheduling)
    got, scheduler = _generate(NGRAM, device="cuda", async_scheduling=async_scheduling)
    _assert_same(got, want, 1e-3)
    assert scheduler.spec_stats.num_accepted_tokens > 0


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_requests_arriving_and_aborted_mid_flight(plain, async_scheduling):
    """Through the engine's own loop: the cases arrive two a step, three
    are aborted while their drafted steps are in flight, and the running
    count crosses ``disable_by_batch_size`` both ways (steps of the same
    requests with and without drafts). Every request left ends as it does
    without drafts, token for token with its logprobs; the aborted ones
    end "abort" with a prefix of that output."""
    prompts, params = _params()
    aborted_at = {1: 3, 4: 4, 6: 6}  # case -> step
    with LLM(model="tiny", dtype="float32", speculative_config={**NGRAM, "disable_by_batch_size": 4},
             async_scheduling=async_scheduling) as llm:
        engine = llm.engine
        scheduler = engine.scheduler
        schedule, drafted = scheduler.schedule, []

        def record():  # (requests running when drafts were decided, any drafted)
            running = len(scheduler.running)
            plan = schedule()
            drafted.append((running, bool(scheduler.step_drafts(plan.step_id))))
            return plan

        scheduler.schedule = record
        tokens = {i: [] for i in range(len(prompts))}
        logprobs = {i: [] for i in range(len(prompts))}
        reasons = {}
        step = 0
        while step < 4 or engine.has_unfinished_requests():
            for i in range(2 * step, min(2 * step + 2, len(prompts))):
                engine.add_request(prompts[i], params[i], str(i))
            for i, at in aborted_at.items():
                if at == step:
                    for delta in engine.abort([str(i)]):
                        reasons[int(delta.req_id)] = delta.finish_reason
            for delta in engine.step():
                i = int(delta.req_id)
                tokens[i] += delta.new_token_ids
                logprobs[i] += delta.logprobs
                if delta.finished:
                    reasons[i] = delta.finish_reason
            step += 1
            assert step < 500
    for i, want in enumerate(plain):
        if i in aborted_at:
            assert reasons[i] == "abort" and tokens[i] == want.token_ids[:len(tokens[i])], i
            continue
        assert (tokens[i], reasons[i]) == (want.token_ids, want.finish_reason), i
        for token, a, b in zip(tokens[i], want.logprobs, logprobs[i]):
            assert b[token].logprob == pytest.approx(a[token].logprob, abs=1e-4)
    assert any(n >= 4 and not d for n, d in drafted) and any(d for _, d in drafted)
    assert any(len(tokens[i]) < len(plain[i].token_ids) for i in aborted_at)
