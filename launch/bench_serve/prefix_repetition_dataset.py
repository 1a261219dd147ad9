"""vLLM's ``prefix_repetition`` dataset: random prompts that share a few
prefixes, for prefix caching.

``--prefix-repetition-num-prefixes`` P prefixes of
``--prefix-repetition-prefix-len`` random tokens each, and after each
prefix ``--num-prompts // P`` prompts of its own
``--prefix-repetition-suffix-len`` random tokens (so ``P * (N // P)``
requests, fewer than N when P does not divide it, as in vLLM), each
asking for ``--prefix-repetition-output-len`` tokens. The requests are
then shuffled (``--disable-shuffle``: prefix by prefix).

vLLM's draws, in vLLM's order: the tokens are numpy's legacy
``randint(0, V)`` of a ``RandomState(seed)``, where V is the vocabulary
without the tokens added to it (Hugging Face's ``vocab_size``): a prefix,
then its suffixes, then the next prefix. Each piece's text is made to
encode back to its length as vLLM does it (``exact_length_tokens``), the
padding drawn from the same generator; the shuffle is Python's
``random.Random(seed)``. A prompt is the text of its prefix's ids and its
suffix's ids decoded together (special tokens kept) and its length their
count. Request ids number the shuffled requests (vLLM sends this dataset
without ids).
"""

from __future__ import annotations

import random

import numpy as np

from checkpoint.tokenizer import Tokenizer
from launch.bench_serve.random_dataset import SampleRequest, base_vocab_size

# vLLM's decode-and-encode rounds after the first.
MAX_RETRIES = 10


def check_prefix_repetition(num_prompts: int, prefix_len: int, suffix_len: int,
                            num_prefixes: int, output_len: int) -> None:
    """ValueError naming the option for lengths and counts that make no
    requests (checked before anything starts)."""
    for option, value, least in (("--prefix-repetition-prefix-len", prefix_len, 0),
                                 ("--prefix-repetition-suffix-len", suffix_len, 0),
                                 ("--prefix-repetition-num-prefixes", num_prefixes, 1),
                                 ("--prefix-repetition-output-len", output_len, 1)):
        if value < least:
            raise ValueError(f"{option} must be at least {least}, got {value}")
    if prefix_len + suffix_len < 1:
        raise ValueError("--prefix-repetition-prefix-len and --prefix-repetition-suffix-len "
                         "are both 0: the prompts would be empty")
    if num_prompts < num_prefixes:
        raise ValueError(f"--num-prompts ({num_prompts}) must be at least "
                         f"--prefix-repetition-num-prefixes ({num_prefixes})")


def exact_length_tokens(tokenizer: Tokenizer, length: int,
                        draws: np.random.RandomState) -> list[int]:
    """``length`` random ids whose text encodes back to ``length`` ids
    where ``MAX_RETRIES`` rounds find one: vLLM's rounds, each decoding the
    ids and encoding the text again (without added tokens), then cutting
    ids that are too many or drawing more ids for those too few. The ids
    of the last round's text."""
    vocab_size = base_vocab_size(tokenizer)
    ids = draws.randint(0, vocab_size, size=length).tolist()
    for retries_left in range(MAX_RETRIES, -1, -1):
        ids = tokenizer.encode(tokenizer.decode(ids, skip_special_tokens=False),
                               add_special_tokens=False)
        if retries_left == 0 or len(ids) == length:
            break
        if len(ids) < length:
            ids += draws.randint(0, vocab_size, size=length - len(ids)).tolist()
        else:
            ids = ids[:length]
    return ids


def prefix_repetition_requests(tokenizer: Tokenizer, num_prompts: int, prefix_len: int = 256,
                               suffix_len: int = 256, num_prefixes: int = 10,
                               output_len: int = 128, seed: int = 0, shuffle: bool = True,
                               request_id_prefix: str = "") -> list[SampleRequest]:
    """The requests of the module docstring; vLLM's defaults."""
    check_prefix_repetition(num_prompts, prefix_len, suffix_len, num_prefixes, output_len)
    draws = np.random.RandomState(seed)
    pieces = []
    for _ in range(num_prefixes):
        prefix = exact_length_tokens(tokenizer, prefix_len, draws)
        pieces += [prefix + exact_length_tokens(tokenizer, suffix_len, draws)
                   for _ in range(num_prompts // num_prefixes)]
    if shuffle:
        random.Random(seed).shuffle(pieces)
    return [SampleRequest(tokenizer.decode(ids, skip_special_tokens=False), len(ids), output_len,
                          f"{request_id_prefix}{i}") for i, ids in enumerate(pieces)]
