"""Stateless Gumbel noise: a pure function of (seed, position, token id).

With all arithmetic on unsigned 64-bit integers modulo 2**64 and ``mix`` the
splitmix64 finaliser, the uniform draw of token ``t`` for a request with
seed ``s`` sampling the token at position ``p`` is::

    row  = mix(mix(s) + p * ROW_MUL)
    bits = mix(row ^ mix((t + 1) * TOKEN_MUL))
    u    = ((bits >> 41) + 0.5) / 2**23        # top 23 bits

so ``0 < u < 1`` holds exactly in float32 (both ``2**-24`` and
``1 - 2**-24`` are representable), and the Gumbel noise ``-log(-log(u))`` is
always finite. ``s`` is the seed's 64 bits (a negative seed in two's
complement), and ``mix`` is a bijection: every signed 64-bit seed is its
own key. Nothing else enters: a seeded request draws the same tokens
alone or in any batch, at any row, and every tensor-parallel rank draws the
same token without talking to the others.

Two implementations of the draw, bit-identical in the hash: the torch
reference here (CPU; it materialises [N, V] int64 temporaries) and, on CUDA,
a Triton kernel (``triton_noise.py``) that reads each row's temperature and
seed at its slot, scales, hashes, adds the noise and reduces the argmax per
vocab block in registers: a plain sampled step is one launch. Without the
noise the same kernel is the greedy argmax on CUDA (``greedy_argmax_triton``).
Torch lacks unsigned 64-bit arithmetic on some devices, so the reference
hashes int64 (two's complement wraps alike) with right shifts masked to act
as logical shifts; the kernel uses uint64.
"""

from __future__ import annotations

import torch

ROW_MUL = 0x9E3779B97F4A7C15
TOKEN_MUL = 0xD1B54A32D192ED03
_MIX_MUL1 = 0xBF58476D1CE4E5B9
_MIX_MUL2 = 0x94D049BB133111EB
_MASK64 = (1 << 64) - 1
UNIFORM_BITS = 23


def _signed(value: int) -> int:
    """An unsigned 64-bit constant as the int64 with the same bits."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_xor_(x: torch.Tensor, shift: int) -> torch.Tensor:
    """x ^= x >>> shift (logical shift), in place."""
    high = x >> shift
    high &= (1 << (64 - shift)) - 1
    x ^= high
    return x


def mix_(x: torch.Tensor) -> torch.Tensor:
    """The splitmix64 finaliser on an int64 tensor, in place (wrapping)."""
    _shift_xor_(x, 30)
    x *= _signed(_MIX_MUL1)
    _shift_xor_(x, 27)
    x *= _signed(_MIX_MUL2)
    return _shift_xor_(x, 31)


def mix_int(x: int) -> int:
    """The same finaliser on a Python int (the unsigned reference)."""
    x &= _MASK64
    x ^= x >> 30
    x = (x * _MIX_MUL1) & _MASK64
    x ^= x >> 27
    x = (x * _MIX_MUL2) & _MASK64
    return x ^ (x >> 31)


def row_keys(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """int64 [N]: mix(mix(seed) + position * ROW_MUL) per row."""
    key = mix_(seeds.to(torch.int64).clone())
    key += positions.to(torch.int64) * _signed(ROW_MUL)
    return mix_(key)


def token_keys(vocab_size: int, device: torch.device) -> torch.Tensor:
    """int64 [vocab_size]: mix((t + 1) * TOKEN_MUL) per token id t."""
    tokens = torch.arange(1, vocab_size + 1, device=device, dtype=torch.int64)
    return mix_(tokens * _signed(TOKEN_MUL))


def uniform_noise(
    seeds: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor
) -> torch.Tensor:
    """float32 [N, V] uniforms in (0, 1); ``tokens`` is ``token_keys(V, device)``."""
    bits = row_keys(seeds, positions)[:, None] ^ tokens[None, :]
    mix_(bits)
    bits >>= 64 - UNIFORM_BITS
    bits &= (1 << UNIFORM_BITS) - 1
    u = bits.to(torch.float32)
    u += 0.5
    u *= 2.0**-UNIFORM_BITS
    return u


def greedy_argmax_ref(logits: torch.Tensor, slots: torch.Tensor | None = None,
                      last_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """int64 [N]: ``logits.argmax(dim=-1)``, the first index on ties. With
    ``last_tokens``, each row's token is also stored at
    ``last_tokens[slots[row]]`` (``slots`` [N] int64): the request state
    that the next step's inputs read (``runner/request_state.py``), kept by
    the draw itself so that a step needs no launch of its own for it."""
    tokens = logits.argmax(dim=-1)
    if last_tokens is not None:
        last_tokens.index_copy_(0, slots, tokens.to(last_tokens.dtype))
    return tokens


def gumbel_argmax_ref(
    logits: torch.Tensor, slots: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor,
    positions: torch.Tensor, tokens: torch.Tensor, threshold: torch.Tensor | None = None,
    last_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """int64 [N]: the token each row draws. Row i of slot ``s = slots[i]``
    (int64) with ``t = temperature[s]`` takes the argmax of ``logits[i]``
    where t == 0 (greedy), else the argmax over tokens of ``logits[i] / t``
    plus the Gumbel noise of (``seeds[s]``, ``positions[i]``, token id),
    the logits below ``threshold[i]`` (the filters',
    ``filters.filter_thresholds_ref``) at -inf first. ``temperature``
    and ``seeds`` are per-slot tables, so a draw needs no gather.

    ``logits`` [N, V], any float dtype (computed on in float32), with
    filtered tokens at -inf (they never win: the noise is finite). A drawn
    row thus draws token t with probability softmax(logits[i] / t)[t].
    ``tokens`` is ``token_keys(V, device)`` (read by the torch reference
    only). With ``last_tokens``, row i's token is also stored at
    ``last_tokens[s]``, as ``greedy_argmax_ref`` stores it.
    """
    row_temperature = temperature[slots]
    greedy = (row_temperature == 0.0)[:, None]
    scores = logits.to(torch.float32)
    if threshold is not None:
        scores = scores.masked_fill(~greedy & (scores < threshold[:, None]), float("-inf"))
    scaled = scores / torch.where(greedy, 1.0, row_temperature[:, None])
    scores = torch.where(scores == float("-inf"), scores, scaled)  # not NaN at t = inf
    noise = uniform_noise(seeds[slots], positions, tokens)
    noise.log_().neg_().log_().neg_()  # -log(-log(u))
    drawn = torch.where(greedy, scores, scores + noise).argmax(dim=-1)
    if last_tokens is not None:
        last_tokens.index_copy_(0, slots, drawn.to(last_tokens.dtype))
    return drawn
