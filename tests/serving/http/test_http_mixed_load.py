"""Mixed concurrent load on ``tprun serve --http-port`` (``tiny``, CPU), driven
by the official ``openai`` client: greedy and seeded requests, ``n`` 2,
logprobs, stop strings, structured outputs (choice, regex, JSON schema; with
logprobs too), priorities, outputs that run to the end of the context, and
streams the client drops after two chunks (each engine request then ends
once, as the server's per-reason finish counters say), all at once against a KV cache so
small that requests are preempted, with a draft model proposing drafts.

Every answer is whole and consistent (finish reason, usage, one logprob a
token, constrained text that validates); every greedy or seeded request the
client did not drop then runs alone on the same server and answers the same
tokens (seeded sampling depends on the seed and the position alone, never
on the batch); afterwards nothing runs, waits or holds a KV block.
"""

from __future__ import annotations

import asyncio
import json
import random
import re

import httpx
import jsonschema
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.http_utils import metric, serving_tiny, wait_for_metric

pytestmark = pytest.mark.timeout(240)

MAX_MODEL_LEN = 128
DRAFT = json.dumps({"method": "draft_model", "model": "tiny", "num_speculative_tokens": 3})
PROMPTS = ["Once upon a time", "abcabcabcabcabcabc", "the cat sat on the mat; the cat sat",
           "System: answer briefly. System: answer briefly. User: hello",
           "System: answer briefly. System: answer briefly. User: goodbye"]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "b": {"type": "boolean"}},
          "required": ["a", "b"], "additionalProperties": False}
REGEX = r"[a-z]{2,5}-[0-9]{1,3}"
CHOICES = ["yes", "no", "maybe"]
# What each request asks for beyond its prompt, length and priority, in turn.
KINDS = [
    {"temperature": 0},
    {"temperature": 0.8, "seed": 11, "n": 2},
    {"temperature": 0, "logprobs": 3},
    {"temperature": 0, "logprobs": 3, "structured_outputs": {"choice": CHOICES}},
    {"temperature": 0.8, "seed": 5, "structured_outputs": {"regex": REGEX}},
    {"temperature": 0.8, "seed": 7, "logprobs": 2, "structured_outputs": {"json": SCHEMA}},
    {"temperature": 0, "stop": ["e", "a"]},
    {"temperature": 0, "max_tokens": None, "ignore_eos": True},
    {"temperature": 0.8, "seed": 3, "max_tokens": None, "ignore_eos": True, "logprobs": 1},
    {"temperature": 0, "stream": True, "drop": True, "max_tokens": 40},
    {"temperature": 0.8, "seed": 9, "n": 2, "stream": True},
    {"temperature": 1.0},  # unseeded: checked for consistency only
]


def _requests(count: int) -> list[dict]:
    rng = random.Random(0)
    out = []
    for i in range(count):
        kind = dict(KINDS[i % len(KINDS)])
        if "seed" in kind:
            kind["seed"] += i
        body = {"prompt": rng.choice(PROMPTS), "max_tokens": rng.choice([4, 16, 40]),
                "priority": rng.randint(-1, 1), **kind}
        if "structured_outputs" in body:
            body["max_tokens"] = 40
        out.append(body)
    return out


async def _ask(client: openai.AsyncOpenAI, body: dict) -> dict | None:
    """The answer's choices and usage; None for a stream the client dropped."""
    body = dict(body)
    drop = body.pop("drop", False)
    fields = {k: body.pop(k) for k in ("prompt", "max_tokens", "temperature", "seed", "n",
                                       "logprobs", "stop", "stream") if k in body}
    extra = dict(body, return_token_ids=True)
    if not fields.get("stream"):
        answer = await client.completions.create(model="tiny", extra_body=extra, **fields)
        choices = {c.index: _choice(c.text, c.token_ids, c.finish_reason, c.logprobs)
                   for c in answer.choices}
        return {"choices": choices, "usage": answer.usage}
    stream = await client.completions.create(model="tiny", extra_body=extra,
                                             stream_options={"include_usage": True}, **fields)
    choices, usage, chunks = {}, None, 0
    async for chunk in stream:
        chunks += 1
        usage = chunk.usage or usage
        for c in chunk.choices:
            got = choices.setdefault(c.index, _choice("", [], None, None))
            got["text"] += c.text
            got["token_ids"] += c.token_ids or []
            got["finish"] = c.finish_reason or got["finish"]
        if drop and chunks == 2:
            await stream.close()
            return None
    return {"choices": choices, "usage": usage}


def _choice(text, token_ids, finish, logprobs) -> dict:
    return {"text": text, "token_ids": list(token_ids or []), "finish": finish,
            "logprobs": None if logprobs is None else logprobs.token_logprobs}


