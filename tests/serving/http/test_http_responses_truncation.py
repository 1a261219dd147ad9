"""The Responses API's ``truncation`` and ``max_tool_calls``, as vLLM serves
them, through the official ``openai`` client (in process, over a link that
answers at once and records each prompt, with a context of 48 tokens).

``truncation`` "auto": an input too long for the context reaches the
engine as its last ``max_model_len - max_output_tokens`` tokens, the
reference being transformers' rendering of the same chat cut by hand; an
input that fits is whole; without ``max_output_tokens`` the cut input fills
the context and is vLLM's 400 naming ``input``; null cuts as "auto" does
(vLLM tests the field for "disabled" alone), and is echoed as "auto";
"disabled" (or left out: vLLM's default) refuses a long input. ``max_tool_calls`` is taken and
echoed (the server runs no built-in tool for it to limit); the Response
echoes both, whole and streamed. Once through ``tprun serve``, where the
engine answers the cut input."""

from __future__ import annotations

import openai
import pytest

from tests.helpers.http_utils import openai_client, recording_app, serving_tiny

MAX_MODEL_LEN = 48
LONG = " ".join(f"word{i}" for i in range(60))  # far more than 48 tokens once rendered
SHORT = "Hi there"


@pytest.fixture(scope="module")
def served(model_dir):
    with recording_app(model_dir, MAX_MODEL_LEN) as app:
        yield app.link, app.client


def _rendered(hf, text: str) -> list[int]:
    """The whole input's token ids, as transformers renders and tokenizes
    the one user message."""
    return list(hf.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                       add_generation_prompt=True, return_dict=False))


@pytest.mark.parametrize("truncation", ["auto", None])
@pytest.mark.parametrize("max_output_tokens", [1, 8, 20])
def test_auto_keeps_the_inputs_last_tokens_beside_max_output_tokens(served, hf,
                                                                    max_output_tokens,
                                                                    truncation):
    link, client = served
    whole = _rendered(hf, LONG)
    assert len(whole) > MAX_MODEL_LEN
    response = client.responses.create(model="tiny", input=LONG, truncation=truncation,
                                       max_output_tokens=max_output_tokens)
    kept = MAX_MODEL_LEN - max_output_tokens
    assert link.prompts[-1] == whole[-kept:]
    assert response.usage.input_tokens == kept
    assert response.truncation == "auto"


def test_auto_leaves_an_input_that_fits_whole(served, hf):
    link, client = served
    whole = _rendered(hf, SHORT)
    response = client.responses.create(model="tiny", input=SHORT, truncation="auto",
                                       max_output_tokens=8)
    assert link.prompts[-1] == whole
    assert response.usage.input_tokens == len(whole)


@pytest.mark.parametrize("text, fields, param", [
    # Cut to the whole context, the input leaves no room for output (vLLM's 400).
    (LONG, {"truncation": "auto"}, "input"),
    # max_output_tokens leaves no room for any input: nothing is cut, and
    # the 400 names it, however long the input (vLLM's names it too).
    (SHORT, {"truncation": "auto", "max_output_tokens": MAX_MODEL_LEN}, "max_output_tokens"),
    (LONG, {"truncation": "auto", "max_output_tokens": MAX_MODEL_LEN}, "max_output_tokens"),
    (LONG, {"truncation": "auto", "max_output_tokens": MAX_MODEL_LEN + 1}, "max_output_tokens"),
    (LONG, {"truncation": None}, "input"),
    (SHORT, {"truncation": None, "max_output_tokens": MAX_MODEL_LEN}, "max_output_tokens"),
    (LONG, {"truncation": "disabled", "max_output_tokens": 8}, "input"),
    (LONG, {"max_output_tokens": 8}, "input"),
])
def test_what_auto_does_not_cut_is_refused(served, text, fields, param):
    link, client = served
    before = len(link.prompts)
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="tiny", input=text, **fields)
    assert raised.value.code == "context_length_exceeded"
    assert raised.value.param == param
    assert len(link.prompts) == before


def test_max_tool_calls_and_truncation_are_echoed(served):
    _, client = served
    response = client.responses.create(model="tiny", input=SHORT, max_output_tokens=2,
                                       max_tool_calls=3, truncation="auto")
    assert (response.max_tool_calls, response.truncation) == (3, "auto")
    plain = client.responses.create(model="tiny", input=SHORT, max_output_tokens=2)
    assert (plain.max_tool_calls, plain.truncation) == (None, "disabled")
    events = list(client.responses.create(model="tiny", input=SHORT, max_output_tokens=2,
                                          max_tool_calls=1, truncation="auto", stream=True))
    assert [(e.response.max_tool_calls, e.response.truncation) for e in events
            if e.type in ("response.created", "response.completed")] == [(1, "auto")] * 2


def test_an_unknown_truncation_is_a_400_naming_it(served):
    _, client = served
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="tiny", input=SHORT, max_output_tokens=2,
                                extra_body={"truncation": "middle"})
    assert raised.value.param == "truncation"


@pytest.mark.timeout(180)
def test_the_engine_answers_from_the_cut_input(tmp_path, hf):
    """Through ``tprun serve`` (the engine's own context check): the cut
    input fills the context beside ``max_output_tokens`` and is answered."""
    with serving_tiny(tmp_path, "serve", "--model", "tiny", "--device", "cpu",
                      "--disable-log-stats", "--max-model-len", str(MAX_MODEL_LEN)) as server:
        with openai_client(server) as client:
            response = client.responses.create(model="tiny", input=LONG, truncation="auto",
                                               max_output_tokens=8, temperature=0,
                                               extra_body={"ignore_eos": True})
            assert response.usage.input_tokens == MAX_MODEL_LEN - 8
            assert response.usage.output_tokens == 8
            assert response.status == "incomplete"
            with pytest.raises(openai.BadRequestError):
                client.responses.create(model="tiny", input=LONG, max_output_tokens=8)
