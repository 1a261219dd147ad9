"""A seeded differential fuzz of ``AsyncLLM`` on the tiny model, CPU.

Random requests (token-id and text prompts, greedy and seeded sampling,
``n`` 1 to 3, stop strings with and without ``include_stop_str_in_output``,
sample and prompt logprobs, every output kind) run all at once in one
event loop; each one's final output is ``LLM.generate``'s for the same
prompt and parameters (the reference: the engine in process, stop strings
cut by ``LLM``), its DELTA outputs joined are that output, its CUMULATIVE
outputs each extend the one before, its FINAL_ONLY output is one. Some are
left early (``break``) or ended by ``abort``: what they yielded is a prefix
of the reference. Afterwards the engine is idle and no request is left
routed in the client or the server."""

from __future__ import annotations

import asyncio
import random

import pytest

from engine import RequestOutputKind, SamplingParams

pytestmark = pytest.mark.timeout(120)

NUM_REQUESTS = 40
SEEDS = [0, 1]  # each a different set of requests (any seed passes: 250 were tried)


def random_case(rng: random.Random) -> tuple[str | dict, SamplingParams, str]:
    """(prompt, parameters, how the caller reads: "all", "break", "abort")."""
    if rng.random() < 0.5:
        prompt = {"prompt_token_ids": [1, *(rng.randrange(32, 127)
                                            for _ in range(rng.randint(1, 8)))]}
    else:
        prompt = "".join(rng.choice("abcdefgh ,.") for _ in range(rng.randint(1, 12)))
    fields = {"max_tokens": rng.randint(1, 24), "ignore_eos": rng.random() < 0.7,
              "n": rng.choice([1, 1, 2, 3]),
              "output_kind": rng.choice(list(RequestOutputKind))}
    if rng.random() < 0.5:
        fields |= {"temperature": 0.0, "n": 1}  # greedy choices would all be one
    else:
        fields |= {"temperature": 1.0, "seed": rng.randrange(1000)}
    if rng.random() < 0.4:
        fields["logprobs"] = rng.randint(0, 3)
    if rng.random() < 0.3:
        fields["prompt_logprobs"] = rng.randint(0, 2)
    if rng.random() < 0.2:
        fields["min_tokens"] = rng.randint(0, fields["max_tokens"])
    if rng.random() < 0.1:
        fields["detokenize"] = False
    how = rng.choices(["all", "break", "abort"], weights=[6, 1, 1])[0]
    return prompt, SamplingParams(**fields), how


def with_stop_strings(rng: random.Random, params: SamplingParams, texts: list[str]):
    """``params`` with stop strings cut from the texts the model writes
    without them (so they are met, within a delta or across two), or
    ``params`` itself."""
    if rng.random() < 0.4:
        return params
    pieces = []
    for text in texts:
        if len(text) >= 2 and rng.random() < 0.6:
            start = rng.randrange(len(text) - 1)
            pieces.append(text[start:start + rng.randint(1, 3)])
    if not pieces:
        return params
    return params.replaced(stop=pieces, include_stop_str_in_output=rng.random() < 0.5)


def completion_summary(c) -> tuple:
    return (c.index, c.text, c.token_ids, c.finish_reason, c.stop_reason)


def assert_logprobs_match(got, want) -> None:
    assert (got is None) == (want is None)
    if got is None:
        return
    assert len(got) == len(want)
    for entry, expected in zip(got, want):
        assert (entry is None) == (expected is None)
        if entry is None:
            continue
        assert entry.keys() == expected.keys()
        for token, lp in entry.items():
            assert lp.logprob == pytest.approx(expected[token].logprob, abs=1e-4)
            assert lp.rank == expected[token].rank


def joined(outputs, kind):
    """Each choice's completion as the stream tells it: the DELTA pieces
    joined, otherwise the last output that holds the choice."""
    whole = {}
    for out in outputs:
        for c in out.outputs:
            if kind is not RequestOutputKind.DELTA or c.index not in whole:
                whole[c.index] = (c.text, list(c.token_ids), c.finish_reason, c.stop_reason,
                                  None if c.logprobs is None else list(c.logprobs),
                                  c.cumulative_logprob)
            else:
                text, ids, _, _, lps, _ = whole[c.index]
                whole[c.index] = (text + c.text, ids + c.token_ids, c.finish_reason,
                                  c.stop_reason,
                                  None if c.logprobs is None else lps + c.logprobs,
                                  c.cumulative_logprob)
    return whole


