"""Small random Hugging Face models saved as checkpoints, with HF's greedy
continuations as the reference (end-to-end parity tests)."""

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
