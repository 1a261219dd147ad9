"""The floors every benchmark compares with, measured in the run that uses them.

Decode floor of a step = bytes a step must read / the device's best streaming
bandwidth. Bytes: every weight once, except the embedding table, of which a
step reads one row per token (a table tied to the LM head is read whole as
the head, so it stays counted once), plus the KV of the batch (K and V of
every context token of every request, every layer, in the cache's dtype).
Bandwidth: the best of three kernels over a buffer far larger than any cache,
each timed here: a torch reduction (``x.sum()``, read only), a Triton kernel
that loads every element and keeps one float per program (read only; CUDA
only) and a device copy (read + write bytes). The JSON names the one used.

Prefill floor = FLOPs a prefill must do / the bf16 matmul throughput of one
large ``torch.matmul`` timed here in a short burst (``matmul_tflops``, which
also measures the lower rate a long run holds under the power limit).
FLOPs: 2 a weight of every decoder layer's projections for every prompt
token, the LM head for each prompt's last token only (the one position a
prefill samples; tied or not), and causal attention's two products, q.k and
p.v, for every query head over the keys each token sees (its own position
and those before it).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from benchmarks.common import time_per_call
from checkpoint.description import from_hf_dict
from ipc.model_config import ModelConfig


def _triton_read_bandwidth(src: torch.Tensor) -> float:
    """Bytes per second read by a Triton kernel that loads every element once
    (the best of a few tile configurations)."""
    from benchmarks import triton_read

    best = 0.0
    for config in triton_read.CONFIGS:
        partial = triton_read.partial_sums(src, config)
        seconds = time_per_call(lambda p=partial, c=config: triton_read.read_all(src, p, c),
                                src.device)
        best = max(best, src.numel() * src.element_size() / seconds)
    return best


def measure_bandwidth(device: torch.device, nbytes: int = 4 << 30) -> dict:
    """Streaming bandwidths in GB/s over a buffer of ``nbytes`` (bf16), and the best.

    Returns {"read_sum_GBps", "read_triton_GBps" (None off CUDA), "copy_GBps",
    "used": the best one's name, "used_GBps"}. The copy counts bytes read +
    written, the reads bytes read.
    """
    src = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=device)
    found = {"read_sum": nbytes / time_per_call(lambda: src.sum(), device),
             "read_triton": None}
    if device.type == "cuda":
        found["read_triton"] = _triton_read_bandwidth(src)
    dst = torch.empty_like(src)
    found["copy"] = 2 * nbytes / time_per_call(lambda: dst.copy_(src), device)
    used = max((k for k, v in found.items() if v is not None), key=lambda k: found[k])
    result = {f"{k}_GBps": None if v is None else round(v / 1e9, 1) for k, v in found.items()}
    return {**result, "used": used, "used_GBps": round(found[used] / 1e9, 1)}


def unique_tensors(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Each storage once (a tied LM head is the embedding's own tensor)."""
    seen, out = set(), []
    for t in tensors:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            out.append(t)
    return out


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def decode_weight_bytes(params: Iterable[torch.Tensor], embedding: torch.Tensor,
                        lm_head: torch.Tensor, batch: int) -> int:
    """Weight bytes a decode step of ``batch`` tokens reads.

    Every parameter once, but an untied embedding table only as ``batch`` rows
    (a step looks up one row per token); a tied one is the LM head's weight and
    is read whole. ``embedding`` [vocab(/tp), hidden] and ``lm_head`` are the
    tensors in ``params``.
    """
    total = sum(nbytes(t) for t in unique_tensors(params))
    if embedding.data_ptr() == lm_head.data_ptr():
        return total
    row = embedding.shape[-1] * embedding.element_size()
    return total - nbytes(embedding) + min(batch, embedding.shape[0]) * row


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                       dtype: torch.dtype) -> int:
    """K and V of one token over all layers, in the cache's dtype."""
    return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def decode_floor(weight_bytes: int, kv_per_token: int, batch: int, context: int,
                 bandwidth: dict) -> dict:
    """{"floor_ms", "floor_GB"} of a decode step of ``batch`` requests of
    ``context`` tokens each, at ``bandwidth["used_GBps"]``."""
    total = weight_bytes + batch * context * kv_per_token
    return {"floor_ms": round(total / (bandwidth["used_GBps"] * 1e9) * 1e3, 4),
            "floor_GB": round(total / 1e9, 3)}


def matmul_tflops(device: torch.device, n: int = 8192, dtype=torch.bfloat16,
                  sustain_s: float = 0.0) -> tuple[float, float | None]:
    """Dense matmul throughput (TFLOP/s) of an n x n x n ``torch.matmul``:
    (burst, held).

    The burst is the best rate of 20 calls (2 on CPU), the one the prefill
    floor uses. A GPU that raises its clock while it is under its power
    limit runs such a burst faster than it can hold. Held, with
    ``sustain_s`` > 0: the calls of another ``sustain_s`` seconds timed
    after ``sustain_s`` seconds of back-to-back calls (counted from the
    burst's time a call), the rate the device holds over a run that long,
    for comparison; None with ``sustain_s`` 0."""
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    out = torch.empty(n, n, dtype=dtype, device=device)
    flops = 2 * n**3
    iters = 20 if device.type == "cuda" else 2
    seconds = time_per_call(lambda: torch.matmul(a, b, out=out), device, iters=iters)
    if sustain_s <= 0:
        return flops / seconds / 1e12, None
    iters = max(1, round(sustain_s / seconds))
    held_s = time_per_call(lambda: torch.matmul(a, b, out=out), device, iters=iters,
                           warmup=iters)
    return flops / seconds / 1e12, flops / held_s / 1e12


def layer_matmul_params(config: dict) -> int:
    """Weights of one decoder layer's projections (q, k, v, o, gate, up,
    down) in a Llama config.json: the ones a token multiplies."""
    return _projection_weights(from_hf_dict(config))


def _projection_weights(c: ModelConfig) -> int:
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    return c.hidden_size * (q + 2 * kv) + q * c.hidden_size + 3 * c.hidden_size * c.intermediate_size


def prefill_flops(config: dict, prompts: int, prompt_len: int) -> int:
    """FLOPs of a prefill of ``prompts`` fresh prompts of ``prompt_len``
    tokens (module docstring) for a Llama config.json: projections, one
    LM-head row a prompt, and causal attention, where token i of a prompt
    sees i + 1 keys."""
    c = from_hf_dict(config)
    projections = 2 * c.num_hidden_layers * _projection_weights(c) * prompts * prompt_len
    lm_head = 2 * c.vocab_size * c.hidden_size * prompts
    seen = prompt_len * (prompt_len + 1) // 2  # keys seen, summed over a prompt's tokens
    attention = 2 * 2 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * seen * prompts
    return projections + lm_head + attention


def prefill_flop_floor_s(flops: int, tflops: float) -> float:
    """Seconds for ``flops`` at ``tflops`` (attention's products counted at
    the dense matmul's rate, which they do not exceed)."""
    return flops / (tflops * 1e12)
