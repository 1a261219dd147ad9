"""The scheduler with speculative decoding, against a fake runner that
verifies drafts (tests/helpers/fake_spec_runner.py): with sync and async
scheduling, chunked prefill, prefix caching and preemption, every output is
the plain reference loop's, the host counts stay upper bounds of the
runner's (at most k above), and a stop or the length limit inside an
accepted run cuts it there."""

from __future__ import annotations

import pytest

from engine.outputs import Logprob
from engine.prompt_logprobs import entries_per_position
from engine.reasoning import ReasoningTokens
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.thinking_budget import ThinkingBudget
from ipc.messages import Logprobs, ModelRunnerOutput, PromptLogprobs
from tests.engine.test_async_scheduling import drive_async
from tests.helpers.fake_runner import PROMPTS, config, drive, expected, make_requests
from tests.helpers.fake_spec_runner import FakeSpecRunner


class AsyncFakeSpecRunner(FakeSpecRunner):
    """Runs ahead of the scheduler: a preempted request's unabsorbed tokens
    (up to 1 + k of a step) are discarded by the scheduler."""

    def execute(self, out):
        for new in out.scheduled_new_reqs:
            history = self.history.get(new.req_id)
            if history is not None:
                assert new.prefill_token_ids == history[: len(new.prefill_token_ids)]
                self.history[new.req_id] = list(new.prefill_token_ids)
        return super().execute(out)


def _run(cfg, requests, asynchronous: bool):
    sched = Scheduler(cfg)
    for r in requests:
        sched.add_request(r)
    k = cfg.num_speculative_tokens
    if asynchronous:
        runner = AsyncFakeSpecRunner(cfg, k)
        results = drive_async(sched, runner)[0]
    else:
        runner = FakeSpecRunner(cfg, k)
        results = drive(sched, runner)[0]
    return results, sched, runner


CASES = {
    "plain": dict(),
    "chunked": dict(max_num_batched_tokens=7),
    "prefix": dict(enable_prefix_caching=True),
    "preempt": dict(num_blocks=12, max_model_len=40, enable_prefix_caching=True),
    # A draft model of 16 positions: the fake runner checks every draft is below them.
    "draft_limit": dict(draft_max_model_len=16),
}


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("k", [1, 3])
def test_outputs_equal_the_reference(case, asynchronous, k):
    cfg = config(num_speculative_tokens=k, **CASES[case])
    params = [SamplingParams(max_tokens=m, stop_token_ids=s) for m, s in
              [(20, ()), (7, ()), (30, (11,)), (13, (3, 4)), (25, ()), (9, ())]]
    make = lambda: [Request(f"r{i}", p, params[i], arrival_time=float(i))  # noqa: E731
                    for i, p in enumerate(PROMPTS)]
    results, sched, runner = _run(cfg, make(), asynchronous)
    assert results == expected(make(), cfg)
    assert runner.num_accepted > 0 and runner.num_drafts > runner.num_accepted
    assert runner.max_drafts_in_row == k
    # Async: a step after a request's end runs but its output is discarded.
    same = (lambda a, b: a <= b) if asynchronous else (lambda a, b: a == b)
    assert same(sched.spec_stats.num_draft_tokens, runner.num_drafts)
    assert same(sched.spec_stats.num_accepted_tokens, runner.num_accepted)
    assert sched.spec_stats.num_accepted_tokens > 0
    if case == "preempt":
        assert sched.num_preemptions > 0


def _counts(step) -> dict[str, int]:
    return dict(zip(step.scheduled_req_ids(), step.num_scheduled_tokens))


def _decode_step(sched, req_id="a"):
    """Prefill the request (one step), then schedule its first decode."""
    prefill = sched.schedule()
    out = ModelRunnerOutput(step_id=prefill.step_id, sampled_token_ids=[7])
    sched.update_from_output(prefill, out)
    return sched.schedule()


