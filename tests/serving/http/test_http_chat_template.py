"""Chat templates render as transformers renders them (its
``apply_chat_template(tokenize=False)`` on the same tokenizer is the
reference), tools and tool-call messages included, and a template's
refusal is a ``ValueError``."""

from __future__ import annotations

import copy
import json

import pytest

from checkpoint.chat_template import (
    ChatTemplateError,
    chat_prompt_ids,
    message_text,
    render_chat,
    template_message,
)
from checkpoint.tiny_model import CHAT_TEMPLATE, ensure_tiny_model
from checkpoint.tokenizer import Tokenizer
from tests.helpers.tool_template import TOOL_TEMPLATE

CHATML = (  # the shape of SmolLM2's template
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

LLAMA3_LIKE = """{{- bos_token }}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}
        {{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}
    {%- else %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
        {{- message['content'] | trim + eos_token }}
    {%- endif %}
    {%- if loop.index > 10 %}{% break %}{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
{{- messages | tojson if false else '' }}
"""

BLOCKS = """{% for m in messages %}
  {% if m.role == 'user' %}
    U: {{ m.content }}
  {% else %}
    A: {{ m.content | tojson }}
  {% endif %}
{% endfor %}
{% if add_generation_prompt %}A:{% endif %}"""

MESSAGES = [
    [{"role": "user", "content": "Hi there  "}],
    [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "héllo 😀"},
     {"role": "assistant", "content": "Hello!\n\"quoted\""}, {"role": "user", "content": "2+2?"}],
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return ensure_tiny_model(str(tmp_path_factory.mktemp("c")))


@pytest.fixture(scope="module")
def hf_tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.mark.parametrize("template", [CHAT_TEMPLATE, CHATML, LLAMA3_LIKE, BLOCKS])
@pytest.mark.parametrize("messages", MESSAGES)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_render_equals_transformers(hf_tokenizer, template, messages, add_generation_prompt):
    want = hf_tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                            add_generation_prompt=add_generation_prompt)
    got = render_chat(template, messages, add_generation_prompt=add_generation_prompt,
                      bos_token=hf_tokenizer.bos_token, eos_token=hf_tokenizer.eos_token)
    assert got == want


OPEN_ENDED = [
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "The answer is"}],
    [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "héllo"},
     {"role": "assistant", "content": "Well,  "}],  # trailing spaces a template may trim
]


@pytest.mark.parametrize("template", [CHAT_TEMPLATE, CHATML, LLAMA3_LIKE, BLOCKS])
@pytest.mark.parametrize("messages", OPEN_ENDED)
def test_continue_final_message_equals_transformers(hf_tokenizer, template, messages):
    want = hf_tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                            add_generation_prompt=False,
                                            continue_final_message=True)
    got = render_chat(template, messages, add_generation_prompt=False,
                      bos_token=hf_tokenizer.bos_token, eos_token=hf_tokenizer.eos_token,
                      continue_final_message=True)
    assert got == want


def test_continue_final_message_refusals():
    with pytest.raises(ChatTemplateError, match="cannot both be set"):
        render_chat(CHATML, OPEN_ENDED[0], add_generation_prompt=True, bos_token=None,
                    eos_token=None, continue_final_message=True)
    drops_last = "{% for m in messages[:-1] %}{{ m.content }}{% endfor %}"
    with pytest.raises(ChatTemplateError, match="does not keep the final message"):
        render_chat(drops_last, OPEN_ENDED[0], add_generation_prompt=False, bos_token=None,
                    eos_token=None, continue_final_message=True)


def test_template_refusals_are_value_errors():
    with pytest.raises(ChatTemplateError, match="unknown role: robot"):
        render_chat(CHAT_TEMPLATE, [{"role": "robot", "content": "x"}],
                    add_generation_prompt=True, bos_token="<s>", eos_token="</s>")
    with pytest.raises(ChatTemplateError, match="no chat template"):
        render_chat(None, MESSAGES[0], add_generation_prompt=True, bos_token=None,
                    eos_token=None)
    with pytest.raises(ChatTemplateError, match="does not compile"):
        render_chat("{% for %}", MESSAGES[0], add_generation_prompt=True, bos_token=None,
                    eos_token=None)


