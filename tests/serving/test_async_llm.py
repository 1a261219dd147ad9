"""``AsyncLLM`` (vLLM's asyncio API) on the tiny model, CPU: its final
outputs against ``LLM.generate``'s and transformers' greedy tokens, the
three output kinds against each other, stop strings worked by hand from
the byte tokenizer's ids, ``n`` 2, logprobs, concurrency, aborts (by
leaving the iterator, by a cancelled task, by ``abort``), refusals, and an
engine that stopped. One ``AsyncLLM`` and one ``LLM`` serve the module
(``async_llm``, ``offline_llm``: tests/serving/conftest.py);
each test runs its own event loop (``asyncio.run``)."""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import numpy as np
import pytest
import torch

from engine import RequestOutputKind, SamplingParams
from ipc.errors import InvalidRequestError
from serving.async_client import AsyncEngineClient
from serving.async_llm import AsyncLLM, AsyncLLMEngine, EngineDeadError
from serving.protocol_core import EngineStoppedError

pytestmark = pytest.mark.timeout(120)

CUMULATIVE, DELTA, FINAL_ONLY = RequestOutputKind
# The tiny model's byte tokenizer: a byte's id is the byte (its BOS is 256).
PROMPT = [1, *b"Hello"]
# transformers' greedy continuation of PROMPT (``test_greedy_tokens_are_transformers``
# checks it): b"y_e" then bytes that are no UTF-8 text.
GREEDY = [121, 95, 101, 251, 56, 185, 34, 158, 55, 185, 34, 158]
WAIT_S = 20


def params(kind=CUMULATIVE, **fields) -> SamplingParams:
    fields = {"temperature": 0.0, "max_tokens": 12, "ignore_eos": True} | fields
    return SamplingParams(output_kind=kind, **fields)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, WAIT_S))


async def outputs(llm, prompt, sampling, request_id="r"):
    return [out async for out in llm.generate(prompt, sampling, request_id)]


def summary(completion):
    return (completion.index, completion.text, completion.token_ids, completion.finish_reason,
            completion.stop_reason)


async def until_idle(llm) -> None:
    """Until the engine runs and waits for nothing (``WAIT_S`` at most)."""
    while True:
        stats = await llm.stats()
        if stats.num_running == 0 and stats.num_waiting == 0:
            return
        await asyncio.sleep(0.01)


@pytest.mark.timeout(180)
def test_greedy_tokens_are_transformers():
    import transformers

    from checkpoint.tiny_model import ensure_tiny_model

    model = transformers.AutoModelForCausalLM.from_pretrained(ensure_tiny_model()).eval()
    with torch.no_grad():
        tokens = model.generate(torch.tensor([PROMPT]), max_new_tokens=len(GREEDY),
                                do_sample=False, eos_token_id=None, pad_token_id=0)
    assert tokens[0, len(PROMPT):].tolist() == GREEDY


@pytest.mark.parametrize("kind", list(RequestOutputKind))
def test_final_output_is_llms_and_transformers_greedy(async_llm, offline_llm, kind):
    prompts = [{"prompt_token_ids": PROMPT}, "Hello, world"]
    want = offline_llm.generate(prompts, params())

    async def both():
        return await asyncio.gather(*(outputs(async_llm, p, params(kind), f"r{i}")
                                      for i, p in enumerate(prompts)))

    for got, expected in zip(run(both()), want, strict=True):
        final = got[-1]
        assert final.finished and all(not o.finished for o in got[:-1])
        assert final.prompt_token_ids == expected.prompt_token_ids
        assert final.prompt == expected.prompt
        if kind is DELTA:
            tokens = [t for out in got for t in out.outputs[0].token_ids]
            text = "".join(out.outputs[0].text for out in got)
        else:
            tokens, text = final.outputs[0].token_ids, final.outputs[0].text
        assert tokens == expected.outputs[0].token_ids
        assert text == expected.outputs[0].text
        assert final.outputs[0].finish_reason == "length"
        assert final.metrics.num_generation_tokens == 12
    assert want[0].outputs[0].token_ids == GREEDY


