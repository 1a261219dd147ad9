"""vLLM's ``thinking_token_budget``, hand-worked on ``tiny`` with
``<think>``/``</think>`` (``tests.helpers.think_model``), whose greedy
output never writes ``</think>`` by itself (its LM-head row is zero).

The reference is the same engine's greedy output without a budget: with
budget N the output is its first N tokens (the reasoning), then
``</think>`` forced, then the answer goes on; a prompt that already
holds k reasoning tokens after its ``<think>`` leaves N - k; budget 0
forces ``</think>`` first; an output after a prompt that opened no
thinking section (one that closed it) has none to spend and is the free
output. With n-gram drafts (on a copy whose repeating runs hold the tags)
every output is the one without drafts, while drafts are accepted, also
in one batch beside requests with a grammar, a logit_bias or allowed ids,
and through preemptions. The
counting itself (``ThinkingBudget``) is checked on made-up ids. Without a reasoning
parser, and for a negative budget, the request is refused naming the
field."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.reasoning import ReasoningTokens
from engine.structured_outputs.params import StructuredOutputsParams
from engine.thinking_budget import ThinkingBudget
from ipc.errors import InvalidRequestError
from tests.helpers.prompt_logprobs import hf_prompt_logprobs
from tests.helpers.think_model import (
    END_THINK,
    THINK,
    tiny_with_think_tokens,
    tiny_writing_think_tokens,
)

pytestmark = pytest.mark.timeout(300)

OPEN = [256, 72, 105, THINK]  # ends inside an open thinking
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def think_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("think")
    return tiny_with_think_tokens(str(root / "cache"), str(root / "model"))


def _greedy(llm: LLM, prompt: list[int], budget: int | None = None) -> list[int]:
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, thinking_token_budget=budget)
    return llm.generate({"prompt_token_ids": prompt}, params)[0].outputs[0].token_ids


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                         reason="needs CUDA"))])
@pytest.mark.parametrize("async_scheduling", [True, False])
@pytest.mark.parametrize("parser", ["deepseek_r1", "qwen3"])
def test_the_budget_cuts_the_reasoning_at_n_tokens(think_dir, async_scheduling, parser, device):
    with LLM(model=think_dir, device=device, executor="uni", max_model_len=256,
             reasoning_parser=parser, async_scheduling=async_scheduling) as llm:
        free = _greedy(llm, OPEN)
        assert END_THINK not in free and len(free) == MAX_TOKENS
        for n in (0, 1, 3, 5):
            out = _greedy(llm, OPEN, n)
            assert out[:n] == free[:n], n
            assert out[n] == END_THINK and out.count(END_THINK) == 1, (n, out)
            assert len(out) == MAX_TOKENS
        # Two reasoning tokens already in the prompt leave three of five.
        prompt = OPEN + free[:2]
        ahead = _greedy(llm, prompt)
        out = _greedy(llm, prompt, 5)
        assert out[:3] == ahead[:3] and out[3] == END_THINK
        # A prompt that closed the thinking leaves nothing to spend.
        closed = OPEN + [10, END_THINK, 10]
        assert _greedy(llm, closed, 0) == _greedy(llm, closed)
        # -1 is vLLM's "no limit".
        assert _greedy(llm, OPEN, -1) == free


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_the_forced_end_wins_over_the_requests_own_token_limits(think_dir, async_scheduling):
    """vLLM forces the end of the reasoning after ``allowed_token_ids``,
    ``bad_words``, ``min_tokens`` and ``logit_bias`` have set the logits (its budget
    runs after them and sets the end tag's logit), so the end tag comes at
    the budget even where the request's own limits leave it out; the
    limits hold for every other token."""
    with LLM(model=think_dir, device="cpu", executor="uni", max_model_len=256,
             reasoning_parser="deepseek_r1", async_scheduling=async_scheduling) as llm:
        free = _greedy(llm, OPEN)
        allowed = sorted(set(free))
        assert END_THINK not in allowed
        assert llm.get_tokenizer().encode("</think>", add_special_tokens=False) == [END_THINK]
        limits = [{"allowed_token_ids": allowed}, {"bad_words": ["</think>"]},
                  {"min_tokens": MAX_TOKENS, "stop_token_ids": [END_THINK]},
                  {"logit_bias": {END_THINK: -100.0}}]
        for extra in limits:
            for n in (0, 3):
                params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                        thinking_token_budget=n, **extra)
                out = llm.generate({"prompt_token_ids": OPEN},
                                   params)[0].outputs[0].token_ids
                assert out[:n] == free[:n] and out[n] == END_THINK, (extra, n, out)
                assert out.count(END_THINK) == 1 and len(out) == MAX_TOKENS, (extra, n, out)
                if "allowed_token_ids" in extra:
                    assert set(out) - {END_THINK} <= set(allowed), (n, out)


def test_the_budget_holds_with_drafts(think_dir):
    """With speculative decoding (ngram) the forced token comes where it
    does without drafts."""
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2,
            "prompt_lookup_min": 1}
    with LLM(model=think_dir, device="cpu", executor="uni", max_model_len=256,
             reasoning_parser="deepseek_r1", speculative_config=spec) as llm:
        free = _greedy(llm, OPEN)
        out = _greedy(llm, OPEN, 4)
        assert out[:4] == free[:4] and out[4] == END_THINK
        # The forced end wins over allowed_token_ids through the rejection
        # sampler too.
        limited = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, thinking_token_budget=4,
                                 allowed_token_ids=sorted(set(free)))
        out = llm.generate({"prompt_token_ids": OPEN}, limited)[0].outputs[0].token_ids
        assert out[:4] == free[:4] and out[4] == END_THINK


# ``tiny`` writes 147 and 107 in turn after RUNS, and 29 and 160 in turn
# after ENDS; with 147 written as <think> and 160 as </think>
# (``tiny_writing_think_tokens``), its repeating runs hold the tags, and so
# do the n-gram drafts copied from them.
START_AS, END_AS = 147, 160
RUNS = [256, *b"abcabcabcabcabcabc"]
ENDS = [256, *b"the cat sat on the mat; the cat sat on the", THINK]
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
         "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def writing_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("writing")
    return tiny_writing_think_tokens(str(root / "cache"), str(root / "model"), START_AS, END_AS)


def _forced_positions(prompt: list[int], out: list[int], budget: int) -> list[int]:
    """Where ``ThinkingBudget`` (the host's count) forces the end tag in ``out``."""
    state = ThinkingBudget(budget, ReasoningTokens(THINK, END_THINK), prompt)
    forced = []
    for i, token in enumerate(out):
        if state.forced_token() is not None:
            forced.append(i)
        state.accept(token)
    return forced


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                         reason="needs CUDA"))])
@pytest.mark.parametrize("async_scheduling", [True, False])
def test_budgeted_requests_take_drafts_and_their_output_is_the_one_without(
        writing_dir, device, async_scheduling):
    """A budgeted request takes n-gram drafts, and its drafts are accepted,
    while its output is token for token the one without speculative
    decoding (greedy, and seeded sampling: the rejection sampler emits the
    target's own draw, forced where the budget forces it): drafts that
    open sections (<think> in RUNS' runs), that close them (</think> in
    ENDS' runs), and steps whose rows cross the budget (the forced
    </think> lands inside a run of drafts). Every position the host's
    count forces holds </think>."""
    config = dict(model=writing_dir, device=device, dtype="float32", executor="uni",
                  max_model_len=256, reasoning_parser="deepseek_r1",
                  async_scheduling=async_scheduling)
    cases = [(prompt, budget, extra) for prompt in (RUNS, ENDS)
             for budget in (None, 0, 1, 2, 3, 5)
             for extra in ({"temperature": 0}, {"temperature": 0.8, "seed": 7})]

    def params(budget, extra):
        return SamplingParams(max_tokens=40, ignore_eos=True, thinking_token_budget=budget,
                              **extra)

    with LLM(**config) as llm:
        plain = [llm.generate({"prompt_token_ids": p}, params(b, e))[0].outputs[0].token_ids
                 for p, b, e in cases]
    accepted_sampled = 0
    with LLM(speculative_config=NGRAM, **config) as llm:
        stats = llm.engine.scheduler.spec_stats
        for (prompt, budget, extra), want in zip(cases, plain):
            drafted, accepted = stats.num_draft_tokens, stats.num_accepted_tokens
            out = llm.generate({"prompt_token_ids": prompt},
                               params(budget, extra))[0].outputs[0].token_ids
            assert out == want, (prompt[:4], budget, extra)
            assert stats.num_draft_tokens > drafted, (prompt[:4], budget, extra)
            if extra["temperature"] == 0:
                assert stats.num_accepted_tokens > accepted, (prompt[:4], budget)
            else:
                accepted_sampled += stats.num_accepted_tokens - accepted
            if budget is not None:
                forced = _forced_positions(prompt, out, budget)
                assert forced and all(out[i] == END_THINK for i in forced), (budget, out)
    assert accepted_sampled > 0
    free = dict(((tuple(p), b, e["temperature"]), o) for (p, b, e), o in zip(cases, plain))
    runs, ends = free[tuple(RUNS), None, 0], free[tuple(ENDS), None, 0]
    assert runs.count(THINK) >= 6 and ends.count(END_THINK) >= 6  # the runs hold the tags
    # The budget changes both outputs: forced ends cut RUNS' runs of <think>
    # 107 (budget 1) and come before ENDS' own (budget 0).
    assert free[tuple(RUNS), 1, 0] != runs and free[tuple(ENDS), 0, 0] != ends


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_a_budget_with_a_grammar_takes_drafts_and_its_output_is_the_one_without(
        writing_dir, async_scheduling):
    """A request with a budget and a regex (held after its reasoning) takes
    drafts, whose bitmask rows are the grammar's over the drafts but free
    where the budget forces: its output and logprobs (greedy and seeded)
    are the ones without speculative decoding, drafts are accepted, and
    every position the host's count forces holds </think>."""
    config = dict(model=writing_dir, device="cpu", dtype="float32", executor="uni",
                  max_model_len=256, reasoning_parser="deepseek_r1",
                  async_scheduling=async_scheduling)
    regex = StructuredOutputsParams(regex="[a-c]{20}")
    cases = [(prompt, budget, extra) for prompt in (RUNS, ENDS) for budget in (0, 2, 5)
             for extra in ({"temperature": 0}, {"temperature": 0.8, "seed": 7})]

    def params(budget, extra):
        return SamplingParams(max_tokens=40, logprobs=1, thinking_token_budget=budget,
                              structured_outputs=regex, **extra)

    with LLM(**config) as llm:
        plain = [llm.generate({"prompt_token_ids": p}, params(b, e))[0].outputs[0]
                 for p, b, e in cases]
    with LLM(speculative_config=NGRAM, **config) as llm:
        stats = llm.engine.scheduler.spec_stats
        for (prompt, budget, extra), want in zip(cases, plain):
            drafted, accepted = stats.num_draft_tokens, stats.num_accepted_tokens
            got = llm.generate({"prompt_token_ids": prompt},
                               params(budget, extra))[0].outputs[0]
            assert got.token_ids == want.token_ids, (prompt[:4], budget, extra)
            for token, a, b in zip(got.token_ids, want.logprobs, got.logprobs):
                assert b[token].logprob == pytest.approx(a[token].logprob, abs=1e-4)
            assert stats.num_accepted_tokens > accepted, (prompt[:4], budget, extra)
            assert stats.num_draft_tokens > drafted
            forced = _forced_positions(prompt, got.token_ids, budget)
            assert all(got.token_ids[i] == END_THINK for i in forced)
    assert any(_forced_positions(p, o.token_ids, b) for (p, b, _), o in zip(cases, plain))


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_a_budgeted_row_sends_its_forced_id_or_its_state_never_both(writing_dir,
                                                                   async_scheduling):
    """The bitmask messages the engine sends (recorded at the executor),
    beside the plans they answer: a budgeted request with drafts in the
    step sends its budget's state, which equals the host's count replayed
    over the tokens before the step, and forced id -1; one without drafts
    sends no state, and its forced id where its budget forces (</think>);
    both kinds occur. (The tokens before the step are those the engine
    knows when it fills the bitmask, recorded there.)"""
    config = dict(model=writing_dir, device="cpu", dtype="float32", executor="uni",
                  max_model_len=256, reasoning_parser="deepseek_r1",
                  async_scheduling=async_scheduling, speculative_config=NGRAM)
    budgets = (0, 1, 2, 3, 5)
    prompts = [RUNS, ENDS]
    with LLM(**config) as llm:
        executor, manager = llm.engine.executor, llm.engine.structured_outputs
        plans, messages, known = {}, [], {}
        execute, sample, start = (executor.execute_model, executor.sample_tokens,
                                  manager.start_bitmask)

        def record_known(plan, requests, *args, **kwargs):
            known[plan.step_id] = {r: len(q.output_token_ids) for r, q in requests.items()}
            return start(plan, requests, *args, **kwargs)

        def record_plan(plan):
            plans[plan.step_id] = plan
            return execute(plan)

        def record_message(message):
            messages.append(message)
            return sample(message)

        executor.execute_model, executor.sample_tokens = record_plan, record_message
        manager.start_bitmask = record_known
        cases = [(p, b) for p in prompts for b in budgets]
        outs = llm.generate([{"prompt_token_ids": p} for p, _ in cases],
                            [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True,
                                            thinking_token_budget=b) for _, b in cases])
        ids = {o.request_id: (p, b, o.outputs[0].token_ids) for o, (p, b) in zip(outs, cases)}
    seen_state = seen_forced = 0
    for message in messages:
        plan = plans[message.step_id]
        cached = plan.scheduled_cached_reqs.req_ids
        counts = dict(zip(plan.scheduled_req_ids(), plan.num_scheduled_tokens))
        forced = message.forced_token_ids or [-1] * len(message.req_ids)
        states = message.thinking_states or [[]] * len(message.req_ids)
        for req_id, forced_id, state in zip(message.req_ids, forced, states):
            prompt, budget, out = ids[req_id]
            drafted = req_id in cached and counts[req_id] > 1
            if drafted:
                assert forced_id == -1 and state, (message.step_id, req_id)
                # The state after every token before the step's first (all
                # known when its bitmask is filled).
                host = ThinkingBudget(budget, ReasoningTokens(THINK, END_THINK), prompt)
                for token in out[:known[message.step_id][req_id]]:
                    host.accept(token)
                assert state == host.state(), (message.step_id, req_id)
                seen_state += 1
            else:
                assert state == [] and forced_id in (-1, END_THINK), (message.step_id, req_id)
                seen_forced += forced_id == END_THINK
    assert seen_state > 0 and seen_forced > 0


