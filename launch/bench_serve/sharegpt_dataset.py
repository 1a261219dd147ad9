"""vLLM's ``sharegpt`` dataset: the first two turns of conversations of a
local ShareGPT JSON file, the first the prompt, the second the answer
whose length is the request's output length.

The file is a JSON list of objects; an entry whose ``conversations`` has
fewer than two turns (or none) is left out, as vLLM leaves it out, and
each turn kept is an object with a text ``value`` (its ``from`` is not
read). The entries kept are shuffled by ``--seed`` (``sampling_order``;
none with ``--disable-shuffle``) and taken in that order, each as a
request unless vLLM's length filter drops it: a prompt of fewer than
``MIN_LEN`` or more than ``MAX_PROMPT_LEN`` tokens, an answer of fewer
than ``MIN_LEN`` (not checked under ``--sharegpt-output-len``, which sets
every output length), or both together more than ``MAX_TOTAL_LEN``.
Lengths count the tokens the tokenizer adds (a BOS), as vLLM's do. Fewer
requests than ``--num-prompts`` are oversampled (``--no-oversample``: not).
"""

from __future__ import annotations

import json

from checkpoint.tokenizer import Tokenizer
from launch.bench_serve.random_dataset import SampleRequest
from launch.bench_serve.sampling_order import oversampled, shuffled

# vLLM's length filter, in tokens.
MIN_LEN = 4
MAX_PROMPT_LEN = 1024
MAX_TOTAL_LEN = 2048


def read_sharegpt(path: str) -> list[tuple[str, str]]:
    """The (prompt, answer) of each conversation of ``path`` with two turns
    or more, in the file's order; ValueError naming the file for one that
    cannot be read or is not ShareGPT JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise ValueError(f"--dataset-path {path}: {e.strerror}") from None
    except ValueError as e:  # not JSON, or not UTF-8
        raise ValueError(f"--dataset-path {path} is not a ShareGPT JSON file: {e}") from None
    if not isinstance(data, list):
        raise ValueError(f"--dataset-path {path} is not a ShareGPT JSON file: it holds a "
                         f"{type(data).__name__}, not a list of conversations")
    pairs = []
    for i, entry in enumerate(data):
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or not isinstance(turns, (list, type(None))):
            raise ValueError(f"--dataset-path {path}: entry {i} is not a conversation (an "
                             'object with a "conversations" list)')
        if turns is None or len(turns) < 2:
            continue
        texts = [t.get("value") if isinstance(t, dict) else None for t in turns[:2]]
        if not all(isinstance(text, str) for text in texts):
            raise ValueError(f'--dataset-path {path}: entry {i}: its first two turns need a '
                             'text "value"')
        pairs.append((texts[0], texts[1]))
    return pairs


def kept(prompt_len: int, output_len: int, output_len_given: bool) -> bool:
    """Whether vLLM's length filter keeps a request of these lengths."""
    return (MIN_LEN <= prompt_len <= MAX_PROMPT_LEN
            and (output_len_given or output_len >= MIN_LEN)
            and prompt_len + output_len <= MAX_TOTAL_LEN)


def sharegpt_requests(pairs: list[tuple[str, str]], tokenizer: Tokenizer, num_prompts: int,
                      output_len: int | None = None, seed: int = 0, shuffle: bool = True,
                      oversample: bool = True,
                      request_id_prefix: str = "") -> list[SampleRequest]:
    """``num_prompts`` requests of ``pairs`` (module docstring);
    ``output_len``: ``--sharegpt-output-len`` (None: each answer's length).
    ValueError when the filter keeps none."""
    requests: list[SampleRequest] = []
    for prompt, answer in shuffled(pairs, seed, shuffle):
        if len(requests) == num_prompts:
            break
        prompt_len = len(tokenizer.encode(prompt))
        wanted = len(tokenizer.encode(answer)) if output_len is None else output_len
        if kept(prompt_len, wanted, output_len is not None):
            requests.append(SampleRequest(prompt, prompt_len, wanted,
                                          f"{request_id_prefix}{len(requests)}"))
    if not requests:
        raise ValueError(f"no conversation of the ShareGPT file passes vLLM's length filter "
                         f"(a prompt of {MIN_LEN} to {MAX_PROMPT_LEN} tokens, an answer of at "
                         f"least {MIN_LEN}, both at most {MAX_TOTAL_LEN})")
    return oversampled(requests, num_prompts, seed, request_id_prefix) if oversample else requests