@pytest.mark.parametrize("params, emitted, want, reason", [
    (SamplingParams(max_tokens=20, stop_token_ids=[9]), [8, 9, 10, 11], [8, 9], "stop"),
    (SamplingParams(max_tokens=3), [8, 9, 10, 11], [8, 9], "length"),
    (SamplingParams(max_tokens=20), [8, 5, 10, 11], [8, 5], "stop"),  # eos 5
    (SamplingParams(max_tokens=20, ignore_eos=True), [8, 5, 10, 11], [8, 5, 10, 11], None),
])
def test_a_stop_inside_an_accepted_run_cuts_it(params, emitted, want, reason):
    cfg = config(num_speculative_tokens=3)
    sched = Scheduler(cfg)
    sched.add_request(Request("a", [1, 2, 3], params, eos_token_id=5))
    step = _decode_step(sched)
    drafts = min(3, params.max_tokens - 2)
    assert _counts(step) == {"a": 1 + drafts}
    n = min(len(emitted), 1 + drafts)
    out = ModelRunnerOutput(step_id=step.step_id, sampled_token_ids=emitted[:n],
                            num_sampled=[n])
    (delta,) = sched.update_from_output(step, out)
    assert delta.new_token_ids == want[:n]
    assert delta.finish_reason == reason
    if reason is not None:
        assert "a" not in sched.requests and sched.kv.pool.num_free_blocks == cfg.num_blocks


def test_rejected_drafts_are_given_back():
    """1 + 3 scheduled, 1 accepted: computed counts 2 of the 4 positions and
    the placeholders of the step are gone."""
    sched = Scheduler(config(num_speculative_tokens=3))
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=20)))
    step = _decode_step(sched)
    req = sched.requests["a"]
    assert _counts(step) == {"a": 4}
    assert req.num_computed_tokens == 7 and req.num_output_placeholders == 4
    out = ModelRunnerOutput(step_id=step.step_id, sampled_token_ids=[8, 9], num_sampled=[2])
    sched.update_from_output(step, out)
    assert req.num_tokens == 6 and req.num_output_placeholders == 0
    assert req.num_computed_tokens == 5  # tokens 0..4 in the cache; 9 is fed next
    assert sched.spec_stats.num_accepted_tokens_per_pos == [1, 0, 0]


class _FreeGrammar:
    """A grammar that accepts every token (what the scheduler calls)."""

    def accept(self, token):
        return True

    def is_terminated(self):
        return False

    def rollback_to(self, num_tokens):
        pass


def test_grammar_requests_draft_and_keep_the_drafts_their_output_reports():
    """A request with a grammar drafts; the drafts its step's output
    reports for its next step are kept on it, the step's drafts are what
    ``step_drafts`` says, and a preemption forgets them. With a thinking
    budget too it drafts alike."""
    sched = Scheduler(config(num_speculative_tokens=3))
    request = Request("a", [1, 2, 3], SamplingParams(max_tokens=20))
    request.grammar = _FreeGrammar()
    sched.add_request(request)
    prefill = sched.schedule()
    sched.expect_drafts(prefill.step_id, ["a"])  # as the step's bitmask asks
    sched.update_from_output(prefill, ModelRunnerOutput(
        step_id=prefill.step_id, sampled_token_ids=[7],
        next_draft_token_ids={"a": [4, 5, 6]}))
    assert request.next_drafts == [4, 5, 6]
    step = sched.schedule()
    assert _counts(step) == {"a": 4} and sched.step_drafts(step.step_id) == {"a": 3}
    assert step.structured_output_req_ids == ["a"]
    sched._preempt(request)
    assert request.next_drafts == []

    sched = Scheduler(config(num_speculative_tokens=3))
    request = Request("b", [1, 2, 3], SamplingParams(max_tokens=20))
    request.grammar = _FreeGrammar()
    request.thinking_budget = ThinkingBudget(5, ReasoningTokens(8, 9), [1, 2, 3])
    sched.add_request(request)
    assert _counts(_decode_step(sched, "b")) == {"b": 4}


def _grammar_prefill(asked: list[str], prompt_logprobs: int | None = None):
    """Requests "a" and "b" with grammars, k = 3, a vocabulary of 100: the
    scheduler, its first step, and the requests; the step's bitmask asked
    for the drafts of ``asked``; each asks for ``prompt_logprobs``."""
    sched = Scheduler(config(num_speculative_tokens=3, vocab_size=100))
    params = SamplingParams(max_tokens=20, prompt_logprobs=prompt_logprobs)
    requests = [Request(r, [1, 2, 3], params,
                        prompt_logprob_width=entries_per_position(prompt_logprobs, 100))
                for r in ("a", "b")]
    for request in requests:
        request.grammar = _FreeGrammar()
        sched.add_request(request)
    prefill = sched.schedule()
    if asked:
        sched.expect_drafts(prefill.step_id, asked)
    return sched, prefill, requests


