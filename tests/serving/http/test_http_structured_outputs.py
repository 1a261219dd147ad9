"""Structured outputs over HTTP on ``tiny`` (``tprun serve --http-port``),
driven by the official ``openai`` client: ``response_format`` (json_schema,
json_object, vLLM's structural_tag) on chat and completions answers what
``LLM.generate`` answers with the same constraint; vLLM's
``structured_outputs`` object and the older ``guided_*`` fields in
``extra_body`` constrain the output (validated against the schema, matched
in full, one of the choices, for every one of ``n`` choices); each kind of bad constraint is a 400 in OpenAI's shape, and the
server goes on serving."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest

from engine import LLM, SamplingParams, StructuredOutputsParams
from tests.helpers.http_utils import serving_tiny
from tests.helpers.structural_tags import read_tags

pytestmark = pytest.mark.timeout(180)

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 5},
                   "size": {"enum": ["S", "M", "L"]},
                   "dims": {"type": "array", "items": {"type": "integer", "minimum": 0,
                                                        "maximum": 99}, "maxItems": 3}},
    "required": ["name", "size", "dims"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Describe a box."}]
CHOICES = ["alpha", "beta", "gamma"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_tiny(tmp_path_factory.mktemp("http"), "serve", "--model", "tiny",
                      "--device", "cpu", "--disable-log-stats") as served:
        yield served


@pytest.fixture(scope="module")
def reference(server):
    with LLM(model=server.model_dir, device="cpu") as llm:
        yield llm


def _chat_ids(model_dir) -> list[int]:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(model_dir).apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_chat_response_format_json_schema_is_the_engines_answer(server, client, reference):
    ids = _chat_ids(server.model_dir)
    for seed in range(3):
        resp = client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=60, temperature=1.0, seed=seed,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "box", "schema": SCHEMA, "strict": True}})
        want = reference.generate({"prompt_token_ids": ids}, SamplingParams(
            temperature=1.0, seed=seed, max_tokens=60,
            structured_outputs=StructuredOutputsParams(json=SCHEMA)))[0].outputs[0]
        choice = resp.choices[0]
        assert choice.message.content == want.text
        assert choice.finish_reason == want.finish_reason
        if choice.finish_reason == "stop":
            jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_completion_json_object_is_the_engines_answer(client, reference):
    resp = client.completions.create(model="tiny", prompt="{", max_tokens=40, temperature=0,
                                     extra_body={"response_format": {"type": "json_object"}})
    want = reference.generate("{", SamplingParams(
        temperature=0.0, max_tokens=40,
        structured_outputs=StructuredOutputsParams(json_object=True)))[0].outputs[0]
    assert resp.choices[0].text == want.text
    assert want.text.lstrip().startswith("{")


CALL = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
# One byte ("<", id 60 in tiny's byte vocabulary) triggers a tag; favoured, so
# random weights write tags.
STRUCTURAL_TAG = {"type": "structural_tag", "triggers": ["<"],
                  "structures": [{"begin": "<call>", "schema": CALL, "end": "</call>"}]}
FAVOUR_TRIGGER = {"60": 4.0}


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_response_format_structural_tag_is_the_engines_answer(server, client, reference, route):
    """vLLM's response_format structural_tag, sent by the openai client:
    the answer is ``LLM.generate``'s with ``structural_tag`` set to the
    format's JSON text, and every tag in it holds JSON valid against the
    schema."""
    tags = 0
    for seed in range(8):
        if route == "chat":
            resp = client.chat.completions.create(
                model="tiny", messages=MESSAGES, max_tokens=64, temperature=1.0, seed=seed,
                logit_bias=FAVOUR_TRIGGER, response_format=STRUCTURAL_TAG)
            text, finish = resp.choices[0].message.content, resp.choices[0].finish_reason
            prompt = {"prompt_token_ids": _chat_ids(server.model_dir)}
        else:
            resp = client.completions.create(
                model="tiny", prompt="Go:", max_tokens=64, temperature=1.0, seed=seed,
                logit_bias=FAVOUR_TRIGGER, extra_body={"response_format": STRUCTURAL_TAG})
            text, finish = resp.choices[0].text, resp.choices[0].finish_reason
            prompt = "Go:"
        want = reference.generate(prompt, SamplingParams(
            temperature=1.0, seed=seed, max_tokens=64, logit_bias={60: 4.0},
            structured_outputs=StructuredOutputsParams(
                structural_tag=json.dumps(STRUCTURAL_TAG))))[0].outputs[0]
        assert (text, finish) == (want.text, want.finish_reason)
        tags += len(read_tags(text, STRUCTURAL_TAG, cut=finish == "length"))
    assert tags >= 3, tags  # written (5 and 6 with these seeds), so held


def test_structured_outputs_object_validates_for_every_choice(client):
    resp = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=80, temperature=1.0, seed=5, n=4,
        extra_body={"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}})
    assert len(resp.choices) == 4
    finished = [c for c in resp.choices if c.finish_reason == "stop"]
    assert len(finished) >= 2
    for c in finished:
        jsonschema.validate(json.loads(c.message.content), SCHEMA)


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_guided_fields(client, route):
    def ask(extra, n=1):
        if route == "chat":
            resp = client.chat.completions.create(model="tiny", messages=MESSAGES,
                                                  max_tokens=24, temperature=1.0, seed=1, n=n,
                                                  extra_body=extra)
            return [c.message.content for c in resp.choices], resp
        resp = client.completions.create(model="tiny", prompt="Pick:", max_tokens=24,
                                         temperature=1.0, seed=1, n=n, extra_body=extra)
        return [c.text for c in resp.choices], resp

    texts, resp = ask({"guided_choice": CHOICES}, n=3)
    assert all(t in CHOICES for t in texts) and all(
        c.finish_reason == "stop" for c in resp.choices)
    texts, _ = ask({"guided_regex": r"[0-9]{2}-[a-z]{3}"}, n=2)
    assert all(re.fullmatch(r"[0-9]{2}-[a-z]{3}", t) for t in texts), texts
    texts, _ = ask({"guided_grammar": 'start: "x" ("y" | "z")'})
    assert texts[0] in ("xy", "xz")
    small = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
             "additionalProperties": False}
    texts, resp = ask({"guided_json": small})
    if resp.choices[0].finish_reason == "stop":
        assert json.loads(texts[0]) in ({"ok": True}, {"ok": False})


def _strict_json(text: str):
    """JSON as the standard reads it: -Infinity, Infinity and NaN refused."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def _floored_top(values: list[float], allowed: int) -> None:
    """A constrained token's top-5 logprobs: the ``allowed`` tokens the
    grammar lets through are finite, the rest -9999.0 (vLLM's floor for
    -inf, which JSON cannot carry)."""
    assert len(values) == 5
    assert sorted(values)[:5 - allowed] == [-9999.0] * (5 - allowed), values
    assert all(v > -9999.0 for v in sorted(values)[5 - allowed:]), values