async def _all_at_once(url: str, bodies: list[dict]) -> list[dict | None]:
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0,
                                  timeout=120) as client:
        return await asyncio.gather(*(_ask(client, b) for b in bodies))


async def _one_by_one(url: str, bodies: list[dict]) -> list[dict]:
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0,
                                  timeout=120) as client:
        return [await _ask(client, b) for b in bodies]


def _finished_by_reason(url: str) -> dict[str, float]:
    """``tprun:request_success_total`` by its ``finished_reason`` label."""
    page = httpx.get(f"{url}/metrics", timeout=30).text
    return {sample.labels["finished_reason"]: sample.value
            for family in text_string_to_metric_families(page) for sample in family.samples
            if sample.name == "tprun:request_success_total"}


def _check_consistent(body: dict, answer: dict, prompt_len: int) -> None:
    n = body.get("n", 1)
    assert sorted(answer["choices"]) == list(range(n)), body
    total = 0
    for got in answer["choices"].values():
        count = len(got["token_ids"])
        total += count
        assert got["finish"] in ("stop", "length"), body
        if got["finish"] == "length":
            assert count == body["max_tokens"] or prompt_len + count == MAX_MODEL_LEN, body
        if body.get("logprobs") is not None and not body.get("stream"):
            assert len(got["logprobs"]) == count and all(v <= 0 for v in got["logprobs"]), body
        for stop in body.get("stop", []):
            assert stop not in got["text"], body
        constraint = body.get("structured_outputs", {})
        if got["finish"] == "stop" and "choice" in constraint:
            assert got["text"] in CHOICES, got
        if got["finish"] == "stop" and "regex" in constraint:
            assert re.fullmatch(REGEX, got["text"]), got
        if got["finish"] == "stop" and "json" in constraint:
            jsonschema.validate(json.loads(got["text"]), SCHEMA)
    assert answer["usage"].completion_tokens == total, body
    assert answer["usage"].prompt_tokens == prompt_len, body


def _check_same(body: dict, mixed: dict, alone: dict) -> None:
    """Tokens, text and finish reason equal; logprobs equal up to float
    noise (the batch's shape changes the order of the sums)."""
    assert mixed["choices"].keys() == alone["choices"].keys(), body
    for index, got in mixed["choices"].items():
        want = alone["choices"][index]
        assert (got["token_ids"], got["text"], got["finish"]) == (
            want["token_ids"], want["text"], want["finish"]), body
        if got["logprobs"] is not None:
            assert got["logprobs"] == pytest.approx(want["logprobs"], abs=1e-4), body


@pytest.mark.timeout(180)
def test_mixed_concurrent_requests_each_answer_as_alone(tmp_path):
    with serving_tiny(tmp_path, "--nproc-per-node", "1", "serve", "--model", "tiny",
                      "--device", "cpu", "--disable-log-stats",
                      "--max-model-len", str(MAX_MODEL_LEN), "--num-gpu-blocks-override", "10",
                      "--max-num-batched-tokens", "32", "--max-num-seqs", "8",
                      "--scheduling-policy", "priority", "--speculative-config",
                      DRAFT) as server:
        bodies = _requests(48)
        answers = asyncio.run(_all_at_once(server.url, bodies))
        prompt_lens = {p: len(p.encode()) + 1 for p in PROMPTS}  # bytes and <s>
        for body, answer in zip(bodies, answers):
            if answer is not None:
                _check_consistent(body, answer, prompt_lens[body["prompt"]])
        dropped = sum(answer is None for answer in answers)
        repeatable = [i for i, (body, answer) in enumerate(zip(bodies, answers))
                      if answer is not None and (body["temperature"] == 0 or "seed" in body)]
        alone = asyncio.run(_one_by_one(server.url, [bodies[i] for i in repeatable]))
        for i, answer in zip(repeatable, alone):
            _check_same(bodies[i], answers[i], answer)
        assert wait_for_metric(server.url, "tprun:num_requests_running", lambda v: v == 0) == 0
        # Each engine request (one a choice, the replays' too) ended once: the
        # dropped streams' either aborted or run out, every other one stopped.
        ended = _finished_by_reason(server.url)
        choices = sum(b.get("n", 1) for b in bodies) + sum(bodies[i].get("n", 1) for i in repeatable)
        assert sum(ended.values()) == choices, ended
        assert ended["abort"] <= dropped == 4 and ended["error"] == 0, ended
        assert metric(server.url, "tprun:num_requests_waiting") == 0
        assert metric(server.url, "tprun:kv_cache_usage_perc") == 0
        assert metric(server.url, "tprun:num_preemptions_total") > 0
        assert metric(server.url, "tprun:spec_decode_num_accepted_tokens_total") > 0