def test_sandbox_blocks_python_internals():
    escape = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(ChatTemplateError):
        render_chat(escape, MESSAGES[0], add_generation_prompt=True, bos_token=None,
                    eos_token=None)


def test_content_parts_are_joined_texts_and_other_parts_are_named():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert message_text(parts) == "a\nb" and message_text(None) == ""
    with pytest.raises(ValueError, match="only text content parts are supported, got 'image_url'"):
        message_text([{"type": "image_url", "image_url": {"url": "x"}}])
    with pytest.raises(ValueError, match="a text content part needs a 'text' string"):
        message_text([{"type": "text"}])


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {"name": "now"}},
]
# As templates read them: an assistant's calls with object arguments, its
# content "" where the client sent null.
TOOL_CHATS = [
    [{"role": "user", "content": "Weather in Oslo?"}],
    [{"role": "user", "content": "Weather in Oslo?"},
     {"role": "assistant", "content": "", "tool_calls": [
         {"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
     {"role": "tool", "tool_call_id": "call_1", "content": "Snow, -3 °C"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Oslo, and the time?"},
     {"role": "assistant", "content": "Looking.", "tool_calls": [
         {"id": "a", "type": "function",
          "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
         {"id": "b", "type": "function", "function": {"name": "now", "arguments": {}}}]},
     {"role": "tool", "tool_call_id": "a", "content": "Snow"},
     {"role": "tool", "tool_call_id": "b", "content": "12:00"},
     {"role": "assistant", "content": "Snowy at noon."}, {"role": "user", "content": "Thanks"}],
]


def _as_sent(chat: list[dict]) -> list[dict]:
    """``chat`` as an OpenAI client sends it: arguments as JSON text, the
    content of a message that only calls tools null."""
    sent = copy.deepcopy(chat)
    for message in sent:
        for call in message.get("tool_calls", []):
            call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
        if "tool_calls" in message and not message["content"]:
            message["content"] = None
    return sent


@pytest.mark.parametrize("template", [TOOL_TEMPLATE, CHATML, LLAMA3_LIKE])
@pytest.mark.parametrize("chat", TOOL_CHATS)
@pytest.mark.parametrize("tools", [TOOLS, None])
def test_tools_and_tool_calls_render_equal_transformers(hf_tokenizer, template, chat, tools):
    want = hf_tokenizer.apply_chat_template(chat, tools=tools, chat_template=template,
                                            tokenize=False, add_generation_prompt=True)
    got = render_chat(template, chat, add_generation_prompt=True, tools=tools,
                      bos_token=hf_tokenizer.bos_token, eos_token=hf_tokenizer.eos_token)
    assert got == want
    if tools is not None and template == TOOL_TEMPLATE:
        assert '"name": "get_weather"' in got  # the tools are in the prompt


@pytest.mark.parametrize("chat", TOOL_CHATS)
def test_sent_tool_calls_reach_the_template_as_transformers_wants_them(
        model_dir, hf_tokenizer, chat):
    """Arguments sent as JSON text reach the template as objects, and a null
    content as "": the prompt (text and ids) is transformers' for the
    messages written that way."""
    want_text = hf_tokenizer.apply_chat_template(chat, tools=TOOLS, chat_template=TOOL_TEMPLATE,
                                                 tokenize=False, add_generation_prompt=True)
    want_ids = hf_tokenizer.apply_chat_template(chat, tools=TOOLS, chat_template=TOOL_TEMPLATE,
                                                tokenize=True, add_generation_prompt=True,
                                                return_dict=False)
    text, ids = chat_prompt_ids(Tokenizer.from_dir(model_dir), _as_sent(chat), tools=TOOLS,
                                chat_template=TOOL_TEMPLATE)
    assert (text, ids) == (want_text, list(want_ids))


def test_template_message_leaves_the_callers_message_alone():
    sent = _as_sent(TOOL_CHATS[1])
    before = copy.deepcopy(sent)
    assert [template_message(m) for m in sent] == TOOL_CHATS[1]
    assert sent == before
    # An empty tool_calls list is no call: the plain assistant path.
    assert template_message({"role": "assistant", "content": "x", "tool_calls": []}) == {
        "role": "assistant", "content": "x"}
    with pytest.raises(ChatTemplateError, match="arguments are not JSON text"):
        template_message({"role": "assistant", "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": "{oops"}}]})
