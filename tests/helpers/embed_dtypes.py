"""Pooled vectors in vLLM's ``embed_dtype``s, read back independently of
the server: ``decoded`` reads a dtype's bits (numpy, and by hand for fp8),
``rounded`` is torch's rounding of float32 values to the dtype, and
``HALF_STEPS`` bounds how far that rounding moves a value."""

from __future__ import annotations

import numpy as np
import torch

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16,
                "bfloat16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn,
                "fp8_e5m2": torch.float8_e5m2}
BYTE_ORDERS = {"native": "=", "big": ">", "little": "<"}
# Rounding to a dtype moves a value by at most half a step: 2**-(m+1) of it
# (m mantissa bits), or half the subnormal step, 2**(-bias-m), near 0.
HALF_STEPS = {"float32": (2**-24, 2**-149), "float16": (2**-11, 2**-25),
              "bfloat16": (2**-8, 2**-134), "fp8_e4m3": (2**-4, 2**-10),
              "fp8_e5m2": (2**-3, 2**-17)}
# (exponent bits, mantissa bits) of the fp8 formats.
FP8_FIELDS = {"fp8_e4m3": (4, 3), "fp8_e5m2": (5, 2)}


def decoded(raw: bytes, embed_dtype: str, endianness: str) -> np.ndarray:
    """The values of ``raw`` read from their bits, without torch: numpy's
    float32 and float16; bfloat16 as float32's top half; fp8 by its
    sign, biased exponent and mantissa (normal and subnormal values)."""
    order = BYTE_ORDERS[endianness]
    if embed_dtype in ("float32", "float16"):
        kind = {"float32": "f4", "float16": "f2"}[embed_dtype]
        return np.frombuffer(raw, order + kind).astype(np.float64)
    if embed_dtype == "bfloat16":
        top = np.frombuffer(raw, order + "u2").astype(np.uint32) << 16
        return top.view(np.float32).astype(np.float64)
    exponent_bits, mantissa_bits = FP8_FIELDS[embed_dtype]
    bias = (1 << (exponent_bits - 1)) - 1
    bits = np.frombuffer(raw, np.uint8).astype(np.int64)
    sign = np.where(bits >> 7, -1.0, 1.0)
    exponent = (bits >> mantissa_bits) & ((1 << exponent_bits) - 1)
    fraction = (bits & ((1 << mantissa_bits) - 1)) / (1 << mantissa_bits)
    return sign * np.where(exponent > 0, np.ldexp(1 + fraction, exponent - bias),
                           np.ldexp(fraction, 1 - bias))


def rounded(floats: list[float], embed_dtype: str) -> np.ndarray:
    """torch's rounding of ``floats`` (float32 values) to ``embed_dtype``."""
    dtype = TORCH_DTYPES[embed_dtype]
    return torch.tensor(floats, dtype=torch.float32).to(dtype).double().numpy()
