"""vLLM's ``echo`` on /v1/chat/completions, through the official ``openai``
client against ``tiny`` served with a tool-use chat template (TP=1, CPU).

The answer has vLLM's role (the assistant's after a generation prompt, else
the last message's). Echo repeats the last message's text, exactly, when
that message has the answer's role, and nothing otherwise. The reference
for the rest is the same request without ``echo`` (greedy, or seeded per
choice): whole, each choice's content is the echo then the reference's
content, with the reference's logprobs and usage (the echo adds no token);
streamed, each choice's first content delta after its role is the echo,
and the deltas after it add up to the reference's content. Tool calls,
structured outputs and beam search keep their answers, the echo before
them."""

from __future__ import annotations

import pytest

from tests.helpers.http_utils import openai_client, serving_tiny_with_tools

pytestmark = pytest.mark.timeout(300)

# An assistant's begun answer, continued; its text has quotes, a newline and
# non-ASCII characters, which the echo keeps as they are.
BEGUN = 'My "favourite" colour,\n  in short: é☀'
CONTINUED = [{"role": "user", "content": "Name a colour."},
             {"role": "assistant", "content": BEGUN}]
CONTINUE = {"continue_final_message": True, "add_generation_prompt": False}
TOOLS = [{"type": "function", "function": {"name": "pick", "parameters": {
    "type": "object", "properties": {"colour": {"type": "string", "maxLength": 5}},
    "required": ["colour"], "additionalProperties": False}}}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_tiny_with_tools(tmp_path_factory.mktemp("http_chat_echo"),
                                 "--served-model-name", "tiny") as served:
        yield served


@pytest.fixture(scope="module")
def client(server):
    with openai_client(server) as c:
        yield c


def _both(client, messages, extra_body=None, **kw):
    """(answer with echo, the same request's answer without)."""
    kw = {"model": "tiny", "messages": messages, "max_tokens": 6, **kw}
    extra_body = extra_body or {}
    got = client.chat.completions.create(extra_body={**extra_body, "echo": True}, **kw)
    want = client.chat.completions.create(extra_body=extra_body, **kw)
    return got, want


def _streamed(client, messages, extra_body=None, **kw) -> tuple[dict, object]:
    """Each choice's deltas (as dicts, in order) of a streamed answer with
    echo, and its usage chunk's usage."""
    deltas: dict[int, list[dict]] = {}
    usage = None
    kw = {"model": "tiny", "messages": messages, "max_tokens": 6, **kw}
    for chunk in client.chat.completions.create(
            stream=True, stream_options={"include_usage": True},
            extra_body={**(extra_body or {}), "echo": True}, **kw):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            deltas.setdefault(choice.index, []).append(choice.delta.model_dump(exclude_none=True))
    return deltas, usage


def _logprobs(choice) -> list[tuple[str, float]]:
    return [(t.token, t.logprob) for t in choice.logprobs.content]


def test_echo_of_the_continued_message_whole(client):
    """n=2, seeded: each choice is the begun text then the reference
    choice's content, with its logprobs; usage counts generated tokens."""
    kw = {"n": 2, "temperature": 1.0, "seed": 5, "logprobs": True, "top_logprobs": 2}
    got, want = _both(client, CONTINUED, {**CONTINUE, "ignore_eos": True}, **kw)
    assert len(got.choices) == len(want.choices) == 2
    for g, w in zip(got.choices, want.choices):
        assert w.message.content  # the reference generated text
        assert g.message.role == w.message.role == "assistant"
        assert g.message.content == BEGUN + w.message.content
        assert [t for t, _ in _logprobs(g)] == [t for t, _ in _logprobs(w)]
        assert [lp for _, lp in _logprobs(g)] == pytest.approx(
            [lp for _, lp in _logprobs(w)], abs=1e-4)
        assert g.finish_reason == w.finish_reason
    assert got.usage.completion_tokens == want.usage.completion_tokens == 12
    assert got.usage.prompt_tokens == want.usage.prompt_tokens


def test_echo_of_the_continued_message_streamed(client):
    """Each choice: its role, then the begun text as one content delta,
    then deltas that add up to the reference's content."""
    kw = {"n": 2, "temperature": 1.0, "seed": 5}
    extra = {**CONTINUE, "ignore_eos": True}
    want = client.chat.completions.create(model="tiny", messages=CONTINUED, max_tokens=6,
                                          extra_body=extra, **kw)
    deltas, usage = _streamed(client, CONTINUED, extra, **kw)
    assert sorted(deltas) == [0, 1]
    for index, choice_deltas in deltas.items():
        assert choice_deltas[0] == {"role": "assistant", "content": ""}
        assert choice_deltas[1] == {"content": BEGUN}
        rest = "".join(d.get("content", "") for d in choice_deltas[2:])
        assert rest == want.choices[index].message.content
    assert usage.completion_tokens == want.usage.completion_tokens == 12


def test_no_echo_when_the_last_message_has_another_role(client):
    """After a generation prompt the answer is the assistant's: a last user
    message is not echoed, whole or streamed."""
    messages = [{"role": "user", "content": "Name a colour."}]
    got, want = _both(client, messages, temperature=0, extra_body={"ignore_eos": True})
    assert want.choices[0].message.content
    assert got.choices[0].message.content == want.choices[0].message.content
    deltas, _ = _streamed(client, messages, temperature=0, extra_body={"ignore_eos": True})
    assert deltas[0][0] == {"role": "assistant", "content": ""}
    assert "".join(d.get("content", "") for d in deltas[0]) == want.choices[0].message.content


def test_echo_of_a_user_turn_without_generation_prompt(client):
    """Without a generation prompt the answer has the last message's role,
    here the user's: its text parts, joined by newlines, are echoed."""
    messages = [{"role": "user", "content": [{"type": "text", "text": "Blue"},
                                             {"type": "text", "text": "or red?"}]}]
    extra = {"add_generation_prompt": False, "ignore_eos": True}
    got, want = _both(client, messages, extra, temperature=0)
    assert want.choices[0].message.content
    assert got.choices[0].message.role == want.choices[0].message.role == "user"
    assert got.choices[0].message.content == "Blue\nor red?" + want.choices[0].message.content
    deltas, _ = _streamed(client, messages, extra, temperature=0)
    assert deltas[0][:2] == [{"role": "user", "content": ""}, {"content": "Blue\nor red?"}]
    assert "".join(d.get("content", "") for d in deltas[0][2:]) == (
        want.choices[0].message.content)


def test_echo_with_a_named_tool_call(client):
    """A forced call's message: the echo as content, the reference's call
    in ``tool_calls``; streamed, the echo comes before the call's pieces."""
    kw = {"temperature": 0, "max_tokens": 30, "tools": TOOLS,
          "tool_choice": {"type": "function", "function": {"name": "pick"}}}
    got, want = _both(client, CONTINUED, CONTINUE, **kw)
    [want_call] = want.choices[0].message.tool_calls
    [got_call] = got.choices[0].message.tool_calls
    assert want.choices[0].message.content == "" and want_call.function.arguments
    assert got.choices[0].message.content == BEGUN
    assert (got_call.function.name, got_call.function.arguments) == (
        want_call.function.name, want_call.function.arguments)
    deltas, _ = _streamed(client, CONTINUED, CONTINUE, **kw)
    assert deltas[0][1] == {"content": BEGUN}
    pieces = [c["function"]["arguments"] for d in deltas[0][2:] for c in d.get("tool_calls", [])]
    assert "".join(pieces) == want_call.function.arguments


def test_echo_with_structured_output(client):
    """The echo goes before the constrained text, which stays the
    reference's (JSON of the schema)."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}},
              "required": ["ok"], "additionalProperties": False}
    got, want = _both(client, CONTINUED, CONTINUE, temperature=0, max_tokens=30,
                      response_format={"type": "json_schema",
                                       "json_schema": {"name": "s", "schema": schema}})
    assert want.choices[0].message.content.lstrip().startswith("{")  # held to the schema
    assert got.choices[0].message.content == BEGUN + want.choices[0].message.content


def test_echo_with_beam_search(client):
    """Each of the ``n`` best sequences after the echo, as without it."""
    extra = {**CONTINUE, "use_beam_search": True, "ignore_eos": True}
    got, want = _both(client, CONTINUED, extra, n=2, max_tokens=3)
    assert [c.message.content for c in got.choices] == [
        BEGUN + c.message.content for c in want.choices]
    assert all(c.message.content for c in want.choices)