def test_deltas_join_to_the_cumulative_output_and_final_only_is_one(async_llm):
    asked = {"logprobs": 2, "prompt_logprobs": 1, "max_tokens": 10}
    prompt = {"prompt_token_ids": PROMPT}
    cumulative = run(outputs(async_llm, prompt, params(CUMULATIVE, **asked)))
    deltas = run(outputs(async_llm, prompt, params(DELTA, **asked)))
    final_only = run(outputs(async_llm, prompt, params(FINAL_ONLY, **asked)))
    whole = cumulative[-1].outputs[0]
    for before, after in zip(cumulative, cumulative[1:]):  # each extends the last
        old, new = before.outputs[0], after.outputs[0]
        assert new.text.startswith(old.text)
        assert new.token_ids[:len(old.token_ids)] == old.token_ids
        assert len(new.token_ids) > len(old.token_ids)
        assert new.logprobs[:len(old.logprobs)] == old.logprobs
    pieces = [out.outputs[0] for out in deltas]
    assert "".join(p.text for p in pieces) == whole.text
    assert [t for p in pieces for t in p.token_ids] == whole.token_ids == GREEDY[:10]
    assert [e for p in pieces for e in p.logprobs] == whole.logprobs
    assert pieces[-1].cumulative_logprob == pytest.approx(whole.cumulative_logprob)
    # The prompt's logprobs come once in a delta stream, in every cumulative output.
    assert deltas[0].prompt_logprobs == cumulative[-1].prompt_logprobs
    assert all(out.prompt_logprobs is None for out in deltas[1:])
    assert len(cumulative[-1].prompt_logprobs) == len(PROMPT)
    assert len(final_only) == 1 and final_only[0].finished
    assert summary(final_only[0].outputs[0]) == summary(whole)
    assert final_only[0].outputs[0].logprobs == whole.logprobs


def test_logprobs_are_llms(async_llm, offline_llm):
    asked = params(logprobs=2, max_tokens=6)
    want = offline_llm.generate({"prompt_token_ids": PROMPT}, asked)[0].outputs[0]
    got = run(outputs(async_llm, {"prompt_token_ids": PROMPT}, asked))[-1].outputs[0]
    assert len(got.logprobs) == 6
    for token, entry, expected in zip(got.token_ids, got.logprobs, want.logprobs, strict=True):
        assert token in entry and entry[token].rank == 1  # greedy: the top token
        assert entry.keys() == expected.keys()
        for t, lp in entry.items():
            assert lp.logprob == pytest.approx(expected[t].logprob, abs=1e-6)
            assert lp.decoded_token == expected[t].decoded_token == bytes([t]).decode(
                errors="replace")
    assert got.cumulative_logprob == pytest.approx(want.cumulative_logprob)


@pytest.mark.parametrize("kind", list(RequestOutputKind))
@pytest.mark.parametrize(("stop", "include", "text"), [
    ("e", False, "y_"),  # completed by GREEDY's third token, b"e"
    ("_e", False, "y"),  # across the second and third tokens
    ("_e", True, "y_e"),
])
def test_stop_strings_cut_the_text_worked_by_hand(async_llm, kind, stop, include, text):
    async def stopped():  # one event loop: a client of another would drop its requests
        before = await async_llm.stats()
        got = await outputs(async_llm, {"prompt_token_ids": PROMPT},
                            params(kind, stop=[stop], include_stop_str_in_output=include,
                                   max_tokens=2000))
        await until_idle(async_llm)  # the request was aborted in the engine, short of 2000 tokens
        return got, (await async_llm.stats()).num_generation_tokens - before.num_generation_tokens

    got, generated = run(stopped())
    completions = [out.outputs[0] for out in got]
    if kind is DELTA:
        assert "".join(c.text for c in completions) == text
        assert [t for c in completions for t in c.token_ids] == GREEDY[:3]
    else:
        assert (completions[-1].text, completions[-1].token_ids) == (text, GREEDY[:3])
    assert (completions[-1].finish_reason, completions[-1].stop_reason) == ("stop", stop)
    assert got[-1].finished and generated < 500