def _mixed_batch() -> list[tuple[list[int], SamplingParams]]:
    """Budgeted requests (sections opened by the prompt, by the output, or
    closed by the prompt; budgets 0 to 8) beside requests without a budget,
    with a grammar (alone and with a budget), a logit_bias, allowed ids
    and logprobs."""
    closed = [*ENDS, 10, END_THINK]
    regex = StructuredOutputsParams(regex="[a-c]{3,12}")
    cases = []
    for i, prompt in enumerate([RUNS, [*RUNS, THINK], ENDS, closed, [*ENDS, 10, 10]]):
        for budget in (i % 3, 3 + i, 8 - i):
            cases.append((prompt, dict(thinking_token_budget=budget, logprobs=1)))
        cases.append((prompt, {}))
    cases += [(ENDS, dict(structured_outputs=regex)),
              (RUNS, dict(structured_outputs=regex, thinking_token_budget=2)),
              (ENDS, dict(logit_bias={THINK: 4.0}, thinking_token_budget=1)),
              (RUNS, dict(allowed_token_ids=[97, 98, 99, THINK, END_THINK],
                          thinking_token_budget=2)),
              (RUNS, dict(logit_bias={97: 2.0}))]
    return [(prompt, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, **extra))
            for prompt, extra in cases]


@pytest.mark.parametrize("async_scheduling", [True, False])
@pytest.mark.parametrize("num_blocks", [None, 7])
def test_a_mixed_batch_with_drafts_is_the_one_without(writing_dir, async_scheduling,
                                                      num_blocks):
    """Budgeted requests drafted in one batch beside others (a grammar, a
    grammar with a budget, logit_bias, allowed ids), through preemptions
    when the cache is small: each output, and the logprob at each of its
    tokens, is the one without speculative decoding (greedy); every
    position the host's count forces holds </think>, reported with the
    model's own logprob."""
    config = dict(model=writing_dir, device="cpu", dtype="float32", executor="uni",
                  reasoning_parser="deepseek_r1", async_scheduling=async_scheduling,
                  max_num_seqs=8, max_model_len=256)
    if num_blocks:
        config.update(num_gpu_blocks_override=num_blocks, max_model_len=16 * num_blocks)
    cases = _mixed_batch()
    prompts = [{"prompt_token_ids": p} for p, _ in cases]
    params = [s for _, s in cases]
    with LLM(**config) as llm:
        plain = [o.outputs[0] for o in llm.generate(prompts, params)]
    with LLM(speculative_config=NGRAM, **config) as llm:
        drafted = [o.outputs[0] for o in llm.generate(prompts, params)]
        stats, scheduler = llm.engine.scheduler.spec_stats, llm.engine.scheduler
        assert stats.num_accepted_tokens > 0
        assert (scheduler.num_preemptions > 0) == bool(num_blocks)
    num_forced = 0
    for (prompt, p), want, got in zip(cases, plain, drafted):
        assert got.token_ids == want.token_ids, (prompt[:4], p)
        if not p.logprobs:
            continue
        for token, a, b in zip(got.token_ids, want.logprobs, got.logprobs):
            assert b[token].logprob == pytest.approx(a[token].logprob, abs=1e-4)
        forced = _forced_positions(prompt, got.token_ids, p.thinking_token_budget)
        assert all(got.token_ids[i] == END_THINK for i in forced)
        assert all(got.logprobs[i][END_THINK].logprob < -1e-3 for i in forced)
        num_forced += len(forced)
    assert num_forced >= 10


