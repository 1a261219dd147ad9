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


class Variant(NamedTuple):
    description: str
    patches: tuple[tuple[str, str, object], ...]  # (module, attribute, value while applied)


VARIANTS: dict[str, Variant] = {
    "default": Variant("the code's own choices", ()),
    "no-one-row-gemv": Variant(
        "one-row o projections through the skinny kernel, not runner/layers/triton_gemv.py",
        (("runner.layers.triton_gemv", "GEMV_MAX_K", 0),)),
    "no-early-gemv": Variant(
        "runner/layers/triton_gemv.py loads its first weight tile after the wait",
        (("runner.layers.triton_gemv", "GEMV_EARLY", False),)),
    "kv-offsets-64": Variant(
        "paged attention computes its cache offsets in int64 whatever the cache's size",
        (("runner.attention.triton_unified", "KV_OFFSETS_32", False),)),
}


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