def test_logprobs_of_tokens_the_grammar_rules_out_are_floored(server):
    """With choice ["yes", "no"] (one byte a token in ``tiny``) the first
    token has two allowed candidates and every later one a single one, so
    the top 5 hold -inf logprobs: each answer is JSON, whole or streamed,
    with those shown as -9999.0."""
    constraint = {"structured_outputs": {"choice": ["yes", "no"]}, "temperature": 0,
                  "max_tokens": 5}
    body = {"model": "tiny", "prompt": "Pick:", "logprobs": 5, **constraint}
    whole = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert whole.status_code == 200, whole.text
    choice = _strict_json(whole.text)["choices"][0]
    assert choice["text"] in ("yes", "no")
    tops = choice["logprobs"]["top_logprobs"]
    assert len(tops) == len(choice["text"])
    for i, top in enumerate(tops):
        _floored_top(list(top.values()), allowed=2 if i == 0 else 1)
    streamed = []
    with httpx.stream("POST", f"{server.url}/v1/completions", json={**body, "stream": True},
                      timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                streamed += _strict_json(line[6:])["choices"][0]["logprobs"]["top_logprobs"]
    assert streamed == tops
    chat = httpx.post(f"{server.url}/v1/chat/completions", json={
        "model": "tiny", "messages": MESSAGES, "logprobs": True, "top_logprobs": 5,
        **constraint}, timeout=60)
    assert chat.status_code == 200, chat.text
    content = _strict_json(chat.text)["choices"][0]["logprobs"]["content"]
    for i, entry in enumerate(content):
        _floored_top([t["logprob"] for t in entry["top_logprobs"]], allowed=2 if i == 0 else 1)


def _error(response: httpx.Response) -> dict:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    return error


_SCHEMA = "response_format.json_schema.schema"


@pytest.mark.parametrize("fields, param, problem", [
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": "{not json"}}},
     _SCHEMA, "is not valid JSON"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}},
     _SCHEMA, "must be a JSON schema (an object), got list"),
    ({"guided_json": "{not json"}, "guided_json", "is not valid JSON"),
    ({"guided_choice": []}, "guided_choice", "must not be empty"),
    ({"guided_regex": ""}, "guided_regex", "must be a non-empty string"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json",
     "is not valid JSON"),
    ({"structured_outputs": {"choice": ["a", ""]}}, "structured_outputs.choice",
     "must hold non-empty strings"),
    ({"response_format": {"type": "yaml"}}, "response_format.type", "type must be"),
    ({"response_format": {**STRUCTURAL_TAG, "structures": [{"schema": CALL, "end": "</c>"}]}},
     "response_format.structures[0].begin", "is missing"),
    ({"response_format": {**STRUCTURAL_TAG, "structures": [
        {"begin": "<c>", "schema": "integer", "end": "</c>"}]}},
     "response_format.structures[0].schema", 'must be a JSON schema (an object), got "integer"'),
    ({"response_format": {**STRUCTURAL_TAG, "triggers": []}}, "response_format.triggers",
     "must be a non-empty list of strings"),
    ({"response_format": {**STRUCTURAL_TAG, "triggers": ["["]}},
     "response_format.structures[0].begin", 'starts with none of the triggers ["["]'),
    ({"response_format": {"type": "structural_tag", "format": {"type": "triggered_tags"}}},
     "response_format.format", "xgrammar's structural tag form"),
    ({"structured_outputs": {"structural_tag": json.dumps({**STRUCTURAL_TAG, "triggers": []})}},
     "structured_outputs.structural_tag.triggers", "must be a non-empty list of strings"),
])
def test_a_bad_constraint_is_named_by_the_field_it_was_sent_in(server, fields, param, problem):
    """The error's param and message name the field the client sent, never
    the engine's structured_outputs key it was mapped to."""
    body = {"model": "tiny", "max_tokens": 4, "prompt": "hi", **fields}
    error = _error(httpx.post(f"{server.url}/v1/completions", json=body, timeout=60))
    assert error["param"] == param, error
    assert problem in error["message"], error
    assert error["message"].startswith(param.rsplit(".", 1)[0]), error
    if not param.startswith("structured_outputs"):
        assert "structured_outputs" not in error["message"], error


