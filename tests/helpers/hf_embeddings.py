"""The reference embedding of a prompt: transformers' final-normed hidden
state of its last token (``AutoModel``, the decoder without its LM head),
L2-normalized, as a pooling server of the same checkpoint embeds it by
default (LAST pooling)."""

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