def test_without_a_reasoning_parser_or_with_a_negative_budget_it_is_refused(think_dir):
    with LLM(model=think_dir, device="cpu", executor="uni", max_model_len=256) as llm:
        with pytest.raises(InvalidRequestError, match="reasoning parser") as refused:
            _greedy(llm, OPEN, 4)
        assert refused.value.param == "thinking_token_budget"
    for bad in (-2, 1.5, "4", True):
        with pytest.raises(InvalidRequestError, match="thinking_token_budget must be") as bad_:
            SamplingParams(thinking_token_budget=bad)
        assert bad_.value.param == "thinking_token_budget"


S, E = 7, 8  # made-up tag ids


@pytest.mark.parametrize("prompt, outputs, spent, forced", [
    ([1, S], [2, 3], 2, None),  # budget 3: one more is free
    ([1, S], [2, 3, 4], 3, E),  # spent: the end tag next
    ([1, S, 2, 3], [4], 3, E),  # the prompt's reasoning counts
    ([1, S, 2, E, S, 3], [], 1, None),  # closed, opened again: after the last start tag
    ([1, 2], [3, 4, 5, 6], 0, None),  # no section opened: nothing counts, nothing forced
    ([1, 2], [3, S, 4, 5, 6], 3, E),  # the output opens one itself
    ([1, S], [2, S, 3], 1, None),  # a start tag opens a new section, from 0; tags not counted
    ([1, S], [2, E, 3, 4, 5], 0, None),  # ended by itself: nothing more is forced
    ([1, S], [2, E, 3, S, 4, 5, 6], 3, E),  # a later section has the whole budget again
])
def test_what_is_spent(prompt, outputs, spent, forced):
    budget = ThinkingBudget(3, ReasoningTokens(S, E), prompt)
    for token in outputs:
        budget.accept(token)
    assert (budget.spent, budget.forced_token()) == (spent, forced)
    assert budget.may_force(3 - spent) is budget.open


