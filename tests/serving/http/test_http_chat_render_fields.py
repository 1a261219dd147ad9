"""vLLM's chat fields that shape the prompt, through the official ``openai``
client, on a copy of ``tiny`` whose template shows the variables it gets
(served in process over a link that answers every request at once: only
the prompt is under test). The reference is transformers'
``apply_chat_template`` on the same tokenizer: ``documents`` and
``reasoning_effort`` reach the template (the effort turning
``enable_thinking`` on or off unless ``chat_template_kwargs`` set it),
``add_special_tokens`` adds the tokenizer's BOS to the rendered text, and
``return_prompt_text`` shows the rendered text, whole and streamed. The
Responses API's ``reasoning.effort`` is the chat's ``reasoning_effort``
(the prompt the engine gets is the same), its ``summary`` changes no
prompt, and the Response echoes the ``reasoning`` asked for."""

from __future__ import annotations

import openai
import pytest

from checkpoint.tiny_model import CHAT_TEMPLATE
from tests.helpers.http_utils import recording_app
from tests.helpers.tiny_copies import tiny_with_chat_template

# tiny's template, after the BOS: each document, the effort and the thinking switch.
SHOWING_TEMPLATE = CHAT_TEMPLATE.replace(
    "{{ bos_token }}",
    "{{ bos_token }}"
    "{% for d in documents or [] %}[doc {{ d.title }}: {{ d.text }}]\n{% endfor %}"
    "{% if reasoning_effort is defined and reasoning_effort %}[effort {{ reasoning_effort }}]"
    "{% endif %}"
    "{% if enable_thinking is defined %}[thinking {{ enable_thinking }}]{% endif %}", 1)
assert SHOWING_TEMPLATE != CHAT_TEMPLATE

MESSAGES = [{"role": "user", "content": "Hello there"}]
DOCS = [{"title": "Oslo", "text": "Cold in winter."}, {"title": "Rome", "text": "Warm."}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("render_fields")
    return tiny_with_chat_template(str(root / "cache"), str(root / "model"), SHOWING_TEMPLATE)


@pytest.fixture(scope="module")
def served(model_dir):
    with recording_app(model_dir) as app:
        yield app


@pytest.fixture(scope="module")
def link(served):
    return served.link


@pytest.fixture(scope="module")
def client(served):
    return served.client


def _asked(client, **extra):
    return client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=2,
        extra_body={"return_prompt_text": True, "return_token_ids": True, **extra})


def _hf_prompt(hf, **template) -> tuple[str, list[int]]:
    text = hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True,
                                  **template)
    ids = hf.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True,
                                 return_dict=False, **template)
    return text, list(ids)


@pytest.mark.parametrize("extra, template", [
    ({}, {}),
    ({"documents": DOCS}, {"documents": DOCS}),
    ({"reasoning_effort": "low"}, {"reasoning_effort": "low", "enable_thinking": True}),
    ({"reasoning_effort": "none"}, {"reasoning_effort": "none", "enable_thinking": False}),
    # The kwargs' own switch stays; the field's effort goes over the kwargs' one.
    ({"reasoning_effort": "none",
      "chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": "high"}},
     {"reasoning_effort": "none", "enable_thinking": True}),
])
def test_the_template_gets_documents_and_reasoning_effort(client, hf, extra, template):
    answer = _asked(client, **extra)
    text, ids = _hf_prompt(hf, **template)
    assert answer.model_extra["prompt_text"] == text
    assert answer.model_extra["prompt_token_ids"] == ids
    if extra:
        assert text != _hf_prompt(hf)[0]  # the fields show in the prompt


def test_add_special_tokens_adds_the_tokenizers_bos(client, hf):
    text, ids = _hf_prompt(hf)
    answer = _asked(client, add_special_tokens=True)
    assert answer.model_extra["prompt_token_ids"] == hf(text, add_special_tokens=True).input_ids
    assert answer.model_extra["prompt_token_ids"] == [hf.bos_token_id, *ids]  # the template's too
    assert answer.usage.prompt_tokens == len(ids) + 1


def test_prompt_text_streamed_and_left_out_unasked(client, hf):
    text, _ = _hf_prompt(hf, documents=DOCS)
    chunks = list(client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=2, n=2, stream=True,
        extra_body={"return_prompt_text": True, "documents": DOCS}))
    assert [c.model_extra.get("prompt_text") for c in chunks[:2]] == [text, text]  # role chunks
    assert all("prompt_text" not in c.model_extra for c in chunks[2:])
    plain = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
    assert "prompt_text" not in plain.model_extra


def test_an_unknown_reasoning_effort_is_a_400_naming_it(client):
    with pytest.raises(openai.BadRequestError) as raised:
        _asked(client, reasoning_effort="extreme")
    assert raised.value.body["param"] == "reasoning_effort"


@pytest.mark.parametrize("reasoning, template", [
    ({"effort": "low"}, {"reasoning_effort": "low", "enable_thinking": True}),
    ({"effort": "none"}, {"reasoning_effort": "none", "enable_thinking": False}),
    ({"effort": "high", "summary": "auto"},
     {"reasoning_effort": "high", "enable_thinking": True}),
    ({"summary": "detailed"}, {}),  # no summary is written: the prompt is the plain one
])
def test_responses_reasoning_effort_reaches_the_template(client, link, hf, reasoning, template):
    response = client.responses.create(model="tiny", input="Hello there", max_output_tokens=2,
                                       reasoning=reasoning)
    _, ids = _hf_prompt(hf, **template)
    assert link.prompts[-1] == ids
    assert response.usage.input_tokens == len(ids)
    assert response.reasoning.effort == reasoning.get("effort")
    assert response.reasoning.summary == reasoning.get("summary")
    if "effort" in reasoning:
        assert ids != _hf_prompt(hf)[1]  # the effort shows in the prompt
        _asked(client, reasoning_effort=reasoning["effort"])
        assert link.prompts[-1] == ids  # the chat's rule: the same prompt


def test_responses_reasoning_effort_streamed(client, link, hf):
    events = list(client.responses.create(model="tiny", input="Hello there",
                                          max_output_tokens=2, stream=True,
                                          reasoning={"effort": "none"}))
    assert link.prompts[-1] == _hf_prompt(hf, reasoning_effort="none", enable_thinking=False)[1]
    assert events[-1].response.reasoning.effort == "none"


def test_an_unknown_responses_reasoning_effort_is_a_400_naming_it(client):
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="tiny", input="Hello there", max_output_tokens=2,
                                reasoning={"effort": "extreme"})
    assert raised.value.body["param"] == "reasoning.effort"
