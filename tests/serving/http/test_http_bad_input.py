"""Bad input over HTTP: every malformed or hostile body is a 4xx in OpenAI's
error shape (400 for a bad value, 404 for a model not served), never a 500
or a hang, and the engine keeps serving: its greedy answers after the
abuse are the ones it gave before.

One ``tprun serve --http-port`` (TP=1, tiny, CPU) serves the module, with
``--max-model-len 64`` so that a random body that happens to be valid cannot
ask for a long generation. The property test mutates valid bodies of the
four body routes (fields replaced by random JSON: wrong types, nested
values, huge and negative numbers, NaN and infinities, empty and long
strings, lone surrogates, null bytes); the others pin down single rules,
each where it is kept:

- a lone surrogate (``"\\ud800"``, or its UTF-8 bytes) is a malformed
  body, on every route (``serving/http/json_body.py``), never a string
  that reaches the tokenizer or an error message;
- ``logit_bias`` keys are ASCII decimal ids ("1_0" and other scripts'
  digits are refused) and a NaN bias is refused, not clamped to a ban;
- ``response_format``'s ``schema`` null or false is named where the
  client sent it;
- a regex ending in a lone backslash is refused (llguidance would drop it
  and compile the rest);
- a chat's beam search takes no max_tokens below 1;
- one rule (``SamplingFields.asks_for``) says which fields a request sets,
  for the fields this server does not implement and those beam search
  does not take alike;
- a bad value in a union field (``prompt``, ``stop``, a message's
  ``content``, ``tool_choice``) is named where the member that got
  furthest failed, with what the union accepts, alike on every route
  (``serving/http/validation_errors.py``).
"""

from __future__ import annotations

import copy
import json
import math
import re
import types
import typing

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter, ValidationError

from engine.structured_outputs.backend import GrammarError, GuidanceBackend
from engine.structured_outputs.params import GrammarKey
from serving.http.beam_search import check_beam_fields
from serving.http.json_body import read_json
from serving.http.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    FieldError,
    IdsFirstCompletionRequest,
    ResponsesRequest,
    TokenizeRequest,
)
from serving.http.structured import structured_outputs_of
from serving.http.validation_errors import read_location
from tests.helpers.http_utils import serving_tiny

COMPLETION = {"model": "tiny", "prompt": "Hello", "max_tokens": 2, "temperature": 0}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2,
        "temperature": 0}
ROUTES = {
    "/v1/completions": (COMPLETION, CompletionRequest),
    "/v1/chat/completions": (CHAT, ChatCompletionRequest),
    "/tokenize": ({"model": "tiny", "prompt": "Hello"}, TokenizeRequest),
    "/detokenize": ({"model": "tiny", "tokens": [72, 105]}, DetokenizeRequest),
}
SERVER_FAILURE = "a request failed inside the server"  # app.py logs each 500 so


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_tiny(tmp_path_factory.mktemp("bad-input"), "--nproc-per-node", "1", "serve",
                      "--model", "tiny", "--device", "cpu", "--max-model-len", "64",
                      "--disable-log-stats") as served:
        yield served


@pytest.fixture(scope="module")
def reference(server) -> dict:
    """The greedy answers of the valid bodies, before any bad input."""
    return {path: _answer(server, path, COMPLETION if path == "/v1/completions" else CHAT)
            for path in ("/v1/completions", "/v1/chat/completions")}


def _answer(server, path: str, body: dict) -> object:
    response = httpx.post(f"{server.url}{path}", json=body, timeout=30)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    return choice.get("text", choice.get("message"))


def _post(server, path: str, content: bytes) -> httpx.Response:
    """POST raw bytes as JSON; a hang fails the test (httpx's timeout)."""
    return httpx.post(f"{server.url}{path}", content=content, timeout=30,
                      headers={"Content-Type": "application/json"})