def test_may_force_counts_a_section_the_tokens_in_flight_may_open():
    budget = ThinkingBudget(2, ReasoningTokens(S, E), [1, 2])  # no section open
    assert not budget.may_force(2) and budget.may_force(3)  # S, then two in it
    budget = ThinkingBudget(0, ReasoningTokens(S, E), [1, 2])
    assert budget.forced_token() is None and not budget.may_force(0) and budget.may_force(1)
    budget.accept(S)
    assert budget.forced_token() == E


def test_budget_zero_forces_at_once_and_may_force_counts_tokens_in_flight():
    budget = ThinkingBudget(0, ReasoningTokens(S, E), [1, S])
    assert budget.forced_token() == E
    budget = ThinkingBudget(2, ReasoningTokens(S, E), [1, S])
    assert not budget.may_force(1) and budget.may_force(2)
    budget.accept(E)
    assert not budget.may_force(2) and budget.forced_token() is None  # S, then one: 1 < 2


@pytest.fixture(scope="module")
def think_hf(think_dir):
    import transformers

    return transformers.LlamaForCausalLM.from_pretrained(think_dir, torch_dtype=torch.float32)


SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2,
        "prompt_lookup_min": 1}


# The plain sampler (greedy with logprobs alone, with an own mask, sampled
# at a temperature) and the rejection sampler (drafting on); on CUDA the
# Triton draw and logprobs kernels, in float32 within the CUDA tests' tolerance.
@pytest.mark.parametrize("device, tol", [
    ("cpu", 1e-4), pytest.param("cuda", 1e-3, marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs CUDA"))])
@pytest.mark.parametrize("engine, extra", [
    ({}, {"temperature": 0}),
    ({}, {"temperature": 0, "logit_bias": {END_THINK: -100.0}}),
    ({}, {"temperature": 0.8, "seed": 7}),
    ({"speculative_config": SPEC}, {"temperature": 0}),
    ({"speculative_config": SPEC}, {"temperature": 0.8, "seed": 7}),
])
def test_the_forced_end_reports_the_models_own_logprob(think_dir, think_hf, device, tol,
                                                       engine, extra):
    """vLLM's default logprobs ("raw_logprobs") are of the model's logits
    before any processor, and its budget is one: the forced ``</think>``
    reports the model's log-softmax at that position (transformers' on the
    same tokens), not the 0 of a distribution forced to it, with the
    model's own rank and top tokens; the tokens around it as ever."""
    with LLM(model=think_dir, device=device, dtype="float32", executor="uni",
             max_model_len=256, reasoning_parser="deepseek_r1", **engine) as llm:
        params = SamplingParams(max_tokens=8, thinking_token_budget=3, logprobs=2, **extra)
        out = llm.generate({"prompt_token_ids": OPEN}, params)[0].outputs[0]
    tokens = list(out.token_ids)
    assert tokens[3] == END_THINK and len(out.logprobs) == len(tokens), tokens
    ref = hf_prompt_logprobs(think_hf, OPEN + tokens)[len(OPEN) - 1:]  # row i: token i's
    forced = out.logprobs[3][END_THINK]
    assert forced.logprob == pytest.approx(float(ref[3, END_THINK]), abs=tol)
    assert forced.logprob < -1.0  # tiny's </think> row is zero: far from the top
    assert forced.rank == int((ref[3] >= ref[3, END_THINK]).sum())
    top = torch.topk(ref[3], 2).indices.tolist()
    assert set(out.logprobs[3]) == set(top) | {END_THINK}
    for i, token in enumerate(tokens):
        assert out.logprobs[i][token].logprob == pytest.approx(float(ref[i, token]), abs=tol)
