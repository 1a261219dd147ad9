"""Whose error is it: an ``InvalidRequestError`` from any layer is the
client's (400 with its message), any other exception the server's own (500
``server_error``, logged with its traceback, its text not sent), a plain
``ValueError`` of an internal bug included; the server goes on serving
after either (``serving/http/errors.py``).

In process (``create_app`` over a scripted engine link, driven by the
official ``openai`` client through starlette's test transport), what no
request can cause: an internal bug, made here by taking away the clamp
that shows a masked token's -inf logprob as -9999.0 (``logprobs.shown``),
so the answer's JSON holds -inf, which the encoder refuses with a
``ValueError`` ("Out of range float values"); a bug in the middle of a
stream; the engine's refusals, which say whether the request was at fault
(``RequestError.invalid_request``); a choice the engine ends with finish
reason "error", which vLLM's server answers as its own failure: a 500 on
every route, an error event that ends a stream, a background response
stored "failed".

Over a real ``tprun serve`` (tiny, CPU): one request for each layer that
checks what a request asks, each a 400 with that layer's message through
the ``openai`` client, and an ordinary answer after them; the refusals
only the engine makes, with the field they blame as ``param``; requests
whose grammar refuses the token sampled (finish reason "error"), whole and
streamed.
"""

from __future__ import annotations

import itertools
import json
import logging
import time

import httpx
import openai
import pytest
from starlette.testclient import TestClient

from checkpoint.tokenizer import Tokenizer
from ipc.engine_messages import Delta, RequestAccepted, RequestError, TokenLogprob
from serving.http import logprobs
from serving.http.app import create_app
from tests.helpers.http_utils import openai_client, serving_tiny

pytestmark = pytest.mark.timeout(180)

MESSAGES = [{"role": "user", "content": "Hi"}]
SERVER_FAILURE = "the server failed to handle this request"
# The one token the scripted engine answers, and its top logprobs: itself,
# then a token a constraint masked (-inf).
TOKEN = 72  # "H" in tiny's byte-level vocabulary
TOP = [TokenLogprob(TOKEN, -0.25, 1), TokenLogprob(73, float("-inf"), 2)]


class _ScriptedLink:
    """An engine link that accepts every request and finishes it with the
    one token ``TOKEN`` and its ``TOP`` logprobs, or, while ``refusal``
    holds a ``RequestError``'s fields, refuses it so; with ``ends_in_error``
    the token comes unfinished and a last delta ends the request with
    finish reason "error", as the engine ends one whose grammar refused
    the token sampled."""

    def __init__(self) -> None:
        self.ids = itertools.count()
        self.refusal: dict | None = None
        self.ends_in_error = False

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def new_id(self) -> str:
        return f"req-{next(self.ids)}"

    def submit(self, request_id, prompt_token_ids, params, queue, priority=0,
               enable_thinking=True, cache_salt=None, lora_request=None) -> None:
        if self.refusal is not None:
            queue.put_nowait(RequestError(request_id=request_id, **self.refusal))
            return
        queue.put_nowait(RequestAccepted(request_id=request_id,
                                         prompt_token_ids=list(prompt_token_ids)))
        queue.put_nowait(Delta(request_id=request_id, token_ids=[TOKEN], text="H",
                               finished=not self.ends_in_error,
                               finish_reason=None if self.ends_in_error else "length",
                               logprobs=[TOP]))
        if self.ends_in_error:
            queue.put_nowait(Delta(request_id=request_id, token_ids=[], text="",
                                   finished=True, finish_reason="error"))

    def abort(self, request_id: str) -> None:
        pass

    forget = abort


@pytest.fixture
def scripted(tiny_dir):
    """(link, openai client) of an app in process over a ``_ScriptedLink``
    (with the Responses API's store, for background responses)."""
    link = _ScriptedLink()
    app = create_app(link, Tokenizer.from_dir(tiny_dir), ["tiny"], 4096,
                     enable_responses_api_store=True)
    with TestClient(app) as http:
        yield link, openai.OpenAI(base_url="http://testserver/v1", api_key="none",
                                  max_retries=0, http_client=http)