def test_n_2_with_a_seed_is_llms_and_streams_each_choice(async_llm, offline_llm):
    sampled = {"temperature": 1.0, "seed": 7, "n": 2, "max_tokens": 6}
    want = offline_llm.generate("Hello", params(**sampled))[0]
    assert want.outputs[0].token_ids != want.outputs[1].token_ids
    final = run(outputs(async_llm, "Hello", params(FINAL_ONLY, **sampled)))
    assert len(final) == 1
    assert [summary(c) for c in final[0].outputs] == [summary(c) for c in want.outputs]
    deltas = run(outputs(async_llm, "Hello", params(DELTA, **sampled)))
    assert deltas[-1].finished and not any(out.finished for out in deltas[:-1])
    for index, expected in enumerate(want.outputs):
        mine = [c for out in deltas for c in out.outputs if c.index == index]
        assert [t for c in mine for t in c.token_ids] == expected.token_ids
        assert "".join(c.text for c in mine) == expected.text
        assert mine[-1].finish_reason == "length"
    for out in deltas:  # each holds the choices with news, by index, once each
        indexes = [c.index for c in out.outputs]
        assert indexes == sorted(set(indexes)) and indexes
    assert deltas[-1].metrics.num_generation_tokens == 12


def test_two_generates_interleave_and_leaving_one_aborts_it(async_llm):
    """Both run in the same engine steps, so each stream's outputs come
    between the other's; the long one is left (``break``) once the other
    has three outputs, and the engine drops it: it goes idle after the
    other's 40 tokens, far short of the 2000 the left one asked for."""
    order = []

    async def left_early():
        async for _ in async_llm.generate({"prompt_token_ids": PROMPT},
                                          params(DELTA, max_tokens=2000), "left"):
            order.append("left")
            if order.count("kept") >= 3:
                break

    async def to_the_end():
        got = []
        async for out in async_llm.generate({"prompt_token_ids": PROMPT[:-1]},
                                            params(DELTA, max_tokens=40), "kept"):
            order.append("kept")
            got.append(out)
        return got

    async def both():
        before = await async_llm.stats()
        _, kept = await asyncio.gather(left_early(), to_the_end())
        await until_idle(async_llm)
        return before, kept, await async_llm.stats()

    before, kept, after = run(both())
    assert kept[-1].finished and kept[-1].outputs[0].finish_reason == "length"
    assert sum(len(out.outputs[0].token_ids) for out in kept) == 40
    third_kept = [i for i, who in enumerate(order) if who == "kept"][2]
    assert "left" in order[order.index("kept"):third_kept]  # interleaved
    assert after.num_generation_tokens - before.num_generation_tokens < 500


def test_a_cancelled_task_aborts_its_request(async_llm):
    async def cancel_midway():
        before = await async_llm.stats()
        started = asyncio.Event()

        async def consume():
            async for _ in async_llm.generate("Hello", params(DELTA, max_tokens=2000), "c"):
                started.set()

        task = asyncio.create_task(consume())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await until_idle(async_llm)
        return before, await async_llm.stats()

    before, after = run(cancel_midway())
    assert after.num_generation_tokens - before.num_generation_tokens < 500


def test_abort_ends_the_stream_with_its_last_output(async_llm):
    async def abort_midway():
        got = []
        async for out in async_llm.generate("Hello", params(CUMULATIVE, max_tokens=2000), "a"):
            got.append(out)
            if len(got) == 3:
                await async_llm.abort("a")
        await until_idle(async_llm)
        return got

    got = run(abort_midway())
    assert got[-1].finished and got[-1].outputs[0].finish_reason == "abort"
    assert len(got[-1].outputs[0].token_ids) < 500
    run(async_llm.abort("not running"))  # an id that is not live: nothing


