"""Structured outputs under a reasoning parser, as vLLM's structured-output
manager holds them: the grammar waits while the output is inside its
reasoning (every token allowed, none consumed) and holds from the token
after the first ``</think>``; a prompt that ended the reasoning, or a
request's ``enable_thinking`` false under qwen3 (the engine's rule,
``Reasoning.starts_inside``), has it hold from the first token.

On ``tiny`` with ``<think>`` (259) and ``</think>`` (260) added
(``tests.helpers.think_model``): its vocabulary is bytes, so every mask is
worked out by hand; and end to end, where only a ``logit_bias`` makes the
random model write ``</think>`` at all, so what comes before it is free
text and what comes after it matches the regex only by the mask."""

from __future__ import annotations

import re

import numpy as np
import pytest

from checkpoint.tiny_model import EOS
from engine import LLM, SamplingParams, StructuredOutputsParams
from engine.reasoning import REASONING_PARSERS, Reasoning, ReasoningTokens
from engine.structured_outputs import StructuredOutputManager
from engine.thinking_budget import ThinkingBudget
from ipc.messages import SchedulerOutput
from tests.helpers.think_model import END_THINK, THINK, tiny_with_think_tokens

VOCAB = 320
REGEX = "[0-9]{3}"


@pytest.fixture(scope="module")
def think_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("think")
    return tiny_with_think_tokens(str(root / "cache"), str(root / "model"))


@pytest.fixture(scope="module")
def manager(think_dir):
    m = StructuredOutputManager(f"{think_dir}/tokenizer.json", VOCAB, [EOS], timeout_s=30,
                                reasoning=ReasoningTokens(THINK, END_THINK))
    yield m
    m.shutdown()


class _Req:
    def __init__(self, grammar):
        self.grammar = grammar


