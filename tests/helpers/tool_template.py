"""A chat template with tool use, in the shape of the tool-use templates
models ship (tools listed in a system turn as JSON, an assistant's calls as
tagged JSON with object arguments, tool answers as their own turn), and
the ``tiny`` model written again with it as its template."""

from __future__ import annotations

import json
import os

from tests.helpers.tiny_copies import tiny_with_chat_template

TOOL_TEMPLATE = """{{- bos_token }}
{%- if tools is not none %}
<|system|>
You can call these functions:
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
Call one as <call>{"name": ..., "arguments": ...}</call>.{{ eos_token }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls is defined %}
<|assistant|>
{{- message.content }}
{%- for call in message.tool_calls %}
<call>{"name": {{ call.function.name | tojson }}, "arguments": {{ call.function.arguments | tojson }}}</call>
{%- endfor %}{{ eos_token }}
{%- elif message.role == 'tool' %}
<|tool|>
[{{ message.tool_call_id }}] {{ message.content }}{{ eos_token }}
{%- else %}
<|{{ message.role }}|>
{{ message.content }}{{ eos_token }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
<|assistant|>
{%- endif %}
"""


# Mistral's tool-call tokens, as special tokens on ids of tiny's that no
# text encodes to (its padding ids, past the bytes and <s>, </s>, <pad>).
MISTRAL_TOKENS = {"[TOOL_CALLS]": 259, "[ARGS]": 260}


def tiny_with_tool_template(cache_dir: str, out_dir: str,
                            special_tokens: dict[str, int] | None = None) -> str:
    """A copy of ``tiny`` (written under ``cache_dir``) in ``out_dir`` whose
    tokenizer's chat template is ``TOOL_TEMPLATE`` and which has the
    ``special_tokens`` (text: id) besides its own; its path."""
    tiny_with_chat_template(cache_dir, out_dir, TOOL_TEMPLATE)
    path = os.path.join(out_dir, "tokenizer.json")
    with open(path) as f:
        tokenizer = json.load(f)
    for text, token_id in (special_tokens or {}).items():
        tokenizer["added_tokens"].append({"id": token_id, "content": text, "single_word": False,
                                          "lstrip": False, "rstrip": False,
                                          "normalized": False, "special": True})
    with open(path, "w") as f:
        json.dump(tokenizer, f)
    return out_dir