def _failures(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == "a request failed inside the server"]


def _answered_normally(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1,
                                            logprobs=True, top_logprobs=2)
    assert answer.choices[0].message.content == "H"
    top = answer.choices[0].logprobs.content[0].top_logprobs
    assert [entry.logprob for entry in top] == [-0.25, -9999.0]


def test_an_internal_value_error_is_a_logged_500_and_the_server_goes_on(
        scripted, monkeypatch, caplog):
    link, client = scripted
    _answered_normally(client)
    monkeypatch.setattr(logprobs, "shown", lambda logprob: logprob)  # the bug: -inf unclamped
    with caplog.at_level(logging.ERROR), pytest.raises(openai.InternalServerError) as raised:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1,
                                       logprobs=True, top_logprobs=2)
    assert raised.value.status_code == 500 and raised.value.type == "server_error"
    assert raised.value.body["message"] == SERVER_FAILURE  # the bug's text is not sent
    [failure] = _failures(caplog)
    error = failure.exc_info[1]
    assert type(error) is ValueError and "Out of range float values" in str(error)
    answer = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1)
    assert answer.choices[0].message.content == "H"
    monkeypatch.undo()
    _answered_normally(client)


def _broken(logprob: float) -> float:
    raise ValueError("an internal bug")


def test_an_internal_value_error_mid_stream_ends_it_with_a_server_error_event(
        scripted, monkeypatch, caplog):
    link, client = scripted
    monkeypatch.setattr(logprobs, "shown", _broken)
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1,
                                            logprobs=True, top_logprobs=2, stream=True)
    with caplog.at_level(logging.ERROR), pytest.raises(openai.APIError) as raised:
        for _ in stream:
            pass
    assert raised.value.type == "server_error" and raised.value.message == SERVER_FAILURE
    [failure] = _failures(caplog)
    assert str(failure.exc_info[1]) == "an internal bug"
    monkeypatch.undo()
    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1,
                                                 stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "H"


def test_an_internal_value_error_mid_response_stream_ends_it_with_its_error_event(
        scripted, monkeypatch, caplog):
    link, client = scripted
    monkeypatch.setattr(logprobs, "shown", _broken)
    with caplog.at_level(logging.ERROR):
        events = list(client.responses.create(model="tiny", input="Hi", max_output_tokens=1,
                                              include=["message.output_text.logprobs"],
                                              top_logprobs=2, stream=True))
    assert events[0].type == "response.created"
    assert (events[-1].type, events[-1].code, events[-1].message) == \
        ("error", "server_error", SERVER_FAILURE)
    [failure] = _failures(caplog)
    assert str(failure.exc_info[1]) == "an internal bug"
    monkeypatch.undo()
    assert client.responses.create(model="tiny", input="Hi", max_output_tokens=1) \
        .output_text == "H"


def test_a_refusal_is_the_clients_error_only_when_the_engine_says_so(scripted, caplog):
    link, client = scripted
    link.refusal = {"error": "prompt (3 tokens) + max_tokens (9000) exceeds max_model_len",
                    "code": "context_length_exceeded", "invalid_request": True}
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=9000)
    assert raised.value.body["message"] == link.refusal["error"]
    assert raised.value.code == "context_length_exceeded"
    link.refusal = {"error": "the engine failed to make it: KeyError: 'slot'"}
    with caplog.at_level(logging.ERROR), pytest.raises(openai.InternalServerError) as raised:
        client.completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=2)
    assert raised.value.body["message"] == SERVER_FAILURE
    assert raised.value.type == "server_error"
    [failure] = _failures(caplog)
    assert "KeyError: 'slot'" in str(failure.exc_info[1])
    link.refusal = None
    assert client.completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=1) \
        .choices[0].text == "H"


GENERATION_FAILURE = 'the engine failed to generate this response: a choice ended with ' \
                     'finish reason "error"'


def _generation_failure_logged(caplog) -> bool:
    """One line for the choice that ended in "error", no traceback of a
    failure inside the server."""
    lines = [r for r in caplog.records if 'with finish reason "error"' in r.getMessage()]
    return len(lines) == 1 and lines[0].exc_info is None and not _failures(caplog)