def test_the_drafts_asked_for_are_kept_whole():
    """k ids each, 0 .. vocab_size - 1, for exactly the requests asked."""
    sched, prefill, (a, b) = _grammar_prefill(["a", "b"])
    sched.update_from_output(prefill, ModelRunnerOutput(
        step_id=prefill.step_id, sampled_token_ids=[7, 8],
        next_draft_token_ids={"b": [0, 99, 5], "a": [4, 5, 6]}))
    assert (a.output_token_ids, a.next_drafts) == ([7], [4, 5, 6])
    assert (b.output_token_ids, b.next_drafts) == ([8], [0, 99, 5])


@pytest.mark.parametrize("asked, drafts, message", [
    (["a", "b"], {"a": [4, 5, 6]}, r"step 0 lacks the drafts of \['b'\], which its bitmask "
                                   r"asked for"),
    (["a", "b"], {"a": [4, 5, 6], "b": [4, 5, 6], "c": [1, 2, 3]},
     r"step 0 reports drafts for \['c'\], which its bitmask did not ask for"),
    ([], {"a": [4, 5, 6]}, r"reports drafts for \['a'\], which its bitmask did not ask for"),
    (["a", "b"], {"a": [4, 5, 6, 7], "b": [4, 5, 6]}, "reports 4 drafts for 'a', not 3"),
    (["a", "b"], {"a": [4, 5, 6], "b": [4, 5]}, "reports 2 drafts for 'b', not 3"),
    (["a", "b"], {"a": [4, 5, 100], "b": [4, 5, 6]},
     "reports the draft 100 for 'a', no token id of the vocabulary of 100"),
    (["a", "b"], {"a": [4, 5, 6], "b": [-1, 5, 6]}, "the draft -1 for 'b'"),
    (["a", "b"], {"a": [4, 5.0, 6], "b": [4, 5, 6]}, "the draft 5.0 for 'a'"),
    (["a", "b"], {"a": [4, True, 6], "b": [4, 5, 6]}, "the draft True for 'a'"),
    (["a", "b"], {"a": [4, "5", 6], "b": [4, 5, 6]}, "the draft '5' for 'a'"),
])
def test_drafts_that_break_the_contract_fail_the_step_naming_the_fault(asked, drafts,
                                                                        message):
    """A reply whose drafts are not those its bitmask asked for (other
    requests, not k of them, an id outside the vocabulary or no int) is
    refused as a reply of the wrong step is: a ValueError naming it, and
    no request takes a token or a draft of it."""
    sched, prefill, requests = _grammar_prefill(asked)
    with pytest.raises(ValueError, match=message):
        sched.update_from_output(prefill, ModelRunnerOutput(
            step_id=prefill.step_id, sampled_token_ids=[7, 8], next_draft_token_ids=drafts))
    assert all(r.output_token_ids == [] and r.next_drafts == [] for r in requests)


def _scored_prompts() -> PromptLogprobs:
    """Prompt logprobs of "a" and "b" (prompts [1, 2, 3]; one top entry):
    each scores its prompt tokens 1 and 2, the top entry token 9."""
    return PromptLogprobs(req_ids=["a", "b"], starts=[1, 1], counts=[2, 2],
                          logprobs=Logprobs(top_token_ids=[[9]] * 4,
                                            top_logprobs=[[-0.5]] * 4,
                                            sampled_logprobs=[-1.0, -2.0, -3.0, -4.0],
                                            sampled_ranks=[2, 3, 4, 5]))


