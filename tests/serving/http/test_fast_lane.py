"""``FastLane`` (serving/http/fast_lane.py): the bodies it accepts are the
ones FastAPI's route accepts, with equal values, and what it does not accept
reaches the FastAPI app unchanged.

The reference for "what FastAPI accepts" is what FastAPI's route does with
a JSON body: ``json_body.read_json`` of the bytes (the app's routes read
bodies with it), then the route's model validating the result
(``CompletionRequest``, ``ChatCompletionRequest``, ``ResponsesRequest``)."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import ValidationError
from starlette.responses import JSONResponse

from serving.http.fast_lane import FastLane, LaneRoute
from serving.http.guards import JsonContentType
from serving.http.json_body import read_json
from serving.http.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    IdsFirstCompletionRequest,
    ResponsesRequest,
)

IDS = list(range(512))

COMPLETION_BODIES = [
    {"prompt": IDS, "stream": True, "return_token_ids": True, "max_tokens": 16},
    {"prompt": "hello"},
    {"prompt": ""},
    {"prompt": []},
    {"prompt": ["a", "b"]},
    {"prompt": ["1", "2"]},  # texts, though each would pass as an int
    {"prompt": ["1", 2]},  # ids: only the id members take it (laxly)
    {"prompt": [1.0, 2.0]},
    {"prompt": [True, False]},
    {"prompt": [[1, 2], [3]]},
    {"prompt": [[1], []]},
    {"prompt": [[]]},
    {"prompt": [["1"], [2.0]]},
    {"prompt": [-(1 << 63), (1 << 63) - 1]},
    {"prompt": [1 << 63]},
    {"prompt": [[1 << 64]]},
    {"prompt": [1.5]},
    {"prompt": [1, "a"]},
    {"prompt": ["a", 1]},
    {"prompt": [[1], 2]},
    {"prompt": [[1], "a"]},
    {"prompt": [None]},
    {"prompt": [{"a": 1}]},
    {"prompt": 5},
    {"prompt": None},
    {"prompt": {}},
    {},
    {"prompt": [1], "temperature": 0, "top_p": "0.5", "max_tokens": 1e2, "seed": "7",
     "stream": "true", "ignore_eos": 1, "stop": ",", "logprobs": 3, "echo": False},
    {"prompt": [1], "stop": ["a", "b"], "stop_token_ids": [1, "2"], "n": 2, "best_of": 2},
    {"prompt": [1], "stream_options": {"include_usage": True}, "stream": True},
    {"prompt": [1], "response_format": {"type": "json_schema", "json_schema": {
        "schema": {"type": "object", "x": 1e400, "y": 123456789012345678901234567890,
                   "z": 0.1, "w": 2.2250738585072011e-308, "v": 5e-324}}}},
    {"prompt": [1], "guided_json": "{}", "guided_choice": ["a", "b"]},
    {"prompt": [1], "logprobs": 21},
    {"prompt": [1], "max_tokens": "many"},
    {"prompt": [1], "unknown_field": [1, 2, 3], "user": "me"},
    {"prompt": "héllo ☃ \u2028 \\ \" \t"},
]

RAW_COMPLETION_BODIES = [
    b'{"prompt": [1], "prompt": "x"}',  # a repeated key: the last one counts
    b'{"prompt": "x", "prompt": [1, 2]}',
    b'{"prompt": [1], "temperature": NaN}',
    b'{"prompt": [1], "temperature": Infinity}',
    b'{"prompt": [1], "temperature": -Infinity}',
    b'{"prompt": [1], "temperature": 1e400}',
    b'{"prompt": [1], "temperature": 1.7976931348623157e308}',
    b'{"prompt": "\\ud800"}',
    b'{"prompt": "\\ud83d\\ude00"}',
    b'{"prompt": "\xff"}',
    b'{"prompt": "\xc3\xa9"}',
    b'\xef\xbb\xbf{"prompt": [1]}',
    b'  {"prompt": [1]}  \n',
    b'{"prompt": [1]} x',
    b'{"prompt": [1],}',
    b'{"prompt": [01]}',
    b'{"prompt": [1e0]}',
    b'{"prompt": [-0]}',
    b'[{"prompt": [1]}]',
    b'"x"',
    b'',
    b'{',
]

CHAT_BODIES = [
    {"messages": [{"role": "user", "content": "hi"}], "stream": True},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
    {"messages": [{"role": "user", "content": None, "name": "x"}], "top_logprobs": 2,
     "logprobs": True},
    {"messages": []},
    {"messages": [{"content": "no role"}]},
    {"messages": "hi"},
    {"messages": [{"role": "user", "content": 5}]},
    {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}],
     "chat_template_kwargs": {"enable_thinking": False}, "max_completion_tokens": 3},
]

RESPONSES_BODIES = [
    {"input": "hi", "stream": True, "max_output_tokens": 3},
    {"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
     "instructions": "Be brief.", "text": {"format": {"type": "json_object"}}},
    {"input": [{"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                "content": [{"type": "output_text", "text": "a", "annotations": []}]}],
     "metadata": {"k": "v"}, "store": False, "previous_response_id": "resp_1"},
    {"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]},
    {"input": 5},
    {"input": [{"role": "user", "content": 5}]},
    {"input": "hi", "metadata": {"k": 1}},
    {},
]


def _bodies(dicts, raws=()):
    return [json.dumps(d).encode() for d in dicts] + list(raws)


def _fastapi(model, body: bytes):
    """What FastAPI's route makes of a JSON body: the request, or None (an
    error response)."""
    try:
        return model.model_validate(read_json(body))
    except (ValueError, ValidationError):
        return None


def _lane(model, body: bytes):
    try:
        return model.model_validate_json(body)
    except ValidationError:
        return None


def _same(a, b) -> bool:
    """Equal requests, down to the types of the prompt's items (``[1]`` is
    ids, ``["1"]`` a text) and NaN equal to NaN."""
    def canonical(request):
        dumped = request.model_dump()
        return json.dumps(dumped, sort_keys=True), repr(dumped)
    return canonical(a) == canonical(b)


@pytest.mark.parametrize("route_model, lane_model, bodies", [
    (CompletionRequest, IdsFirstCompletionRequest,
     _bodies(COMPLETION_BODIES, RAW_COMPLETION_BODIES)),
    (ChatCompletionRequest, ChatCompletionRequest, _bodies(CHAT_BODIES)),
    (ResponsesRequest, ResponsesRequest, _bodies(RESPONSES_BODIES)),
])
def test_the_lane_accepts_what_fastapi_accepts_with_equal_values(route_model, lane_model,
                                                                 bodies):
    accepted = 0
    for body in bodies:
        by_lane = _lane(lane_model, body)
        if by_lane is None:
            continue  # FastAPI answers it, whatever it is
        by_route = _fastapi(route_model, body)
        assert by_route is not None, body
        assert _same(by_lane, by_route), body
        accepted += 1
    # The corpus must exercise both sides, accepted and refused.
    assert 0 < accepted < len(bodies)


def test_the_lane_takes_every_valid_id_text_and_nested_prompt():
    """No valid body of the corpus is left to FastAPI only for the lane's
    sake (a leading BOM aside, which the route skips and the lane refuses)."""
    for fields in COMPLETION_BODIES:
        body = json.dumps(fields).encode()
        if _fastapi(CompletionRequest, body) is not None:
            assert _lane(IdsFirstCompletionRequest, body) is not None, fields


class _Recorder:
    """An ASGI app that records what reaches it and reads the whole body."""

    def __init__(self) -> None:
        self.calls = []

    async def __call__(self, scope, receive, send) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        self.calls.append((scope["method"], scope["path"], body))
        response = JSONResponse({"by": "app"})
        await response(scope, receive, send)


def _drive(app, method: str, path: str, chunks: list[bytes], headers=None):
    """Call ``app`` with a request whose body comes in ``chunks``; the
    response's status and body."""
    headers = [(b"content-type", b"application/json")] if headers is None else headers
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
             "http_version": "1.1", "method": method, "scheme": "http", "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": headers, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
    pending = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
               for i, c in enumerate(chunks)]
    sent = []

    async def receive():
        if pending:
            return pending.pop(0)
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    asyncio.run(asyncio.wait_for(app(scope, receive, send), 10))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body)