@pytest.mark.parametrize(("fields", "want"), [
    ({}, [256, *b"Hello, world"]),  # the byte tokenizer: BOS 256, then a byte each
    ({"n": 2, "temperature": 1.0, "seed": 3, "truncate_prompt_tokens": 3}, list(b"rld")),
])
def test_a_text_prompt_aborted_before_it_was_tokenized_has_its_token_ids(
        async_llm, offline_llm, monkeypatch, fields, want):
    """vLLM tokenizes a prompt before it sends the request, so its abort
    output carries the prompt's ids. Here the engine's server tokenizes it
    (held in its tokenizer thread until the test has its outputs), and the
    abort comes first: the last output still has the ids, those
    ``LLM.generate`` gives the same prompt, truncation included."""
    engine = async_llm._background.engine
    tokenize = engine.tokenize
    entered, release = threading.Event(), threading.Event()

    def held_in_the_servers_threads(prompt):
        if threading.current_thread().name.startswith("tokenize"):
            entered.set()
            release.wait(WAIT_S)
        return tokenize(prompt)

    monkeypatch.setattr(engine, "tokenize", held_in_the_servers_threads)

    async def abort_while_tokenizing():
        stream = async_llm.generate("Hello, world", params(DELTA, **fields), "untokenized")
        first = asyncio.ensure_future(stream.__anext__())
        while not entered.is_set():
            await asyncio.sleep(0.01)
        await async_llm.abort("untokenized")
        return [await first] + [out async for out in stream]

    try:
        got = run(abort_while_tokenizing())
    finally:
        release.set()
    assert got[-1].finished
    choices = [c for out in got for c in out.outputs]
    assert sorted(c.index for c in choices) == list(range(fields.get("n", 1)))
    assert all((c.finish_reason, c.token_ids) == ("abort", []) for c in choices)
    assert all(out.prompt_token_ids == want for out in got)
    reference = offline_llm.generate("Hello, world", params(max_tokens=1, **fields))[0]
    assert reference.prompt_token_ids == want


def test_a_live_request_id_is_refused_until_it_ends(async_llm):
    async def twice():
        first = async_llm.generate("Hello", params(max_tokens=8), "same")
        out = await first.__anext__()
        with pytest.raises(InvalidRequestError, match="already running"):
            await async_llm.generate("Hello", params(), "same").__anext__()
        rest = [o async for o in first]
        again = await outputs(async_llm, "Hello", params(FINAL_ONLY, max_tokens=8), "same")
        return [out, *rest], again

    first, again = run(twice())
    assert first[-1].finished and again[0].finished
    assert first[-1].outputs[0].token_ids == again[0].outputs[0].token_ids


def test_a_generate_of_a_closed_loop_ends_quietly_in_the_next(async_llm):
    """A loop closed with a generate unfinished (its generators not shut
    down, as ``asyncio.run`` would): the next loop's client replaces that
    loop's, which the engine sees gone (it aborts the request); the old
    generate, closed later, has nothing to send, and its id is free."""
    old_loop = asyncio.new_event_loop()
    stale = async_llm.generate("Hello", params(DELTA, max_tokens=2000), "stale")
    old_loop.run_until_complete(stale.__anext__())
    old_loop.close()

    async def next_loop():
        before = await async_llm.stats()
        await stale.aclose()
        again = await outputs(async_llm, "Hello", params(FINAL_ONLY, max_tokens=2), "stale")
        await until_idle(async_llm)
        return again, (await async_llm.stats()).num_generation_tokens - before.num_generation_tokens

    again, generated = run(next_loop())
    assert again[-1].finished
    assert generated < 500  # the stale request was aborted in the engine, far short of 2000


