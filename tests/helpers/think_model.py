"""``tiny`` as a reasoning model: its tokenizer with ``<think>`` and
``</think>`` added (not special, as Qwen3 and DeepSeek-R1 hold them, so
they show in text), and a chat template that places them as those models'
templates do.

The two tokens take ids 259 and 260, rows of ``tiny``'s padding whose
LM-head rows are zero: the model can sample them (a logit of 0 among
logits of spread about 2), rarely unless a ``logit_bias`` helps it.

The template is ``tiny``'s, with the generation prompt followed by, as
``chat_template_kwargs`` ask: ``open_think`` true, an open thinking
(DeepSeek-R1's template, which reads no ``enable_thinking``: the output
begins inside it); else ``enable_thinking`` false, a closed empty one
(Qwen3's template: the prompt ends the reasoning); else nothing (the model
opens its thinking itself).
"""

from __future__ import annotations

import os

from checkpoint.tiny_model import CHAT_TEMPLATE
from tests.helpers.tiny_copies import tiny_with_chat_template

THINK, END_THINK = 259, 260

THINK_TEMPLATE = CHAT_TEMPLATE.replace(
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}",
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}"
    "{% if open_think is defined and open_think %}{{ '<think>\n' }}"
    "{% elif enable_thinking is defined and not enable_thinking %}"
    "{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    "{% endif %}")
assert THINK_TEMPLATE != CHAT_TEMPLATE


def tiny_with_think_tokens(cache_dir: str, out_dir: str) -> str:
    """A copy of ``tiny`` (written under ``cache_dir``) in ``out_dir`` with
    the two tokens and ``THINK_TEMPLATE``; its path."""
    from tokenizers import AddedToken, Tokenizer

    tiny_with_chat_template(cache_dir, out_dir, THINK_TEMPLATE)
    path = os.path.join(out_dir, "tokenizer.json")
    tokenizer = Tokenizer.from_file(path)
    tokenizer.add_tokens([AddedToken("<think>", special=False, normalized=False),
                          AddedToken("</think>", special=False, normalized=False)])
    assert (tokenizer.token_to_id("<think>"), tokenizer.token_to_id("</think>")) == (
        THINK, END_THINK)
    tokenizer.save(path)
    return out_dir


def tiny_writing_think_tokens(cache_dir: str, out_dir: str, start_as: int,
                              end_as: int) -> str:
    """``tiny_with_think_tokens`` whose ``<think>`` and ``</think>`` take
    over the weights of byte tokens ``start_as`` and ``end_as`` (their
    embedding and LM-head rows swapped): the model is ``tiny`` with those
    two tokens renamed, so it writes the tags where ``tiny`` writes the
    bytes, in its repeating runs too (where n-gram drafts hold them); its
    path."""
    from safetensors.torch import load_file, save_file

    tiny_with_think_tokens(cache_dir, out_dir)
    path = os.path.join(out_dir, "model.safetensors")
    weights = load_file(path)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        rows = weights[name].clone()
        for byte, tag in ((start_as, THINK), (end_as, END_THINK)):
            rows[[byte, tag]] = rows[[tag, byte]]
        weights[name] = rows
    save_file(weights, path, metadata={"format": "pt"})
    return out_dir