def _error(response: httpx.Response, status: int) -> dict:
    """The error of an answer in OpenAI's shape, after checking its status."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert "Traceback" not in error["message"], error
    return error


def _still_serving(server, reference: dict) -> None:
    """The engine answers as it did before, and no request failed inside the server."""
    for path, want in reference.items():
        body = COMPLETION if path == "/v1/completions" else CHAT
        assert _answer(server, path, body) == want
    assert SERVER_FAILURE not in server.output()


# ---- the property test -----------------------------------------------------------
SURROGATE = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
TEXTS = (st.text(st.characters() | SURROGATE, min_size=1, max_size=8)
         | st.sampled_from(["", "\x00", "\ud800", "tiny", "x" * 20_000]))
NUMBERS = (st.integers(-3, 3) | st.floats()
           | st.sampled_from([10**30, -(10**30), 2**63, 2**64, -(2**63) - 1, 319, 320]))
VALUES = st.recursive(st.none() | st.booleans() | NUMBERS | TEXTS,
                      lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(TEXTS, inner, max_size=3),
                      max_leaves=8)
READ = {"/v1/completions": "prompt", "/v1/chat/completions": "messages", "/tokenize": "prompt",
        "/detokenize": "tokens"}
# Places below a field that only a value of the right shape reaches: the
# field's value built around the random one.
NESTED = {
    "messages": lambda v: [{"role": "user", "content": v}],
    "tools": lambda v: [{"type": "function", "function": {"name": "f", "parameters": v}}],
    "response_format": lambda v: {"type": "json_schema", "json_schema": {"name": "x",
                                                                         "schema": v}},
    "structured_outputs": lambda v: {"regex": v},
}


@st.composite
def mutated_bodies(draw) -> tuple[str, object]:
    """A route and a body: one of the route's valid bodies with up to 3 of
    its model's fields (or an unknown one) and, every other time, the field
    every route reads (``READ``) set to random JSON, maybe inside the
    field's shape; now and then a random JSON value as the whole body."""
    path = draw(st.sampled_from(sorted(ROUTES)))
    base, model = ROUTES[path]
    if draw(st.integers(0, 9)) == 0:
        return path, draw(VALUES)
    body = copy.deepcopy(base)
    fields = st.sampled_from([*sorted(model.model_fields), "unknown_field"])
    names = draw(st.lists(fields, max_size=3))
    if not names or draw(st.booleans()):
        names.append(READ[path])
    for name in names:
        value = draw(st.one_of(TEXTS, TEXTS, NUMBERS, VALUES))  # scalars, texts first
        wrap = NESTED.get(name)
        body[name] = wrap(value) if wrap is not None and draw(st.booleans()) else value
    return path, body


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_mutated_bodies_are_answered_4xx_in_openai_shape_never_500(server, reference):
    statuses = []

    @settings(max_examples=200, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(mutated_bodies())
    def check(case):
        path, body = case
        response = _post(server, path, json.dumps(body).encode())
        statuses.append(response.status_code)
        if response.status_code != 200:
            assert response.status_code in (400, 404), (body, response.text)
            _error(response, response.status_code)

    check()
    assert 200 in statuses and 400 in statuses  # both sides of the checks were reached
    _still_serving(server, reference)


# ---- the defects it found --------------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("path, content", [
    ("/v1/completions", b'{"prompt": "\\ud800", "max_tokens": 2}'),
    ("/v1/completions", b'{"prompt": ["a", "b\\udfff"], "max_tokens": 2}'),
    ("/v1/completions", b'{"prompt": "\xed\xa0\x80", "max_tokens": 2}'),  # encoded
    ("/v1/completions", b'{"prompt": "hi", "stop": ["\\ud800"], "max_tokens": 2}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud800"}]}'),
    ("/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc00"}]}]}'),
    # An error message quoting the role could not be written as UTF-8.
    ("/v1/chat/completions", b'{"messages": [{"role": "\\ud800", "content": "hi"}]}'),
    ("/tokenize", b'{"prompt": "\\ud800"}'),
    ("/tokenize", b'{"messages": [{"role": "user", "content": "\\ud800"}]}'),
])
def test_a_lone_surrogate_is_a_malformed_body_on_every_route(server, reference, path, content):
    error = _error(_post(server, path, content), 400)
    assert error["message"].startswith("the body is not valid JSON ("), error
    assert error["param"] is None
    _still_serving(server, reference)