def test_a_request_id_is_free_once_its_last_output_is_handed_over(async_llm):
    """As vLLM's: a finished request is no longer running, though its
    iterator was not read to its end (nor closed)."""
    async def reuse():
        first = async_llm.generate("Hello", params(FINAL_ONLY, max_tokens=4), "reused")
        only = await first.__anext__()
        again = await outputs(async_llm, "Hello", params(FINAL_ONLY, max_tokens=4), "reused")
        with pytest.raises(StopAsyncIteration):
            await first.__anext__()
        return only, again

    only, again = run(reuse())
    assert only.finished and again[0].finished
    assert again[0].outputs[0].token_ids == only.outputs[0].token_ids


def test_bad_requests_raise_before_any_output(async_llm):
    assigned = params()
    assigned.temperature = -1.0  # vLLM's scripts assign fields; checked when taken
    kind = params()
    kind.output_kind = 7
    cases = [(assigned, "temperature"), (kind, "output_kind"),
             (params(), None)]  # refused by the engine: an id outside the vocabulary
    prompts = [PROMPT, PROMPT, [1, 99999]]

    async def each():
        for (sampling, name), ids in zip(cases, prompts):
            gen = async_llm.generate({"prompt_token_ids": ids}, sampling, "bad")
            with pytest.raises(InvalidRequestError) as caught:
                await gen.__anext__()
            if name is not None:
                assert name in str(caught.value)
        return await outputs(async_llm, "Hi", params(FINAL_ONLY, max_tokens=2), "bad")

    assert run(each())[0].finished  # the engine goes on serving
    with pytest.raises(InvalidRequestError, match="output_kind"):
        SamplingParams(output_kind="DELTA")


@pytest.mark.parametrize(("prompt", "priority", "name"), [
    ({"prompt_token_ids": [1, "a"]}, 0, "prompt_token_ids"),
    ({"prompt_token_ids": [1, 2.5]}, 0, "prompt_token_ids"),
    ({"prompt_token_ids": [1, True]}, 0, "prompt_token_ids"),
    ({"prompt_token_ids": 5}, 0, "prompt_token_ids"),
    ({"prompt": 5}, 0, "a prompt is a string"),
    ({"prompt": "Hi", "cache_salt": 5}, 0, "cache_salt"),
    ("Hi", "high", "priority"),
    ("Hi", 1.0, "priority"),
])
def test_a_prompt_or_priority_of_a_wrong_type_is_an_invalid_request(async_llm, offline_llm,
                                                                     prompt, priority, name):
    """As ``LLM.generate`` refuses them (not a message the engine cannot read)."""
    async def refused():
        with pytest.raises(InvalidRequestError, match=name):
            await async_llm.generate(prompt, params(), "typed", priority=priority).__anext__()

    run(refused())
    if priority == 0:
        with pytest.raises(InvalidRequestError, match=name):
            offline_llm.generate(prompt, params())


def test_prompt_token_ids_may_be_any_sequence_of_ints_as_llms(async_llm, offline_llm):
    ids = np.array(PROMPT)  # numpy's integers, as LLM takes them
    got = run(outputs(async_llm, {"prompt_token_ids": ids}, params(FINAL_ONLY, max_tokens=4)))
    want = offline_llm.generate({"prompt_token_ids": ids}, params(max_tokens=4))[0]
    assert got[0].prompt_token_ids == want.prompt_token_ids == PROMPT
    assert got[0].outputs[0].token_ids == want.outputs[0].token_ids == GREEDY[:4]


