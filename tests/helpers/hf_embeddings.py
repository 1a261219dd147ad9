"""The reference embedding of a prompt: transformers' final-normed hidden
state of its last token (``AutoModel``, the decoder without its LM head),
L2-normalized, as a pooling server of the same checkpoint embeds it by
default (LAST pooling)."""

from collections.abc import Callable

import numpy as np
import torch
import transformers  # the oracle: a test dependency, never skipped


def hf_last_token_embeddings(model_dir: str, prompts: list[list[int]]) -> list[np.ndarray]:
    """Each prompt's reference embedding (float64), in prompt order."""
    base = transformers.AutoModel.from_pretrained(model_dir, dtype=torch.float32)
    base.eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            last = base(torch.tensor([ids])).last_hidden_state[0, -1].double().numpy()
            out.append(last / np.linalg.norm(last))
    return out


def hf_cosine_scorer(model_dir: str, tokens: dict[str, list[int]]) -> Callable[[str, str], float]:
    """The reference score of two of ``tokens``' texts (text -> its ids), as
    an embedding model's /score gives it: the cosine of their reference
    embeddings."""
    embedded = dict(zip(tokens, hf_last_token_embeddings(model_dir, list(tokens.values()))))

    def score(a: str, b: str) -> float:
        x, y = embedded[a], embedded[b]
        return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))
    return score


def hf_token_hidden_states(model_dir: str, ids: list[int]) -> np.ndarray:
    """transformers' final-normed hidden state of every token of ``ids``
    (float64, ``[len(ids), hidden]``), as a "token_embed" request pools
    them before its normalization (``AutoModel``: the decoder alone, the
    base of a sequence classifier too)."""
    base = transformers.AutoModel.from_pretrained(model_dir, dtype=torch.float32)
    base.eval()
    with torch.no_grad():
        return base(torch.tensor([ids])).last_hidden_state[0].double().numpy()
