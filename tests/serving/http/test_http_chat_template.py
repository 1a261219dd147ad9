"""Chat templates render as transformers renders them (its
``apply_chat_template(tokenize=False)`` on the same tokenizer is the
reference), and a template's refusal is a ``ValueError``."""

from __future__ import annotations

import pytest

from checkpoint.chat_template import ChatTemplateError, message_text, render_chat
from checkpoint.tiny_model import CHAT_TEMPLATE, ensure_tiny_model

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
def hf_tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ensure_tiny_model(str(tmp_path_factory.mktemp("c"))))


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