@pytest.mark.timeout(120)
def test_a_stopped_engine_raises_in_waiting_and_later_generates():
    engine = AsyncLLM(model="tiny", device="cpu")

    async def shut_down_while_waiting():
        gen = engine.generate("Hello", params(DELTA, max_tokens=2000), "w")
        await gen.__anext__()
        engine.shutdown()
        await engine.abort("w")  # vLLM's: an engine that stopped has nothing to abort
        # The loop's last word to its clients, read before the shutdown tells the client.
        with pytest.raises(EngineDeadError, match="the engine is shutting down"):
            async for _ in gen:
                pass
        with pytest.raises(EngineDeadError, match="the engine was shut down"):
            await engine.generate("Hello", params(), "later").__anext__()
        with pytest.raises(EngineDeadError):
            await engine.check_health()

    run(shut_down_while_waiting())
    assert engine.errored and not engine.is_running
    engine.shutdown()  # a second call does nothing


@pytest.mark.timeout(120)
def test_a_request_that_finished_before_a_shutdown_yields_its_outputs():
    """Its last deltas had come when the engine shut down, only not read."""
    engine = AsyncLLM(model="tiny", device="cpu")

    async def finish_then_shut_down():
        gen = engine.generate({"prompt_token_ids": PROMPT}, params(DELTA, max_tokens=6), "done")
        got = [await gen.__anext__()]
        await until_idle(engine)  # the replies come in order: its deltas have come
        engine.shutdown()
        return got + [out async for out in gen]

    got = run(finish_then_shut_down())
    assert got[-1].finished and got[-1].outputs[0].finish_reason == "length"
    assert [t for out in got for t in out.outputs[0].token_ids] == GREEDY[:6]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["shutdown", "failure"])
def test_a_request_whose_last_delta_is_unread_at_the_stop_yields_its_outputs(how):
    """The engine sent the request's last delta, then stopped (shut down,
    or failed while idle) before the event loop read it (the loop's thread
    is held meanwhile, so the delta waits in the socket): the request
    still ends with it, as one whose deltas were read does, and what
    comes later raises EngineDeadError."""
    engine = AsyncLLM(model="tiny", device="cpu")
    background = engine._background
    send = background.server._send_deltas
    first_read, last_sent = threading.Event(), threading.Event()

    def send_then_hold(deltas):  # the engine waits after its first tokens until they are read
        send(deltas)
        if any(d.finished for d in deltas):
            last_sent.set()
        elif deltas:
            first_read.wait(WAIT_S)

    def failed_check():
        raise RuntimeError("a worker died")

    background.server._send_deltas = send_then_hold

    async def stop_before_reading():
        stream = engine.generate({"prompt_token_ids": PROMPT}, params(DELTA, max_tokens=6), "u")
        got = [await stream.__anext__()]
        if how == "failure":
            background.engine.check_health = failed_check  # the idle loop's next turn fails
        first_read.set()
        assert last_sent.wait(WAIT_S)  # this thread holds the event loop: nothing is read
        if how == "shutdown":
            engine.shutdown()
        else:
            background.thread.join(WAIT_S)
        got += [out async for out in stream]
        with pytest.raises(EngineDeadError, match="shut down" if how == "shutdown" else "died"):
            await engine.generate("Hello", params(), "later").__anext__()
        return got

    try:
        got = run(stop_before_reading())
    finally:
        engine.shutdown()
    assert not got[0].finished and got[-1].finished
    assert got[-1].outputs[0].finish_reason == "length"
    assert [t for out in got for t in out.outputs[0].token_ids] == GREEDY[:6]


@pytest.mark.timeout(120)
def test_an_engine_that_ends_as_the_first_client_is_made_raises(monkeypatch):
    """The loop tells the client it ended; one made as it ended, which it
    did not see, is told by its maker (a generate raises, never waits)."""
    engine = AsyncLLM(model="tiny", device="cpu")
    start = AsyncEngineClient.start

    async def start_as_the_loop_ends(client):
        await start(client)
        engine._background.server.stop()
        engine._background.thread.join()

    monkeypatch.setattr(AsyncEngineClient, "start", start_as_the_loop_ends)
    try:
        with pytest.raises(EngineDeadError, match="shut down"):
            run(outputs(engine, "Hello", params(), "late"))
    finally:
        engine.shutdown()