@pytest.mark.timeout(60)
def test_valid_unicode_a_pair_of_surrogates_and_a_bom_are_still_served(server):
    pair = _post(server, "/tokenize", b'{"prompt": "\\ud83d\\ude00", "add_special_tokens": false}')
    assert pair.status_code == 200 and pair.json()["count"] == 4  # one emoji, four bytes
    with_bom = _post(server, "/v1/completions",
                     b'\xef\xbb\xbf{"prompt": "hi", "max_tokens": 2, "temperature": 0}')
    assert with_bom.status_code == 200, with_bom.text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bias, message", [
    ({"1_0": 5}, "logit_bias keys must be token ids, got '1_0'"),
    ({"\u0663": 5}, "logit_bias keys must be token ids"),  # an Arabic-Indic 3
    ({" 1 ": 5}, "logit_bias keys must be token ids"),
    ({"1": float("nan")}, "logit_bias values must be numbers, got NaN for '1'"),
])
def test_logit_bias_keys_are_decimal_ids_and_biases_numbers(server, bias, message):
    for path, base in (("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)):
        body = json.dumps({**base, "logit_bias": bias}).encode()  # NaN as JSON's NaN token
        error = _error(_post(server, path, body), 400)
        assert error["message"] == message or error["message"].startswith(message), error
        assert error["param"] == "logit_bias"


@pytest.mark.timeout(60)
def test_an_infinite_bias_is_clamped_as_openai_clamps():
    request = CompletionRequest(prompt="x", logit_bias={"5": math.inf, "6": -1e300})
    assert request.token_biases() == {5: 100.0, 6: -100.0}
    with pytest.raises(FieldError, match="must be token ids"):
        CompletionRequest(prompt="x", logit_bias={"+5": 1}).token_biases()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("schema", [None, False])
def test_a_null_or_false_schema_is_named_where_the_client_sent_it(server, schema):
    body = {**CHAT, "response_format": {"type": "json_schema",
                                        "json_schema": {"name": "x", "schema": schema}}}
    error = _error(_post(server, "/v1/chat/completions", json.dumps(body).encode()), 400)
    assert error["param"] == "response_format.json_schema.schema", error
    assert "must be a JSON schema" in error["message"] and "structured_outputs" not in \
        error["message"]
    request = ChatCompletionRequest.model_validate(body)
    with pytest.raises(FieldError):
        structured_outputs_of(request)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("as_text", [False, True])
def test_a_schema_nested_past_the_depth_limit_is_named_where_sent(server, reference, as_text):
    """150 levels (the body itself may nest 200): past the 124 the grammar
    backend reads, refused with the limit, naming the field sent, and the
    server answers after it."""
    schema: dict = {"type": "integer"}
    for _ in range(149):
        schema = {"type": "array", "items": schema}
    fields = ({"guided_json": json.dumps(schema)} if as_text else
              {"response_format": {"type": "json_schema",
                                   "json_schema": {"name": "x", "schema": schema}}})
    error = _error(_post(server, "/v1/chat/completions",
                         json.dumps({**CHAT, **fields}).encode()), 400)
    assert error["param"] == ("guided_json" if as_text else
                              "response_format.json_schema.schema"), error
    assert "nests objects and arrays more than 124 levels deep" in error["message"], error
    _still_serving(server, reference)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("field, value", [
    ("guided_regex", "\\"),
    ("guided_regex", "a\\\\\\"),  # a\\\ : an escaped backslash, then a lone one
    ("structured_outputs", {"regex": "[0-9]+\\"}),
])
def test_a_regex_ending_in_a_lone_backslash_is_refused(server, reference, field, value):
    body = json.dumps({**COMPLETION, field: value}).encode()
    error = _error(_post(server, "/v1/completions", body), 400)
    assert "invalid regex: it ends in an incomplete escape" in error["message"], error
    _still_serving(server, reference)


@pytest.mark.timeout(60)
def test_an_escaped_backslash_at_a_regex_end_is_served(server):
    body = {**COMPLETION, "guided_regex": "a\\\\", "max_tokens": 4}  # the regex a\\
    response = _post(server, "/v1/completions", json.dumps(body).encode())
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == "a\\"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("route, field, value, regex, where", [
    ("/v1/chat/completions", "response_format", {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {
            "tags": {"type": "array", "items": {"type": "string", "pattern": "[a-z]+\\"}}}}}},
     "[a-z]+\\", "#/properties/tags/items/pattern"),
    ("/v1/completions", "structured_outputs", {"json": {
        "$defs": {"id": {"type": "string", "pattern": "\\"}}, "$ref": "#/$defs/id"}},
     "\\", "#/$defs/id/pattern"),
    ("/v1/completions", "guided_json", {"type": "object", "properties": {"a": {"type": "object",
        "properties": {"b": {"type": "string", "pattern": "x\\\\\\"}}}}},
     "x\\\\\\", "#/properties/a/properties/b/pattern"),
])
def test_a_schema_pattern_ending_in_a_lone_backslash_is_refused(server, reference, route, field,
                                                               value, regex, where):
    """llguidance drops a lone backslash at a schema pattern's end as at a
    regex's: refused, naming the pattern as the client wrote it in JSON."""
    body = {**(COMPLETION if route == "/v1/completions" else CHAT), field: value}
    error = _error(_post(server, route, json.dumps(body).encode()), 400)
    assert (f"invalid JSON schema: the pattern {json.dumps(regex)} at {where} ends in an "
            f"incomplete escape (a lone backslash)") in error["message"], error
    _still_serving(server, reference)