WHOLE_ANSWERS = [  # vLLM's rule for a finish reason "error": a 500, never the choice
    ("chat", lambda c: c.chat.completions.create(model="tiny", messages=MESSAGES,
                                                 max_tokens=4)),
    ("completions", lambda c: c.completions.create(model="tiny", prompt="Hi", max_tokens=4)),
    ("responses", lambda c: c.responses.create(model="tiny", input="Hi", max_output_tokens=4)),
]


@pytest.mark.parametrize("route, call", WHOLE_ANSWERS, ids=[case[0] for case in WHOLE_ANSWERS])
def test_a_choice_ended_with_error_is_a_500_not_an_answer(scripted, caplog, route, call):
    link, client = scripted
    link.ends_in_error = True
    with caplog.at_level(logging.ERROR), pytest.raises(openai.InternalServerError) as raised:
        call(client)
    assert raised.value.status_code == 500
    assert raised.value.body == {"message": GENERATION_FAILURE, "type": "server_error",
                                 "param": None, "code": 500}
    assert _generation_failure_logged(caplog)
    link.ends_in_error = False
    _answered_normally(client)


def test_a_response_stream_whose_choice_ends_with_error_ends_with_an_error_event(scripted,
                                                                                 caplog):
    """As vLLM's: the text already streamed, then an error event in place
    of the closing events; no ``response.completed``."""
    link, client = scripted
    link.ends_in_error = True
    with caplog.at_level(logging.ERROR):
        events = list(client.responses.create(model="tiny", input="Hi", max_output_tokens=4,
                                              stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert [e.delta for e in events if e.type == "response.output_text.delta"] == ["H"]
    assert "response.completed" not in kinds and "response.output_text.done" not in kinds
    assert (events[-1].type, events[-1].code, events[-1].message) == \
        ("error", "server_error", GENERATION_FAILURE)
    assert _generation_failure_logged(caplog)


@pytest.mark.parametrize("stream", [False, True])
def test_a_background_response_whose_choice_ends_with_error_is_stored_failed(scripted, stream):
    link, client = scripted
    link.ends_in_error = True
    if stream:
        events = list(client.responses.create(model="tiny", input="Hi", max_output_tokens=4,
                                              background=True, stream=True))
        response_id = events[0].response.id
        assert events[-1].type == "error"
    else:
        response_id = client.responses.create(model="tiny", input="Hi", max_output_tokens=4,
                                              background=True).id
    deadline = time.monotonic() + 30
    while (stored := client.responses.retrieve(response_id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert stored.status == "failed"
    assert (stored.error.code, stored.error.message) == ("server_error", GENERATION_FAILURE)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_tiny(tmp_path_factory.mktemp("error-split"), "--nproc-per-node", "1", "serve",
                      "--model", "tiny", "--device", "cpu", "--disable-log-stats") as served:
        yield served


@pytest.fixture(scope="module")
def client(server):
    with openai_client(server) as c:
        yield c


BAD_REQUESTS = [  # (layer, call, message, code)
    ("sampling parameters",
     lambda c: c.completions.create(model="tiny", prompt="hi", max_tokens=2, temperature=-1),
     "temperature must be >= 0", None),
    ("the engine's context rule",
     lambda c: c.completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=5000),
     "exceeds max_model_len 4096", "context_length_exceeded"),
    ("the engine's grammar compile",
     lambda c: c.completions.create(model="tiny", prompt="hi", max_tokens=2,
                                    extra_body={"guided_regex": "(unclosed"}),
     "invalid regex", None),
    ("the chat template",
     lambda c: c.chat.completions.create(model="tiny", max_tokens=2,
                                         messages=[{"role": "robot", "content": "hi"}]),
     "unknown role: robot", None),
    ("a chat message's content",
     lambda c: c.chat.completions.create(model="tiny", max_tokens=2, messages=[
         {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
     "only text content parts are supported", None),
    ("the Responses input",
     lambda c: c.responses.create(model="tiny", max_output_tokens=2,
                                  input=[{"role": "tool", "content": "x"}]),
     "input.0.role must be one of", None),
    ("the engine's scheduling policy",
     lambda c: c.completions.create(model="tiny", prompt="hi", max_tokens=2,
                                    extra_body={"priority": 2}),
     "needs the 'priority' scheduling policy", None),
]


ENGINE_CONTEXT_REFUSALS = [  # (prompt token ids, max_tokens, the field the engine blames)
    ([1, 2, 3], 5000, "max_tokens"),  # 3 + 5000 past max_model_len 4096
    ([1] * 4096, None, "prompt"),  # no max_tokens: the prompt alone leaves no room
]


@pytest.mark.parametrize("prompt, max_tokens, param", ENGINE_CONTEXT_REFUSALS,
                         ids=[case[2] for case in ENGINE_CONTEXT_REFUSALS])
def test_the_engines_refusal_keeps_the_field_it_blames(server, prompt, max_tokens, param):
    """A completion's context is checked by the engine alone (no HTTP layer
    looks first): its refusal crosses the engine's IPC with the field it
    blames, and the 400's OpenAI error names it as ``param``."""
    response = httpx.post(f"{server.url}/v1/completions", timeout=60, json={
        "model": "tiny", "prompt": prompt, "max_tokens": max_tokens})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error", "context_length_exceeded", param)
    assert "max_model_len 4096" in error["message"]


@pytest.mark.parametrize("layer, call, message, code", BAD_REQUESTS,
                         ids=[case[0] for case in BAD_REQUESTS])
def test_each_layers_refusal_is_a_400_with_its_message(server, client, layer, call, message,
                                                       code):
    with pytest.raises(openai.BadRequestError) as raised:
        call(client)
    assert message in raised.value.message and raised.value.code == code
    answer = client.completions.create(model="tiny", prompt="hi", max_tokens=2, temperature=0)
    assert answer.choices[0].finish_reason == "length"
    assert "a request failed inside the server" not in server.output()


# A constraint whose every answer starts with "y", then a mask that leaves it
# no token after that (tests/engine/test_structured_outputs.py): the engine
# ends the request with finish reason "error" after the one token "y".
MASKED = {"temperature": 0, "max_tokens": 8, "bad_words": ["e", "a"],
          "structured_outputs": {"choice": ["yes", "yak"]}}
ROUTES = [("chat/completions", {"messages": MESSAGES}), ("completions", {"prompt": "Pick:"})]


@pytest.mark.parametrize("route, body", ROUTES, ids=[case[0] for case in ROUTES])
def test_a_grammar_that_refuses_the_token_sampled_is_a_500(server, route, body):
    response = httpx.post(f"{server.url}/v1/{route}", timeout=60,
                          json={"model": "tiny", **body, **MASKED})
    assert response.status_code == 500
    assert response.json() == {"error": {"message": GENERATION_FAILURE, "type": "server_error",
                                         "param": None, "code": 500}}
    assert "a request failed inside the server" not in server.output()


@pytest.mark.parametrize("route, body", ROUTES, ids=[case[0] for case in ROUTES])
def test_a_stream_whose_grammar_refuses_the_token_sampled_ends_with_an_error_event(
        server, client, route, body):
    """vLLM's stream: the text already sent ("y"), then an error event
    where the finishing chunk would be, then [DONE]; no chunk carries the
    finish reason "error"."""
    with httpx.stream("POST", f"{server.url}/v1/{route}", timeout=60,
                      json={"model": "tiny", **body, **MASKED, "stream": True}) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[len("data: "):]) for line in lines[:-1]]
    assert events[-1] == {"error": {"message": GENERATION_FAILURE, "type": "server_error",
                                    "param": None, "code": 500}}
    choices = [c for e in events[:-1] for c in e["choices"]]
    assert "".join(c.get("text") or c.get("delta", {}).get("content") or ""
                   for c in choices) == "y"
    assert all(c["finish_reason"] is None for c in choices)
    answer = client.completions.create(model="tiny", prompt="hi", max_tokens=2, temperature=0)
    assert answer.choices[0].finish_reason == "length"
