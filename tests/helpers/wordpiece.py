"""A BERT-style tokenizer, whose WordPiece decoder puts a space before
every token but a "##" one, added tokens included; a small random Llama
over it.

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