def check_stream(outputs, params: SamplingParams, want, unstopped, how: str) -> None:
    """``want``: the reference output; ``unstopped``: the reference without
    stop strings (what an aborted stream, which shows the text it held back
    for a stop string that was not met in full, is a prefix of)."""
    kind = params.output_kind
    assert outputs or how != "all"
    assert all(not out.finished for out in outputs[:-1])
    if kind is RequestOutputKind.FINAL_ONLY:
        assert len(outputs) <= 1
    if kind is RequestOutputKind.CUMULATIVE:  # each output extends the one before
        last = {}
        for out in outputs:
            for c in out.outputs:
                if c.index in last:
                    text, ids = last[c.index]
                    assert c.text.startswith(text) and c.token_ids[:len(ids)] == ids
                last[c.index] = (c.text, list(c.token_ids))
    for out in outputs:
        indexes = [c.index for c in out.outputs]
        assert indexes == sorted(set(indexes))
        # Also where an abort came before the server had tokenized a text prompt.
        assert out.prompt_token_ids == want.prompt_token_ids
    if kind is RequestOutputKind.DELTA:  # the prompt's logprobs come in one output only
        shown = [out.prompt_logprobs for out in outputs if out.prompt_logprobs is not None]
        assert len(shown) <= 1
        if how == "all":
            assert len(shown) == (params.prompt_logprobs is not None)
            if shown:
                assert_logprobs_match(shown[0], want.prompt_logprobs)
    elif outputs and how == "all":
        assert_logprobs_match(outputs[-1].prompt_logprobs, want.prompt_logprobs)
    whole = joined(outputs, kind)
    aborted = outputs and outputs[-1].finished and any(
        c.finish_reason == "abort" for c in outputs[-1].outputs)
    for index, expected in enumerate(want.outputs):
        if index not in whole:
            assert how != "all"
            continue
        text, ids, finish, stop, lps, cumulative = whole[index]
        if how == "all" or (finish is not None and finish != "abort"):
            assert (index, text, ids, finish, stop) == completion_summary(expected)
            assert_logprobs_match(lps, expected.logprobs)
            if expected.cumulative_logprob is not None:
                assert cumulative == pytest.approx(expected.cumulative_logprob, abs=1e-3)
        else:  # left or aborted: a prefix of the reference
            assert expected.token_ids[:len(ids)] == ids
            assert unstopped.outputs[index].text.startswith(text)
            assert finish in (None, "abort") and (finish is None or aborted)
    if how == "all":
        assert outputs[-1].finished
        assert outputs[-1].metrics.num_generation_tokens == sum(
            len(c.token_ids) for c in want.outputs)


async def read(llm, prompt, params, how, request_id, rng):
    stop_after = rng.randint(1, 4)
    got = []
    if how == "abort" and rng.random() < 0.5:  # at any time: midway, or just as it ends
        asyncio.get_running_loop().call_later(
            rng.random() * 0.05, lambda: asyncio.ensure_future(llm.abort(request_id)))
    async for out in llm.generate(prompt, params, request_id):
        got.append(out)
        if len(got) == stop_after and how == "break":
            break
        if len(got) == stop_after and how == "abort":
            await llm.abort(request_id)
        if rng.random() < 0.3:
            await asyncio.sleep(rng.random() * 0.01)  # a slow reader: outputs merge
    return got


@pytest.mark.parametrize("seed", SEEDS)
def test_async_llm_against_llm_generate(async_llm, offline_llm, seed):
    rng = random.Random(seed)
    cases = [random_case(rng) for _ in range(NUM_REQUESTS)]
    unstopped = offline_llm.generate([prompt for prompt, _, _ in cases],
                                     [params for _, params, _ in cases])
    cases = [(prompt, with_stop_strings(rng, params, [c.text for c in want.outputs]), how)
             for (prompt, params, how), want in zip(cases, unstopped)]
    wants = offline_llm.generate([prompt for prompt, _, _ in cases],
                                 [params for _, params, _ in cases])

    async def everything():
        readers = [read(async_llm, prompt, params, how, f"f{seed}-{i}",
                        random.Random(seed * NUM_REQUESTS + i))
                   for i, (prompt, params, how) in enumerate(cases)]
        got = await asyncio.gather(*readers)
        while True:  # the aborted and left requests end in the engine too
            stats = await async_llm.stats()
            if stats.num_running == 0 and stats.num_waiting == 0:
                break
            await asyncio.sleep(0.01)
        return got

    results = asyncio.run(asyncio.wait_for(everything(), 60))
    for (_, params, how), want, free, got in zip(cases, wants, unstopped, results, strict=True):
        check_stream(got, params, want, free, how)
    background = async_llm._background
    assert async_llm._requests == {}
    assert background.client.protocol.sinks == {}
    assert background.server.routes == {} and background.server.engine_ids == {}
    assert background.server.waiting == {}