@pytest.mark.timeout(60)
def test_a_schema_pattern_ending_in_an_escaped_backslash_is_honoured(server):
    """The pattern ``^[abc]{2}\\\\$`` (two letters, then one backslash): every
    sampled value matches it by Python's ``re``, its backslash included."""
    pattern = "^[abc]{2}\\\\$"
    schema = {"type": "object", "properties": {"path": {"type": "string", "pattern": pattern}},
              "required": ["path"]}
    for seed in range(3):
        body = {**COMPLETION, "max_tokens": 20, "temperature": 1.0, "seed": seed,
                "structured_outputs": {"json": schema, "disable_any_whitespace": True}}
        response = _post(server, "/v1/completions", json.dumps(body).encode())
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        value = json.loads(choice["text"])["path"]
        assert re.search(pattern, value) and value.endswith("\\"), value


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fields", [{"max_tokens": 0}, {"max_tokens": -5},
                                    {"max_completion_tokens": 0}])
def test_beam_search_takes_no_max_tokens_below_one_on_either_route(server, reference, fields):
    """A chat's beam search raised a max_tokens below 1 to 1 and answered;
    it is refused as the completion route and sampling refuse it."""
    beams = {"use_beam_search": True, "n": 2}
    chat = {**CHAT, **beams, **fields}
    error = _error(_post(server, "/v1/chat/completions", json.dumps(chat).encode()), 400)
    assert "max_tokens must be" in error["message"], error
    if "max_tokens" in fields:
        completion = {**COMPLETION, **beams, **fields}
        _error(_post(server, "/v1/completions", json.dumps(completion).encode()), 400)
    _still_serving(server, reference)


def test_the_backend_refuses_a_dangling_escape_before_building_anything():
    backend = GuidanceBackend("/nonexistent/tokenizer.json", vocab_size=8, eos_token_ids=[0])
    for regex in ("\\", "ab\\", "a\\\\\\"):
        with pytest.raises(GrammarError, match="incomplete escape"):
            backend.compile(GrammarKey("regex", regex))
    assert backend._tokenizer is None


def test_one_rule_says_which_fields_a_request_sets():
    """``SamplingFields.asks_for``: a field sent with a value other than its
    default and ``SamplingParams``' default of its name. Both checks that
    read it agree: at either default a field passes as an unsupported field
    and beside ``use_beam_search``; any other value, an empty one too, is
    refused by both (vLLM refuses any suffix but null)."""
    defaults = {"prompt": "hi", "use_beam_search": True, "frequency_penalty": 0, "top_p": 1,
                "top_k": 0, "stop": None, "seed": None, "echo": False, "suffix": None,
                "logits_processors": None, "prompt_embeds": None}
    request = CompletionRequest.model_validate(defaults)
    request.check_supported()
    check_beam_fields(request, "prompt")
    assert not any(request.asks_for(name) for name in defaults if name != "prompt"
                   and name != "use_beam_search")
    for field, value in [("suffix", ""), ("suffix", "!"), ("logits_processors", []),
                         ("prompt_embeds", "")]:
        request = CompletionRequest.model_validate({"prompt": "hi", field: value})
        assert request.asks_for(field)
        with pytest.raises(ValueError, match=f"^{field} is not supported by this server$"):
            request.check_supported()


# vLLM's fields that change its answer and that this server does not
# implement: a value that asks for something, and values vLLM reads as unset.
UNSERVED = [("watermarking", True, (None, False))]
CHAT_UNSERVED = [("mm_processor_kwargs", {"num_crops": 4}, (None, {})),
                 ("media_io_kwargs", {"video": {"num_frames": 8}}, (None, {}))]


@pytest.mark.parametrize("model, body, field, value, unset", [
    *[(CompletionRequest, {"prompt": "hi"}, *case) for case in UNSERVED],
    *[(ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}]}, *case)
      for case in UNSERVED + CHAT_UNSERVED]])