def _lane_app():
    handled = []

    async def handler(request, raw):
        handled.append(request)
        return JSONResponse({"by": "lane", "prompt": request.prompt})

    recorder = _Recorder()
    lane = FastLane(recorder, {"/v1/completions": LaneRoute(IdsFirstCompletionRequest,
                                                           handler)})
    return lane, recorder, handled


def test_a_valid_body_is_answered_by_the_lane_even_in_pieces():
    lane, recorder, handled = _lane_app()
    body = json.dumps({"prompt": IDS}).encode()
    status, answer = _drive(lane, "POST", "/v1/completions", [body[:100], body[100:]])
    assert (status, answer) == (200, {"by": "lane", "prompt": IDS})
    assert recorder.calls == [] and isinstance(handled[0], CompletionRequest)


@pytest.mark.parametrize("method, path, chunks, headers", [
    ("POST", "/v1/completions", [b'{"prompt": 5}'], None),  # invalid: FastAPI's error
    ("POST", "/v1/completions", [b'{"prompt": ', b"[1, 2"], None),  # broken JSON
    ("POST", "/v1/completions", [b'{"prompt": [1]}'], [(b"content-type", b"text/plain")]),
    ("POST", "/v1/completions/", [b'{"prompt": [1]}'], None),
    ("POST", "/tokenize", [b'{"prompt": "x"}'], None),
    ("GET", "/v1/completions", [b""], None),
])
def test_anything_else_reaches_the_app_with_its_body(method, path, chunks, headers):
    lane, recorder, handled = _lane_app()
    status, answer = _drive(lane, method, path, chunks, headers)
    assert (status, answer) == (200, {"by": "app"})
    assert recorder.calls == [(method, path, b"".join(chunks))] and handled == []


