"""vLLM's ``random`` dataset: prompts of random token ids of the model's
tokenizer, decoded to text.

Each request's input and output lengths are drawn uniformly from the whole
numbers in ``[floor(L * (1 - r)), ceil(L * (1 + r))]`` (``r``:
``--random-range-ratio``, in [0, 1); the output's low end at least 1).
The input length excludes the tokens the tokenizer adds itself (a BOS):
the server counts those too, so a prompt of ``--random-input-len`` L is L
tokens as the server sees it. An optional shared prefix of
``--random-prefix-len`` random tokens comes first. Request i's own tokens
run through the tokenizer's ordinary tokens (special ones left out) from
a random offset: ``allowed[(offset + i + k) % len(allowed)]``. As in
vLLM, the vocabulary drawn from is Hugging Face's ``vocab_size``, the
tokens added to the model's vocabulary left out (``base_vocab_size``).

Token ids do not always survive decoding and encoding again (merges
across the boundary, bytes that are no whole character). The text is
re-encoded and the ids cut to the target length, or padded with random
ids, then decoded again, at most ``MAX_RETRIES`` times; the request keeps
the length its final text encodes to (``prompt_len``). All draws come from
one ``numpy.random.default_rng(seed)``, so a seed gives the same prompts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from checkpoint.tokenizer import Tokenizer

MAX_RETRIES = 10


@dataclass
class SampleRequest:
    prompt: str
    prompt_len: int
    expected_output_len: int
    request_id: str


def special_tokens_added(tokenizer: Tokenizer) -> int:
    """How many tokens ``encode`` adds to a text (a BOS, say)."""
    return len(tokenizer.encode("")) - len(tokenizer.encode("", add_special_tokens=False))


def base_vocab_size(tokenizer: Tokenizer) -> int:
    """Hugging Face's ``vocab_size``: the vocabulary without the tokens
    added to it (``Tokenizer.vocab_size`` counts those too), the bound of
    vLLM's random token ids."""
    return tokenizer.hf.get_vocab_size(with_added_tokens=False)


def length_range(length: int, range_ratio: float, at_least: int = 0) -> tuple[int, int]:
    """The inclusive range lengths are drawn from around ``length``."""
    low = max(math.floor(length * (1 - range_ratio)), at_least)
    return low, max(math.ceil(length * (1 + range_ratio)), at_least)


def random_requests(tokenizer: Tokenizer, num_prompts: int, input_len: int, output_len: int,
                    range_ratio: float = 0.0, prefix_len: int = 0, seed: int = 0,
                    request_id_prefix: str = "") -> list[SampleRequest]:
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    if num_prompts < 1:
        raise ValueError(f"--num-prompts must be at least 1, got {num_prompts}")
    own_len = max(0, input_len - special_tokens_added(tokenizer))
    in_low, in_high = length_range(own_len, range_ratio)
    if prefix_len + in_low < 1:
        raise ValueError(f"--random-input-len {input_len} leaves no prompt token (the "
                         f"tokenizer adds {input_len - own_len} itself)")
    out_low, out_high = length_range(output_len, range_ratio, at_least=1)
    rng = np.random.default_rng(seed)
    input_lens = rng.integers(in_low, in_high + 1, size=num_prompts)
    output_lens = rng.integers(out_low, out_high + 1, size=num_prompts)
    vocab_size = base_vocab_size(tokenizer)
    offsets = rng.integers(0, vocab_size, size=num_prompts)
    allowed = np.array(sorted(set(range(vocab_size)) - tokenizer.special_ids))
    prefix = allowed[rng.integers(0, len(allowed), size=prefix_len)].tolist()
    requests = []
    for i in range(num_prompts):
        own = allowed[(offsets[i] + i + np.arange(input_lens[i])) % len(allowed)].tolist()
        prompt, length = _text_of_length(tokenizer, prefix + own, prefix_len + int(input_lens[i]),
                                         rng)
        requests.append(SampleRequest(prompt, length + input_len - own_len,
                                      int(output_lens[i]), f"{request_id_prefix}{i}"))
    return requests


def _text_of_length(tokenizer: Tokenizer, ids: list[int], target: int,
                    rng: np.random.Generator) -> tuple[str, int]:
    """A text near ``ids`` that encodes (without special tokens) to
    ``target`` ids where ``MAX_RETRIES`` rounds find one; the text and the
    number of ids it encodes to. A round that is long cuts the text to the
    last whole character within ``target`` ids (cutting ids alone can
    split a character, whose remains decode to a longer replacement); one
    that is short pads with single-character ASCII tokens, which decode and
    encode back to themselves."""
    text = tokenizer.decode(ids, skip_special_tokens=False)
    for _ in range(MAX_RETRIES):
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) == target:
            break
        if len(ids) > target:
            text = tokenizer.decode(ids[:target], skip_special_tokens=False)
            while text and len(tokenizer.encode(text, add_special_tokens=False)) > target:
                text = text[:-1]
        else:
            text += tokenizer.decode(_plain_ids(tokenizer, target - len(ids), rng),
                                     skip_special_tokens=False)
    return text, len(tokenizer.encode(text, add_special_tokens=False))


def _plain_ids(tokenizer: Tokenizer, count: int, rng: np.random.Generator) -> list[int]:
    """``count`` random ids whose text is one printable ASCII character
    that encodes back to the same id (none found: random ids)."""
    found: list[int] = []
    vocab_size = base_vocab_size(tokenizer)
    for _ in range(64 * count):
        if len(found) == count:
            break
        token = int(rng.integers(0, vocab_size))
        text = tokenizer.decode([token], skip_special_tokens=False)
        if (len(text) == 1 and text.isascii() and text.isprintable()
                and tokenizer.encode(text, add_special_tokens=False) == [token]):
            found.append(token)
    return found + rng.integers(0, vocab_size, size=count - len(found)).tolist()
