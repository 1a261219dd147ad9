"""A BERT-style tokenizer, whose WordPiece decoder puts a space before
every token but a "##" one, added tokens included; a small random Llama
over it; and vLLM's detokenizer of a fast tokenizer written out, the
reference text of an output.

The vocabulary: words and a "##" suffix, then the added tokens: "[CLS]"
(bos) and "[SEP]" (eos), special, and "<x>", added but not special.
"""

from __future__ import annotations

import json

import torch

WP_WORDS = ["[UNK]", "the", "cat", "sat", "on", "mat", "##s", "."]
CLS, SEP, X = len(WP_WORDS), len(WP_WORDS) + 1, len(WP_WORDS) + 2
WP_VOCAB_SIZE = len(WP_WORDS) + 3
# A chat template that writes the messages' contents one after another.
WP_CHAT_TEMPLATE = "{% for m in messages %}{{ m.content }} {% endfor %}"


def wordpiece_tokenizer():
    """The ``tokenizers.Tokenizer`` described above."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(WP_WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(cleanup=False)
    tok.add_special_tokens([AddedToken("[CLS]", special=True), AddedToken("[SEP]", special=True)])
    tok.add_tokens([AddedToken("<x>", special=False)])
    assert tok.token_to_id("<x>") == X and tok.get_vocab_size() == WP_VOCAB_SIZE
    return tok


def save_wordpiece_model(path) -> str:
    """A small random Llama over the vocabulary (bos [CLS], eos [SEP]) with
    this tokenizer and ``WP_CHAT_TEMPLATE``, saved under ``path``; the path
    as text."""
    from tests.helpers.hf_models import small_llama

    model = small_llama(5, WP_VOCAB_SIZE, num_attention_heads=4, num_key_value_heads=2)
    for config in (model.config, model.generation_config):
        config.bos_token_id, config.eos_token_id = CLS, SEP
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    model.save_pretrained(path)
    wordpiece_tokenizer().save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "[CLS]", "eos_token": "[SEP]", "add_bos_token": True,
         "chat_template": WP_CHAT_TEMPLATE}))
    return str(path)


def vllm_fast_text(hf, prompt_ids: list[int], output_ids: list[int],
                   skip_special_tokens: bool = True,
                   spaces_between_special_tokens: bool = True) -> str:
    """The text vLLM's detokenizer of a fast tokenizer gives ``output_ids``
    after ``prompt_ids``, written out over ``tokenizers``' ``DecodeStream``
    (``hf``: a ``tokenizers.Tokenizer``): the stream is primed with the
    prompt (from five tokens on, its shortest suffix of at least four
    tokens that decodes without U+FFFD, at most 23; else the whole prompt),
    then stepped through the output, a step with no text adding none. With
    special tokens shown and ``spaces_between_special_tokens`` False, a step
    whose token is an added token (special or not) right after another of
    the output adds that token's own text instead."""
    from tokenizers.decoders import DecodeStream

    stream = DecodeStream(skip_special_tokens=skip_special_tokens)
    primer = prompt_ids
    if len(prompt_ids) > 4:
        for n in range(4, min(len(prompt_ids) + 1, 24)):
            if "\ufffd" not in hf.decode(prompt_ids[-n:]):
                primer = prompt_ids[-n:]
                break
    for token in primer:
        stream.step(hf, token)
    added = {i: t.content for i, t in hf.get_added_tokens_decoder().items()}
    bare = not skip_special_tokens and not spaces_between_special_tokens
    text, after_added = "", False
    for token in output_ids:
        piece = stream.step(hf, token) or ""
        if bare and token in added and after_added:
            piece = added[token]
        after_added = token in added
        text += piece
    return text