@pytest.mark.timeout(120)
def test_an_engine_that_fails_raises_engine_dead_error():
    engine = AsyncLLM(model="tiny", device="cpu")

    def broken_step(*args, **kwargs):
        raise RuntimeError("a worker died")

    async def fail():
        await engine.check_health()
        engine._background.engine.step = broken_step
        with pytest.raises(EngineDeadError, match="a worker died"):
            await outputs(engine, "Hello", params(), "f")
        with pytest.raises(EngineDeadError, match="a worker died"):
            await outputs(engine, "Hello", params(), "g")

    try:
        run(fail())
        assert engine.errored
    finally:
        engine.shutdown()


@pytest.mark.timeout(120)
def test_a_stop_the_client_heard_before_the_loop_ended_is_engine_dead_error():
    """The loop tells its clients it stopped before its thread ends: a
    generate, ``errored`` and ``check_health`` in between already say
    EngineDeadError (it was the client's bare EngineStoppedError)."""
    engine = AsyncLLM(model="tiny", device="cpu")

    async def heard():
        await engine.stats()  # this loop's client made
        client = engine._background.client
        client.protocol.stop("the engine failed: worker rank 1 exited", True)
        assert engine.errored and engine._background.dead is None
        with pytest.raises(EngineDeadError, match="worker rank 1 exited"):
            await engine.generate("Hello", params(), "late").__anext__()
        with pytest.raises(EngineDeadError, match="worker rank 1 exited"):
            await engine.check_health()

    try:
        run(heard())
    finally:
        engine.shutdown()


@pytest.mark.timeout(120)
def test_a_killed_worker_fails_every_waiting_generate_naming_it():
    engine = AsyncLLM(model="tiny", device="cpu", tensor_parallel_size=2)
    workers = engine._background.engine.executor.procs

    async def kill_midway():
        streams = [engine.generate("Hello", params(DELTA, max_tokens=2000), f"k{i}")
                   for i in range(3)]
        for stream in streams:
            await stream.__anext__()
        workers[1].kill()
        for stream in streams:
            with pytest.raises(EngineDeadError, match=r"worker rank 1 \(pid \d+\) exited"):
                async for _ in stream:
                    pass
        with pytest.raises(EngineDeadError, match="worker rank 1"):
            await engine.generate("Hello", params(), "later").__anext__()
        with pytest.raises(EngineDeadError, match="worker rank 1"):
            await engine.check_health()

    try:
        run(kill_midway())
    finally:
        engine.shutdown()
    assert all(w.poll() is not None for w in workers)


@pytest.mark.timeout(120)
def test_collected_on_the_engine_loops_thread_it_still_stops_its_workers():
    """The garbage collector may run (and finalize an ``AsyncLLM`` nobody
    holds) on any thread, the engine loop's too; its worker processes end."""
    engine = AsyncLLM(model="tiny", device="cpu", tensor_parallel_size=2)
    background = engine._background
    workers = list(background.engine.executor.procs)
    assert len(workers) == 2 and all(p.poll() is None for p in workers)
    idle_turn = background.engine.maybe_log_stats

    def collect_once(*args):  # the collector runs on the loop's thread, once
        background.engine.maybe_log_stats = idle_turn
        gc.collect()
        return idle_turn(*args)

    background.engine.maybe_log_stats = collect_once
    engine.cycle = engine  # only the collector frees it
    del engine
    deadline = time.monotonic() + 30
    while any(p.poll() is None for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(p.poll() is not None for p in workers)
    assert background.dead is not None and not background.thread.is_alive()


def test_vllms_names():
    assert AsyncLLMEngine is AsyncLLM
    assert issubclass(EngineDeadError, EngineStoppedError)
    with pytest.raises(TypeError, match="'swap_spaces'.*not an option"):
        AsyncLLM(model="tiny", swap_spaces=4)