def test_fields_vllm_applies_and_this_server_does_not_are_refused(model, body, field, value,
                                                                  unset):
    """Refused with a 400 naming the field, never answered as if not sent;
    sent at a value that asks for nothing, they pass (and beside
    ``use_beam_search``, which takes no other field, they are refused by
    the same rule)."""
    request = model.model_validate({**body, field: value})
    with pytest.raises(FieldError, match=f"^{field} is not supported by this server$") as raised:
        request.check_supported()
    assert raised.value.param == field
    for harmless in unset:
        request = model.model_validate({**body, field: harmless, "use_beam_search": True})
        request.check_supported()
        check_beam_fields(request, "prompt" if model is CompletionRequest else "messages")


def test_fields_that_change_no_answer_here_are_taken():
    """vLLM's hints and its render routes' fields change no answer in a
    server without what uses them: taken, beam search too; a value of the
    wrong type is still a 400."""
    taken = {"session_id": "s", "kv_transfer_params": {"a": 1}, "ec_transfer_params": {},
             "vllm_xargs": {"k": 1}, "return_token_offsets": True, "return_mm_kwargs": False,
             "routed_experts_prompt_start": 2, "stream_interval": 4, "user": "u"}
    request = CompletionRequest.model_validate({"prompt": "hi", "use_beam_search": True,
                                                **taken})
    request.check_supported()
    check_beam_fields(request, "prompt")
    for field, bad in (("stream_interval", 0), ("routed_experts_prompt_start", -1),
                       ("session_id", 5)):
        with pytest.raises(ValidationError):
            CompletionRequest.model_validate({"prompt": "hi", field: bad})
    for field, value in [("seed", 0), ("stop", []), ("logit_bias", {}), ("echo", True),
                         ("top_p", 0.5), ("frequency_penalty", 0.1)]:
        request = CompletionRequest.model_validate({"prompt": "hi", "use_beam_search": True,
                                                    field: value})
        assert request.asks_for(field)
        with pytest.raises(ValueError, match=f"^use_beam_search does not take {field}$"):
            check_beam_fields(request, "prompt")


def test_read_json_refuses_what_is_not_unicode_and_reads_the_rest_as_json_loads():
    for bad in (b'"\\ud800"', b'"\\udc00x"', b'"\\ude00\\ud83d"', b'"\xed\xa0\x80"',
                b'"\xff"', b'{"a": 1,}', b"[" * 1000 + b"]" * 1000):
        with pytest.raises(json.JSONDecodeError):
            read_json(bad)
    for good in (b'{"a": "\\ud83d\\ude00 \\u0000", "b": [1e400, -0, 123456789012345678901]}',
                 b'{"a": 1, "a": 2}', b'  [true, null, "x"]  '):
        assert read_json(good) == json.loads(good)
    assert read_json(b'\xef\xbb\xbf{"a": 1}') == {"a": 1}
    assert math.isnan(read_json(b"NaN"))


# ---- a bad value in a union field ------------------------------------------------
RESPONSES = {"model": "tiny", "input": "Hello", "max_output_tokens": 2, "temperature": 0}
BODIES = {"/v1/completions": COMPLETION, "/v1/chat/completions": CHAT,
          "/v1/responses": RESPONSES, "/tokenize": {"model": "tiny", "prompt": "Hello"}}
PROMPT_FORMS = ("a string, a list of strings, a list of integers or a list of lists of "
                "integers")