@pytest.mark.parametrize("tamper", ["drafts", "rows"])
def test_a_reply_that_breaks_the_contract_records_no_prompt_logprobs(tamper):
    """Its prompt logprobs are refused with the rest of it: no request
    holds them (a valid reply with the same ones records them, worked by
    hand: None for the first prompt token, then the token's own logprob
    and rank beside the top entry)."""
    sched, prefill, (a, b) = _grammar_prefill(["a", "b"], prompt_logprobs=1)
    drafts = {"a": [4, 5, 6], "b": [4, 5, 6]}
    broken = {"drafts": dict(sampled_token_ids=[7, 8], next_draft_token_ids={"a": [4, 5, 6]}),
              "rows": dict(sampled_token_ids=[7], next_draft_token_ids=drafts)}[tamper]
    with pytest.raises(ValueError, match="lacks the drafts" if tamper == "drafts" else "1 rows"):
        sched.update_from_output(prefill, ModelRunnerOutput(
            step_id=prefill.step_id, prompt_logprobs=_scored_prompts(), **broken))
    assert a.prompt_logprobs is None and b.prompt_logprobs is None

    sched, prefill, (a, b) = _grammar_prefill(["a", "b"], prompt_logprobs=1)
    sched.update_from_output(prefill, ModelRunnerOutput(
        step_id=prefill.step_id, sampled_token_ids=[7, 8], next_draft_token_ids=drafts,
        prompt_logprobs=_scored_prompts()))
    assert a.prompt_logprobs == [None, {9: Logprob(-0.5, 1), 2: Logprob(-1.0, 2)},
                                 {9: Logprob(-0.5, 1), 3: Logprob(-2.0, 3)}]
    assert b.prompt_logprobs[2] == {9: Logprob(-0.5, 1), 3: Logprob(-4.0, 5)}


def test_drafts_stop_short_of_max_model_len():
    sched = Scheduler(config(num_speculative_tokens=3, max_model_len=7))
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=20)))
    # 4 tokens known (prompt + one output): positions 3.. fed; at most 7 tokens.
    assert _counts(_decode_step(sched)) == {"a": 3}


def test_drafts_stop_short_of_the_draft_models_positions():
    """k = 3, a draft model of 9 positions, max_model_len 64. With T tokens
    known, a step feeds the last at T - 1 and d drafts at T .. T + d - 1,
    each below 9: d = min(3, 9 - T). Prompt of 3 + one output: T = 4, d = 3;
    all accepted: T = 8, d = 1; accepted: T = 10, d = 0, and it decodes on
    one token a step. Asynchronously, a step in flight counts as accepted:
    T = 4 + 4 = 8 before its output, so the next step gets d = 1."""
    sched = Scheduler(config(num_speculative_tokens=3, draft_max_model_len=9))
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=20)))
    step = _decode_step(sched)
    assert _counts(step) == {"a": 4}
    assert _counts(sched.schedule()) == {"a": 2}  # async: scheduled before step's output
    sched = Scheduler(config(num_speculative_tokens=3, draft_max_model_len=9))
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=20)))
    step = _decode_step(sched)
    counts = []
    for emitted in ([8, 9, 10, 11], [12, 13], [14], [15]):
        counts.append(_counts(step)["a"])
        out = ModelRunnerOutput(step_id=step.step_id, sampled_token_ids=emitted,
                                num_sampled=[len(emitted)])
        sched.update_from_output(step, out)
        step = sched.schedule()
    assert counts == [4, 2, 1, 1]
    assert sched.requests["a"].num_tokens == 12
    assert (sched.spec_stats.num_drafts, sched.spec_stats.num_draft_tokens) == (2, 4)


def test_no_drafts_without_speculative_decoding():
    requests = make_requests(PROMPTS[:2], SamplingParams(max_tokens=5))
    sched = Scheduler(config())
    for r in requests:
        sched.add_request(r)
    step = sched.schedule()
    sched.update_from_output(step, ModelRunnerOutput(step_id=step.step_id,
                                                     sampled_token_ids=[1, 1]))
    assert set(sched.schedule().num_scheduled_tokens) == {1}


def test_no_drafts_while_the_batch_is_large():
    cfg = config(num_speculative_tokens=3, spec_disable_by_batch_size=2)
    sched = Scheduler(cfg)
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=20)))
    sched.add_request(Request("b", [4, 5, 6], SamplingParams(max_tokens=1)))
    step = sched.schedule()
    sched.update_from_output(step, ModelRunnerOutput(step_id=step.step_id,
                                                     sampled_token_ids=[7, 8]))
    # b finished at max_tokens 1: a runs alone and drafts.
    assert _counts(sched.schedule()) == {"a": 4}
    sched2 = Scheduler(cfg)
    for name in ("a", "b"):
        sched2.add_request(Request(name, [1, 2, 3], SamplingParams(max_tokens=20)))
    step = sched2.schedule()
    sched2.update_from_output(step, ModelRunnerOutput(step_id=step.step_id,
                                                      sampled_token_ids=[7, 8]))
    assert _counts(sched2.schedule()) == {"a": 1, "b": 1}
