"""Structured outputs after the reasoning, end to end: ``tprun serve
--reasoning-parser qwen3 --http-port`` of ``tiny`` with ``<think>`` and
``</think>`` tokens (``tests.helpers.think_model``), driven by the
official ``openai`` client. A ``logit_bias`` makes the random model write
``</think>`` at all; the grammar holds only after it, so the message's
``reasoning`` is free text and its ``content`` matches the constraint in
full (a regex, or a JSON schema it validates against). Where the output
begins after its reasoning (the template closed it, or qwen3's
``enable_thinking`` false over a template that opened it, which the server
tells the engine) the grammar holds from the first token."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from tests.helpers.http_utils import openai_client, serving_think_model
from tests.helpers.think_model import END_THINK

pytestmark = pytest.mark.timeout(300)

REGEX = "[0-9]{3}"
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                 "maximum": 99}},
          "required": ["n"], "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "Pick a number."}]
BIAS = {str(END_THINK): 6.0}  # </think> likely enough to come within the budget


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_think_model(tmp_path_factory.mktemp("reasoning"), "--reasoning-parser",
                             "qwen3") as served:
        yield served


@pytest.fixture(scope="module")
def client(server):
    with openai_client(server) as c:
        yield c


def _ask(server, kwargs=None, **fields) -> dict:
    extra = {"guided_regex": REGEX, **({"chat_template_kwargs": kwargs} if kwargs else {})}
    return {**dict(model=server.model_dir, messages=MESSAGES, temperature=1.0, seed=0, n=6,
                   max_tokens=48, logit_bias=BIAS, extra_body=extra), **fields}


def test_the_reasoning_is_free_and_the_content_after_it_matches(server, client):
    ask = _ask(server)
    whole = client.chat.completions.create(**ask)
    free = 0
    for choice in whole.choices:
        message = choice.message
        assert isinstance(message.reasoning, str)
        if message.content is None:  # cut, or ended, inside its reasoning
            continue
        assert re.fullmatch(REGEX, message.content), message
        assert choice.finish_reason == "stop"  # the grammar complete
        free += bool(re.search(r"[^0-9]", message.reasoning))
    assert free >= 2  # reasoning the regex would never have let through
    # Streamed: the same tokens (same seed), split the same way.
    streamed = {}
    for chunk in client.chat.completions.create(**ask, stream=True):
        for c in chunk.choices:
            got = streamed.setdefault(c.index, ["", ""])
            got[0] += getattr(c.delta, "reasoning", None) or ""
            got[1] += c.delta.content or ""
    assert [tuple(streamed[i]) for i in range(len(whole.choices))] == [
        (c.message.reasoning, c.message.content or "") for c in whole.choices]


def test_a_json_schema_holds_the_content_after_the_reasoning(server, client):
    ask = _ask(server, max_tokens=64)
    ask["extra_body"].pop("guided_regex")
    answer = client.chat.completions.create(**ask, response_format={
        "type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}})
    valid = 0
    for choice in answer.choices:
        if choice.message.content is None or choice.finish_reason == "length":
            continue
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
        valid += 1
    assert valid >= 2


@pytest.mark.parametrize("kwargs", [
    {"enable_thinking": False},  # Qwen3's template closes the thinking in the prompt
    # A template that opens it whatever enable_thinking says: qwen3's switch
    # still makes the output content, and the server tells the engine so.
    {"enable_thinking": False, "open_think": True},
])
def test_an_output_after_its_reasoning_matches_from_its_first_token(server, client, kwargs):
    answer = client.chat.completions.create(**_ask(server, kwargs))
    for choice in answer.choices:
        assert choice.message.reasoning is None
        assert re.fullmatch(REGEX, choice.message.content), choice.message
        assert choice.finish_reason == "stop"


def test_responses_text_format_holds_after_the_reasoning(server, client):
    texts = []
    for seed in range(4):
        response = client.responses.create(
            model=server.model_dir, input="Pick a number.", temperature=1.0,
            max_output_tokens=48, extra_body={"seed": seed, "logit_bias": BIAS,
                                              "structured_outputs": {"regex": REGEX}})
        kinds = [item.type for item in response.output]
        if kinds == ["reasoning", "message"]:
            texts.append(response.output_text)
    assert texts and all(re.fullmatch(REGEX, text) for text in texts)