CONTENT_FORMS = "a string or a list of content parts"
ROUTE_MODELS = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest,
                "/v1/responses": ResponsesRequest, "/tokenize": TokenizeRequest}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path, fields, param, message", [
    ("/v1/responses", {"input": [{"type": "message", "role": "user", "content": 5}]},
     "input.0.content", f"Input should be {CONTENT_FORMS}, got an integer"),
    ("/v1/responses", {"input": 5}, "input",
     "Input should be a string or a list of input items, got an integer"),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_text",
                                                               "text": 5}]}]},
     "input.0.content.0.text",
     f"Input should be a string, got an integer (input.0.content accepts {CONTENT_FORMS})"),
    ("/v1/responses", {"input": ["hi"]}, "input.0",
     "Input should be an input item, got a string (input accepts a string or a list of input "
     "items)"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]},
     "messages.0.content", f"Input should be {CONTENT_FORMS}, got an integer"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": ["hi"]}]},
     "messages.0.content.0",
     f"Input should be a content part, got a string (messages.0.content accepts "
     f"{CONTENT_FORMS})"),
    ("/v1/chat/completions", {"tool_choice": 5}, "tool_choice",
     "Input should be a string or an object, got an integer"),
    ("/v1/completions", {"prompt": None}, "prompt", f"Input should be {PROMPT_FORMS}, got null"),
    ("/v1/completions", {"prompt": {"text": "hi"}}, "prompt",
     f"Input should be {PROMPT_FORMS}, got an object"),
    # The token-id member got furthest (to item 1), past the text members' item 0.
    ("/v1/completions", {"prompt": [1, "a"]}, "prompt.1",
     f"Input should be an integer, got a string (prompt accepts {PROMPT_FORMS})"),
    ("/v1/completions", {"prompt": [5, 6, 7, [8]]}, "prompt.3",
     f"Input should be an integer, got a list (prompt accepts {PROMPT_FORMS})"),
    ("/v1/completions", {"prompt": [[1], ["a"]]}, "prompt.1.0",
     f"Input should be an integer, got a string (prompt accepts {PROMPT_FORMS})"),
    # Of the same type but out of range: the id members took it, the text ones did not.
    ("/v1/completions", {"prompt": [2**63]}, "prompt.0",
     f"Input should be less than or equal to {2**63 - 1} (prompt accepts {PROMPT_FORMS})"),
    ("/v1/completions", {"prompt": ["a", 1]}, "prompt.1",
     f"Input should be a string, got an integer (prompt accepts {PROMPT_FORMS})"),
])
def test_a_bad_value_in_a_union_field_says_what_the_field_accepts(server, reference, path,
                                                                  fields, param, message):
    """Pydantic reports a value no member of a union takes once per member,
    the first member's error first ("input: Input should be a valid
    string" for a list item's bad content): the 400 names where the member
    that got furthest failed, and what the union there accepts."""
    body = json.dumps({**BODIES[path], **fields}).encode()
    error = _error(_post(server, path, body), 400)
    assert error["param"] == param, error
    assert error["message"] == f"{param}: {message}", error
    _still_serving(server, reference)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fields, param, message", [
    ({"stop": 5}, "stop", "Input should be a string or a list of strings, got an integer"),
    ({"stop": ["a", 5]}, "stop.1",
     "Input should be a string, got an integer (stop accepts a string or a list of strings)"),
    ({"messages": [{"role": "user", "content": [7]}]}, "messages.0.content.0",
     f"Input should be a content part, got an integer (messages.0.content accepts "
     f"{CONTENT_FORMS})"),
])
def test_every_route_gives_the_same_message_for_the_same_bad_field(server, fields, param,
                                                                   message):
    """Each route that reads the field answers it alike: the generation
    routes whose valid bodies take the fast lane, and ``/tokenize``."""
    paths = [p for p, body in BODIES.items() if set(fields) <= set(ROUTE_MODELS[p].model_fields)]
    assert len(paths) >= 2, paths
    for path in paths:
        body = {**BODIES[path], **fields}
        if "messages" in fields:
            body.pop("prompt", None)
        error = _error(_post(server, path, json.dumps(body).encode()), 400)
        assert (error["param"], error["message"]) == (param, f"{param}: {message}"), (path, error)



def _unions(annotation, seen: set) -> list:
    """Every union of two types or more in ``annotation`` and the models it holds."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if annotation in seen:
            return []
        seen.add(annotation)
        return [u for f in annotation.model_fields.values() for u in _unions(f.annotation, seen)]
    args = typing.get_args(annotation)
    found = [u for a in args for u in _unions(a, seen)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        if len([a for a in args if a is not type(None)]) > 1:
            found.append(annotation)
    return found


def test_every_union_member_of_the_request_models_is_read_by_its_label():
    """``read_location`` tells each member of a union by the label pydantic
    gives it: a value no member takes (``object()``) fails every member at
    the union, and each error's member is found, so a nested union below it
    is read as one."""
    unions = _unions(ResponsesRequest, set()) + _unions(ChatCompletionRequest, set()) \
        + _unions(IdsFirstCompletionRequest, set())
    assert len(unions) >= 8, unions
    for union in unions:
        with pytest.raises(ValidationError) as raised:
            TypeAdapter(union).validate_python(object())
        found = [read_location(union, e["loc"])[0] for e in raised.value.errors()]
        assert all(p.kind == "member" and p.expected is not None for p in found), (union, found)
        members = [a for a in typing.get_args(union) if a is not type(None)]
        assert [p.expected for p in found] == members, union
