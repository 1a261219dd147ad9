"""vLLM's ``custom`` dataset: the prompts of a local JSONL file, one
``{"prompt": TEXT}`` object a line (other fields are not read; blank
lines are skipped), each request ``--custom-output-len`` tokens long.

As vLLM's: the file's name ends with ``.jsonl``; the prompts are
shuffled with seed ``SHUFFLE_SEED`` whatever ``--seed`` says (vLLM's
custom dataset never receives the seed; ``--disable-shuffle`` keeps the
file's order) and the first ``--num-prompts`` taken, fewer oversampled
with the same seed (``--no-oversample``: not); each prompt is rendered as
a user message with the tokenizer's chat template and its generation
prompt (``--skip-chat-template``: sent as it is; ``--chat-template-kwargs``:
the template's variables), and its length counts
the rendered text's tokens with those the tokenizer adds (a BOS).
"""

from __future__ import annotations

import json

from checkpoint.tokenizer import Tokenizer
from launch.bench_serve.random_dataset import SampleRequest
from launch.bench_serve.sampling_order import oversampled, shuffled

# The seed of vLLM's custom dataset, which its benchmark does not pass on.
SHUFFLE_SEED = 0


def read_custom(path: str) -> list[str]:
    """The prompts of ``path``, in the file's order; ValueError naming the
    file (and the line) for one that cannot be read, is not JSONL of
    prompts, or holds none."""
    if not path.endswith(".jsonl"):
        raise ValueError(f"--dataset-name custom reads a JSONL file, its name ending with "
                         f".jsonl: got --dataset-path {path}")
    prompts = []
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    entry = json.loads(line)
                except ValueError as e:
                    raise ValueError(f"--dataset-path {path}: line {number} is not JSON: "
                                     f"{e}") from None
                if not isinstance(entry, dict) or not isinstance(entry.get("prompt"), str):
                    raise ValueError(f'--dataset-path {path}: line {number} is not an object '
                                     'with a text "prompt"')
                prompts.append(entry["prompt"])
    except OSError as e:
        raise ValueError(f"--dataset-path {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"--dataset-path {path} is not UTF-8 text: {e}") from None
    if not prompts:
        raise ValueError(f"--dataset-path {path} holds no prompt")
    return prompts


def custom_requests(prompts: list[str], tokenizer: Tokenizer, num_prompts: int,
                    output_len: int = 256, skip_chat_template: bool = False,
                    shuffle: bool = True, oversample: bool = True,
                    request_id_prefix: str = "",
                    chat_template_kwargs: dict | None = None) -> list[SampleRequest]:
    """``num_prompts`` requests of ``prompts`` (module docstring);
    ValueError for a tokenizer without the chat template it needs."""
    if not skip_chat_template and tokenizer.chat_template is None:
        raise ValueError("--dataset-name custom renders each prompt with the tokenizer's chat "
                         "template, and this tokenizer has none: give --skip-chat-template")
    requests = []
    for i, prompt in enumerate(shuffled(prompts, SHUFFLE_SEED, shuffle)[:num_prompts]):
        if not skip_chat_template:
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                   add_generation_prompt=True, tokenize=False,
                                                   **(chat_template_kwargs or {}))
        requests.append(SampleRequest(prompt, len(tokenizer.encode(prompt)), output_len,
                                      f"{request_id_prefix}{i}"))
    if not oversample:
        return requests
    return oversampled(requests, num_prompts, SHUFFLE_SEED, request_id_prefix)