@pytest.mark.parametrize("fields, message", [
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": {"type": "strnig"}}}},
     "invalid JSON schema"),
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": {"type": "string",
                                                                  "format": "no-such"}}}},
     "Unknown format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "needs \"json_schema\""),
    ({"response_format": {"type": "yaml"}}, "response_format type must be"),
    ({"guided_regex": "(unclosed"}, "invalid regex"),
    ({"guided_grammar": "start: nowhere"}, "invalid grammar"),
    ({"response_format": {**STRUCTURAL_TAG, "structures": [
        {"begin": "<c>", "schema": {"type": "strnig"}, "end": "</c>"}]}},
     "invalid structural tag"),
    ({"response_format": {**STRUCTURAL_TAG, "structures": [{"schema": CALL, "end": "</c>"}]}},
     "response_format.structures[0].begin is missing"),
    ({"response_format": {**STRUCTURAL_TAG, "triggers": []}},
     "response_format.triggers must be a non-empty list"),
    ({"guided_choice": []}, "must not be empty"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "exactly one of"),
    ({"structured_outputs": {"xml": "<a/>"}}, "unknown structured_outputs field"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}},
     "one structured-output constraint per request"),
])
@pytest.mark.parametrize("route", ["chat/completions", "completions"])
def test_bad_constraints_are_400(server, client, route, fields, message):
    body = {"model": "tiny", "max_tokens": 4, **fields}
    body.update({"messages": MESSAGES} if route.startswith("chat") else {"prompt": "hi"})
    error = _error(httpx.post(f"{server.url}/v1/{route}", json=body, timeout=60))
    assert message in error["message"]
    assert "Traceback" not in error["message"] and "\n" not in error["message"]
    # The server goes on serving, constrained requests too.
    resp = client.completions.create(model="tiny", prompt="hi", max_tokens=8, temperature=0,
                                     extra_body={"guided_choice": CHOICES})
    assert resp.choices[0].text in CHOICES


def _clamped_top(reference, prompt, k: int) -> tuple[str, list[list[float]]]:
    """The engine's greedy answer to ``prompt`` held to ``CHOICES``, and its
    tokens' top ``k`` logprobs in rank order, -inf shown as vLLM shows it."""
    out = reference.generate(prompt, SamplingParams(
        temperature=0.0, max_tokens=4, logprobs=k,
        structured_outputs=StructuredOutputsParams(choice=CHOICES)))[0].outputs[0]
    ranked = [sorted((e.rank, e.logprob) for e in step.values() if e.rank is not None)
              for step in out.logprobs]
    return out.text, [[max(logprob, -9999.0) for _, logprob in step][:k] for step in ranked]


def test_logprobs_of_tokens_a_constraint_masks_are_shown_as_vllm_clamps_them(
        server, client, reference):
    """A constraint masks most tokens (logprob -inf in the engine's
    answer); where such a token is among the top logprobs, the answer
    shows -9999.0 (JSON has no -inf; vLLM clamps so), every other value
    as the engine's, on completions and chat alike."""
    constraint = {"structured_outputs": {"choice": CHOICES}}
    text, want = _clamped_top(reference, "Pick:", 5)
    assert any(-9999.0 in step for step in want)  # masked tokens among the top
    resp = client.completions.create(model="tiny", prompt="Pick:", max_tokens=4, logprobs=5,
                                     temperature=0, extra_body=constraint)
    assert resp.choices[0].text == text
    assert [sorted(top.values(), reverse=True) for top in resp.choices[0].logprobs.top_logprobs] \
        == want
    text, want = _clamped_top(reference, {"prompt_token_ids": _chat_ids(server.model_dir)}, 5)
    chat = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4,
                                          logprobs=True, top_logprobs=5, temperature=0,
                                          extra_body=constraint)
    assert chat.choices[0].message.content == text
    assert [[t.logprob for t in e.top_logprobs] for e in chat.choices[0].logprobs.content] \
        == want
