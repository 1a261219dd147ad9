"""Small random Hugging Face models saved as checkpoints, with HF's greedy
continuations as the reference (end-to-end parity tests)."""

import torch


def save_with_greedy_reference(model, path, prompts: list[list[int]],
                               max_tokens: int) -> list[list[int]]:
    """Spread ``model``'s logits (its lm_head times 20, so greedy never meets a
    near tie), save it and the byte tokenizer under ``path``; return HF's
    greedy ``max_tokens`` continuation of each prompt (eos ignored)."""
    from engine.tiny_model import build_tokenizer

    model.eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    model.save_pretrained(path)
    build_tokenizer().save(str(path / "tokenizer.json"))
    with torch.no_grad():
        return [model.generate(torch.tensor([p]), max_new_tokens=max_tokens, do_sample=False,
                               eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
                for p in prompts]