@pytest.mark.parametrize("content_type", [b"application/json", b"Application/JSON",
                                          b"application/json; charset=utf-8",
                                          b"application/vnd.api+json", None])
def test_json_content_types_take_the_lane(content_type):
    lane, recorder, handled = _lane_app()
    headers = [] if content_type is None else [(b"content-type", content_type)]
    status, answer = _drive(lane, "POST", "/v1/completions", [b'{"prompt": [1]}'], headers)
    assert answer["by"] == "lane" and len(handled) == 1


@pytest.mark.parametrize("content_type, refused", [
    (b"text/plain", True),
    (b"application/x-www-form-urlencoded", True),
    (b"multipart/form-data; boundary=x", True),
    (b"json", True),
    (b"", True),
    (b"application/json", False),
    (b" application/JSON ; charset=utf-8", False),
    (b"application/problem+json", False),
    (None, False),  # FastAPI reads a body without a Content-Type as JSON
])
def test_a_body_route_refuses_a_media_type_other_than_json_with_415(content_type, refused):
    recorder = _Recorder()
    guard = JsonContentType(recorder, frozenset({"/v1/completions"}))
    headers = [] if content_type is None else [(b"content-type", content_type)]
    status, answer = _drive(guard, "POST", "/v1/completions", [b'{"prompt": [1]}'], headers)
    if refused:
        assert status == 415 and recorder.calls == []
        assert answer["error"]["code"] == "unsupported_media_type"
        assert set(answer["error"]) == {"message", "type", "param", "code"}
        assert repr(content_type.decode()) in answer["error"]["message"]
    else:
        assert (status, answer) == (200, {"by": "app"})
        assert recorder.calls == [("POST", "/v1/completions", b'{"prompt": [1]}')]


def test_other_routes_and_methods_pass_the_media_type_guard():
    recorder = _Recorder()
    guard = JsonContentType(recorder, frozenset({"/v1/completions"}))
    text = [(b"content-type", b"text/plain")]
    for method, path in [("POST", "/v1/other"), ("GET", "/v1/completions")]:
        assert _drive(guard, method, path, [b"x"], text) == (200, {"by": "app"})
    assert [call[:2] for call in recorder.calls] == [("POST", "/v1/other"),
                                                      ("GET", "/v1/completions")]