def allowed(manager, grammar) -> list[int]:
    """The tokens the step's bitmask row of ``grammar`` allows."""
    plan = SchedulerOutput(step_id=1, structured_output_req_ids=["r"])
    bitmask = manager.bitmask(plan, {"r": _Req(grammar)})
    words = np.frombuffer(bitmask.bitmask, dtype="<i4").reshape(1, (VOCAB + 31) // 32)
    bits = (words[:, :, None].astype(np.int64) >> np.arange(32)) & 1
    return np.flatnonzero(bits.reshape(-1)[:VOCAB]).tolist()


QWEN3 = Reasoning(REASONING_PARSERS["qwen3"], ReasoningTokens(THINK, END_THINK))


def grammar_for(manager, prompt, enable_thinking=True, regex="a[bc]"):
    """The grammar of a request with ``prompt``, where the engine's rule
    (qwen3's) starts it."""
    params = SamplingParams(structured_outputs=StructuredOutputsParams(regex=regex))
    manager.check(params)
    in_reasoning = manager.reasoning is not None and QWEN3.starts_inside(prompt, enable_thinking)
    return manager.new_grammar(params, in_reasoning)


EVERY = list(range(VOCAB))


def test_the_grammar_holds_from_the_token_after_the_end_tag(manager):
    g = grammar_for(manager, [1, THINK, 2])  # a prompt that opened the thinking
    assert allowed(manager, g) == EVERY and not g.active
    for token in (ord("z"), THINK, EOS - 1):  # anything passes, a start tag too
        assert g.accept(token)
    assert allowed(manager, g) == EVERY
    assert g.accept(END_THINK) and g.active and g.num_tokens == 4
    assert allowed(manager, g) == [ord("a")]
    assert g.accept(ord("a")) and allowed(manager, g) == [ord("b"), ord("c")]
    assert not g.is_terminated() and g.accept(ord("b")) and g.is_terminated()
    assert not g.accept(END_THINK) and g.is_error()  # the grammar's own from here on


def test_rolled_back_over_the_end_tag_it_is_in_the_reasoning_again(manager):
    g = grammar_for(manager, [1, 2])  # no tag: the output begins inside (DeepSeek-R1's rule)
    for token in (ord("x"), END_THINK, ord("a"), ord("c")):
        assert g.accept(token)
    assert g.is_terminated()
    g.rollback_to(3)  # "x", </think>, "a"
    assert allowed(manager, g) == [ord("b"), ord("c")]
    g.rollback_to(2)  # "x", </think>: the grammar at its start
    assert g.active and allowed(manager, g) == [ord("a")]
    g.rollback_to(1)  # "x": the end tag is gone
    assert not g.active and allowed(manager, g) == EVERY
    assert g.accept(ord("y")) and g.accept(END_THINK) and allowed(manager, g) == [ord("a")]


@pytest.mark.parametrize("prompt, enable_thinking, active", [
    ([THINK, 5, END_THINK, 6], True, True),  # the prompt closed the thinking
    ([END_THINK, 1, THINK], True, False),  # closed, then opened again
    ([THINK], False, True),  # the request turned thinking off
    ([], True, False),
])
def test_where_the_grammar_starts(manager, prompt, enable_thinking, active):
    g = grammar_for(manager, prompt, enable_thinking)
    assert g.active is active
    assert allowed(manager, g) == ([ord("a")] if active else EVERY)


def test_without_a_reasoning_parser_the_grammar_holds_at_once(think_dir):
    plain = StructuredOutputManager(f"{think_dir}/tokenizer.json", VOCAB, [EOS], timeout_s=30)
    try:
        g = grammar_for(plain, [1, THINK, 2])
        assert g.active and allowed(plain, g) == [ord("a")]
    finally:
        plain.shutdown()


class _Drafted:
    def __init__(self, grammar, drafts, thinking_budget=None):
        self.grammar, self.next_drafts = grammar, drafts
        self.thinking_budget = thinking_budget


def drafted_rows(manager, grammar, drafts, budget=None) -> list[list[int]]:
    """The tokens each of a drafted request's 1 + d bitmask rows allows."""
    plan = SchedulerOutput(step_id=1, structured_output_req_ids=["r"])
    bitmask = manager.bitmask(plan, {"r": _Drafted(grammar, drafts, budget)},
                              {"r": len(drafts)})
    assert bitmask.num_rows == [1 + len(drafts)]
    if budget is not None:  # its state, no forced id
        assert bitmask.thinking_states == [budget.state()]
        assert bitmask.forced_token_ids in ([], [-1])
    words = np.frombuffer(bitmask.bitmask, dtype="<i4").reshape(-1, (VOCAB + 31) // 32)
    bits = (words[:, :, None].astype(np.int64) >> np.arange(32)) & 1
    return [np.flatnonzero(row[:VOCAB]).tolist() for row in bits.reshape(len(words), -1)]


A, B, C = ord("a"), ord("b"), ord("c")


def test_drafted_rows_follow_the_grammar_over_the_drafts_and_roll_it_back(manager):
    """a[bc] over drafts: row i is the mask after drafts 1..i; the row
    after the grammar's end allows EOS alone; rows after a refused draft
    allow every token (the draft is rejected at the row before); the
    matcher is left as it was."""
    g = grammar_for(manager, [THINK, 5, END_THINK, 6])  # active from the first token
    assert drafted_rows(manager, g, [A, B, ord("x")]) == [[A], [B, C], [EOS], EVERY]
    assert drafted_rows(manager, g, [A, ord("x"), C]) == [[A], [B, C], EVERY, EVERY]
    assert drafted_rows(manager, g, [ord("x"), A]) == [[A], EVERY, EVERY]
    assert g.num_tokens == 0 and not g.is_error() and allowed(manager, g) == [A]


def test_drafted_rows_a_thinking_budget_forces_allow_every_token(manager):
    """A grammar that holds while a thinking section is open (budget 1,
    none spent): over drafts a, b the budget forces rows 1 and 2 (after
    one and two tokens), which allow every token, as a forced row without
    drafts does (the sampler forces </think> on the model's logits); row 0
    is the grammar's."""
    g = grammar_for(manager, [THINK, 5, END_THINK, 6])
    budget = ThinkingBudget(1, ReasoningTokens(THINK, END_THINK), [1, THINK])
    assert drafted_rows(manager, g, [A, B], budget) == [[A], EVERY, EVERY]
    assert drafted_rows(manager, g, [A, B]) == [[A], [B, C], [EOS]]
    assert g.num_tokens == 0 and allowed(manager, g) == [A]


def test_drafted_rows_of_a_grammar_inside_its_reasoning(manager):
    """Every row up to the one after a drafted end tag is free; from there
    the grammar holds from its start; with no end tag drafted all are free;
    the grammar stays inside its reasoning."""
    g = grammar_for(manager, [1, THINK, 2])
    assert drafted_rows(manager, g, [ord("z"), END_THINK, A, C]) == [
        EVERY, EVERY, [A], [B, C], [EOS]]
    assert drafted_rows(manager, g, [ord("z"), END_THINK]) == [EVERY, EVERY, [A]]
    assert drafted_rows(manager, g, [ord("z"), THINK]) == [EVERY] * 3
    assert not g.active and g.num_tokens == 0 and allowed(manager, g) == EVERY


def _params(seed: int) -> SamplingParams:
    # The bias makes </think> likely enough to come within the budget.
    return SamplingParams(temperature=1.0, seed=seed, max_tokens=48,
                          logit_bias={END_THINK: 6.0},
                          structured_outputs=StructuredOutputsParams(regex=REGEX))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("async_scheduling", [True, False])
def test_the_reasoning_is_free_and_the_answer_after_it_matches(think_dir, async_scheduling):
    prompts = [{"prompt_token_ids": [256, 72, 105, THINK]}] * 8
    with LLM(model=think_dir, device="cpu", reasoning_parser="qwen3",
             async_scheduling=async_scheduling) as llm:
        outs = llm.generate(prompts, [_params(seed) for seed in range(len(prompts))],
                            use_tqdm=False)
        free = 0
        for out in outs:
            completion = out.outputs[0]
            ids = completion.token_ids
            if END_THINK not in ids:  # ended (EOS) or cut inside its reasoning
                continue
            end = ids.index(END_THINK)
            reasoning = llm.get_tokenizer().decode(ids[:end])
            answer = llm.get_tokenizer().decode(ids[end + 1:])
            assert re.fullmatch(REGEX, answer), completion.text
            assert completion.finish_reason == "stop"  # the grammar complete
            free += bool(re.search(r"[^0-9]", reasoning))
        assert free >= 2  # reasoning the regex would never have let through
        # A prompt that ended the reasoning: the grammar holds from the first token.
        closed = [{"prompt_token_ids": [256, 72, 105, THINK, 10, END_THINK, 10]}]
        for seed in range(3):
            completion = llm.generate(closed, _params(seed), use_tqdm=False)[0].outputs[0]
            assert re.fullmatch(REGEX, completion.text) and END_THINK not in \
                completion.token_ids
