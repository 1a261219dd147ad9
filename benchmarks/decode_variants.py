"""Named variants of the decode step's kernel choices, for ``bench_decode.py --variants``.

A variant sets module attributes that the kernels' routing reads at each
call (their constants), runs, and puts them back (``applied``). The runner
captures its graphs anew under each (``ModelRunner.capture_graphs``), so a
variant may change which kernel serves a projection; it must not change
whether a forward carries the decoder norms (``CausalLM.carries_norms``
is asked once per size). "default" changes nothing: the code as it is.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import NamedTuple

from runner.attention import tuned_decode


class Variant(NamedTuple):
    description: str
    patches: tuple[tuple[str, str, object], ...]  # (module, attribute, value while applied)


def tuned_with_short_keys(short_keys: int) -> dict:
    """``TUNED_DECODE`` with ``short_keys`` set on the entries that have them."""
    return {key: launch._replace(short_keys=short_keys) if launch and launch.short_keys else launch
            for key, launch in tuned_decode.TUNED_DECODE.items()}


VARIANTS: dict[str, Variant] = {
    "default": Variant("the code's own choices", ()),
    "no-one-row-gemv": Variant(
        "one-row o projections through the skinny kernel, not runner/layers/triton_gemv.py",
        (("runner.layers.triton_gemv", "GEMV_MAX_K", 0),)),
    "no-early-gemv": Variant(
        "runner/layers/triton_gemv.py loads its first weight tile after the wait",
        (("runner.layers.triton_gemv", "GEMV_EARLY", False),)),
    "argmax-after-graph": Variant(
        "the greedy argmax launched by the sampler after the decode graph's replay, not "
        "inside the graph",
        (("runner.model_runner", "GREEDY_IN_GRAPH_MAX_ROWS", 0),)),
    **{f"filters-{block}x{warps}": Variant(
        f"runner/sampling/triton_filters.py reads {block} logits a loop step with {warps} warps",
        (("runner.sampling.triton_filters", "BLOCK", block),
         ("runner.sampling.triton_filters", "NUM_WARPS", warps)))
       for block, warps in ((2048, 8), (16384, 16))},
    "lm-head-cublas": Variant(
        "the LM head through cuBLAS at every row count (lm_head_matmul's Triton kernels off)",
        (("runner.layers.triton_skinny_matmul", "LM_HEAD_TRITON", False),)),
    "lm-head-medium-from-17": Variant(
        "the LM head of 2..16 rows through cuBLAS, of 17..64 through the medium kernel",
        (("runner.layers.triton_skinny_matmul", "LM_HEAD_MEDIUM_MIN_ROWS", 17),)),
    "lora-masked": Variant(
        "the LoRA delta as the torch masked form over every adapter slot at every step size, "
        "not runner/lora/triton_lora.py's kernels at one token",
        (("runner.lora.triton_lora", "LORA_TRITON", False),)),
    "lora-triton-all": Variant(
        "the LoRA delta through runner/lora/triton_lora.py's kernels at every step size",
        (("runner.lora.triton_lora", "LORA_TRITON_MAX_TOKENS", 1 << 30),)),
    "kv-offsets-64": Variant(
        "paged attention computes its cache offsets in int64 whatever the cache's size",
        (("runner.attention.triton_unified", "KV_OFFSETS_32", False),)),
    "pointer-tiles-only": Variant(
        "no tuned decode launch reads short rows one cache block a tile (short_keys 0)",
        (("runner.attention.tuned_decode", "TUNED_DECODE", tuned_with_short_keys(0)),)),
    "short-keys-2048": Variant(
        "the tuned launches with short_keys read rows of up to 2048 keys that way",
        (("runner.attention.tuned_decode", "TUNED_DECODE", tuned_with_short_keys(2048)),)),
}

# The sampler's other choices, one variant each (the sampled path's A/B).
SAMPLER_VARIANTS = ("filters-2048x8", "filters-16384x16")


@contextlib.contextmanager
def applied(name: str):
    """Variant ``name``'s attributes set inside, their values put back after."""
    saved = []
    try:
        for module_name, attribute, value in VARIANTS[name].patches:
            module = importlib.import_module(module_name)
            saved.append((module, attribute, getattr(module, attribute)))
            setattr(module, attribute, value)
        yield
    finally:
        for module, attribute, value in reversed(saved):
            setattr(module, attribute, value)
