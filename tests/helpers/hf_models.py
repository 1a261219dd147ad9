"""Small random Hugging Face models saved as checkpoints, with HF's greedy
continuations as the reference (end-to-end parity tests)."""

import json

import torch


def small_llama(seed: int, vocab_size: int, **fields):
    """A random float32 HF LlamaForCausalLM of two layers, hidden size 64
    (MLP 128), untied head, bos 0 and eos the last token id; ``fields``
    set the heads and anything else of the config."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=vocab_size - 1, **fields)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config)


def save_spread(model, path, scale: float = 8.0) -> str:
    """Multiply ``model``'s lm_head by ``scale`` (logits far apart, so the
    top tokens are few and clear), save it and the byte tokenizer under
    ``path``; return the path as text."""
    from checkpoint.tiny_model import build_tokenizer

    model.eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    model.save_pretrained(path)
    build_tokenizer().save(str(path / "tokenizer.json"))
    return str(path)


# The prompts (token ids) the pooling tests run in one batch, and the token
# budget per step that chunks the long ones (LAST pooling over chunked
# prefill).
POOLING_PROMPTS = [
    [5, 17, 99, 3],
    list(range(1, 40)),  # longer than POOLING_CHUNK: chunked prefill
    [42],
    [(7 * i) % 200 + 1 for i in range(21)],
]
POOLING_CHUNK = 16


def save_embedding_llama(path, pad_token: bool = False) -> str:
    """The small random Llama that the embedding routes' tests serve (seed 5;
    320 token ids, the byte tokenizer's 259 among them; 64 positions), saved
    with ``save_spread`` under ``path``; the path as text. Its vectors are
    checked against ``LLM.embed`` or transformers on the same checkpoint.
    ``pad_token``: its tokenizer names "<pad>" its pad token, which a score
    counts once between a pair's texts."""
    model = small_llama(5, 320, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=64, rms_norm_eps=1e-6)
    saved = save_spread(model, path)
    if pad_token:
        with open(f"{saved}/tokenizer_config.json", "w") as f:
            json.dump({"pad_token": "<pad>"}, f)
    return saved


def save_with_greedy_reference(model, path, prompts: list[list[int]],
                               max_tokens: int) -> list[list[int]]:
    """Spread ``model``'s logits (its lm_head times 20, so greedy never meets a
    near tie), save it and the byte tokenizer under ``path``; return HF's
    greedy ``max_tokens`` continuation of each prompt (eos ignored)."""
    from checkpoint.tiny_model import build_tokenizer

    model.eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    model.save_pretrained(path)
    build_tokenizer().save(str(path / "tokenizer.json"))
    with torch.no_grad():
        return [model.generate(torch.tensor([p]), max_new_tokens=max_tokens, do_sample=False,
                               eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
                for p in prompts]


# A SentencePiece-style vocabulary: each letter as a word's start ("▁a") and
# inside a word ("a"), as Llama 2's and Mistral's tokenizers have them, then
# punctuation and digits (enough to write JSON).
SPM_PIECES = ["<unk>", "<s>", "</s>", *("\u2581" + c for c in "abcdefghijklmnopqrstuvwxyz"),
              *"abcdefghijklmnopqrstuvwxyz", "\u2581", ".", ",", *'{}[]":', *"0123456789"]
SPM_WORD_STARTS = list(range(3, 29))  # the ids of "▁a" .. "▁z"


def sentencepiece_style_tokenizer():
    """A ``tokenizers.Tokenizer`` over ``SPM_PIECES`` with SentencePiece's
    Metaspace pre-tokenizer and decoder: the decoder drops the leading space
    of the first token it decodes (bos <s> 1, eos </s> 2, special)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE(vocab={p: i for i, p in enumerate(SPM_PIECES)}, merges=[],
                               unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok.add_special_tokens([AddedToken(p, special=True) for p in SPM_PIECES[:3]])
    return tok


def save_sentencepiece_style(path) -> str:
    """A small random Llama over ``SPM_PIECES`` (logits spread) with the
    SentencePiece-style tokenizer, saved under ``path``; the path as text."""
    import json

    model = small_llama(3, len(SPM_PIECES), num_attention_heads=4, num_key_value_heads=2)
    for config in (model.config, model.generation_config):
        config.bos_token_id, config.eos_token_id = 1, 2
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(path)
    sentencepiece_style_tokenizer().save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True}))
    return str(path)


def save_classifier(path, num_labels: int, seed: int = 11, **config_fields) -> str:
    """A random float32 HF ``LlamaForSequenceClassification`` (two layers,
    hidden size 64, GQA, 320 token ids, 64 positions) with ``num_labels``
    labels named ``id2label`` "label-<i>" (and ``config_fields`` in its
    config.json, e.g. ``problem_type`` or a sentence-transformers
    activation), saved with the byte tokenizer under ``path``; the path as
    text."""
    import transformers

    from checkpoint.tiny_model import build_tokenizer

    config = transformers.LlamaConfig(
        vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=0, eos_token_id=319,
        num_labels=num_labels, id2label={i: f"label-{i}" for i in range(num_labels)},
        **config_fields)
    torch.manual_seed(seed)
    model = transformers.LlamaForSequenceClassification(config).eval()
    with torch.no_grad():  # logits well apart from zero (HF inits the head small)
        model.score.weight.normal_(0.0, 0.5)
    model.save_pretrained(path)
    build_tokenizer().save(str(path / "tokenizer.json"))
    return str(path)
