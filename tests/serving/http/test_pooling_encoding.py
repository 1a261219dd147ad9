"""``pooling_encoding``: a pooled vector's bytes in each of vLLM's
``embed_dtype``s and byte orders, against hand-worked bit patterns, and
the "bytes" answer's layout (body and ``metadata`` header)."""

from __future__ import annotations

import base64
import json
import sys

import numpy as np
import pytest

from serving.http.pooling_encoding import (
    EncodingFields,
    bytes_answer,
    encoded_vector,
    vector_bytes,
)

# 1.0, -2.5 and 0.1 as the engine sends them: float32 little-endian.
VECTOR = np.array([1.0, -2.5, 0.1], dtype="<f4").tobytes()

# Each value's bits, worked by hand (sign, biased exponent, mantissa;
# rounding to nearest even where the mantissa is cut), most significant
# byte first.
BIG_ENDIAN_BITS = {
    # 0.1 is 0x3DCCCCCD in float32.
    "float32": ["3f800000", "c0200000", "3dcccccd"],
    # -2.5 = -1.25 * 2**1: exponent 15 + 1, mantissa .01; 0.1 rounds to 0x2E66.
    "float16": ["3c00", "c100", "2e66"],
    # float32's top half; 0.1's cut half 0xCCCD is over half way: 0x3DCC + 1.
    "bfloat16": ["3f80", "c020", "3dcd"],
    # bias 7, 3 mantissa bits: 0.1 = 1.6 * 2**-4 -> 1.625 * 2**-4 (0 0011 101).
    "fp8_e4m3": ["38", "c2", "1d"],
    # bias 15, 2 mantissa bits: 0.1 = 1.6 * 2**-4 -> 1.5 * 2**-4 (0 01011 10).
    "fp8_e5m2": ["3c", "c1", "2e"],
}


@pytest.mark.parametrize("embed_dtype", list(BIG_ENDIAN_BITS))
def test_each_dtype_writes_its_bits_in_either_order(embed_dtype):
    values = [bytes.fromhex(v) for v in BIG_ENDIAN_BITS[embed_dtype]]
    big, little = b"".join(values), b"".join(v[::-1] for v in values)
    assert vector_bytes(VECTOR, embed_dtype, "big") == big
    assert vector_bytes(VECTOR, embed_dtype, "little") == little
    native = big if sys.byteorder == "big" else little
    assert vector_bytes(VECTOR, embed_dtype, "native") == native


def test_the_defaults_are_the_engines_float32_bytes():
    assert vector_bytes(VECTOR, "float32", "little") == VECTOR
    fields = EncodingFields(encoding_format="base64")
    assert base64.b64decode(encoded_vector(VECTOR, fields)) == (
        VECTOR if sys.byteorder == "little" else vector_bytes(VECTOR, "float32", "big"))


def test_float_ignores_the_dtype_and_the_order():
    fields = EncodingFields(encoding_format="float", embed_dtype="fp8_e4m3", endianness="big")
    assert encoded_vector(VECTOR, fields) == [1.0, -2.5, float(np.float32(0.1))]


def test_base64_carries_the_dtypes_bytes():
    fields = EncodingFields(encoding_format="base64", embed_dtype="float16", endianness="big")
    assert base64.b64decode(encoded_vector(VECTOR, fields)) == bytes.fromhex("3c00c1002e66")


def test_bytes_answer_lays_the_vectors_end_to_end_with_their_metadata():
    second = np.array([0.5, 2.0], dtype="<f4").tobytes()
    fields = EncodingFields(encoding_format="bytes", embed_dtype="bfloat16", endianness="big")
    answer = bytes_answer([VECTOR, second], fields, "embd-1", 7, "m", 12)
    assert answer.media_type == "application/octet-stream"
    assert answer.body == bytes.fromhex("3f80c0203dcd" + "3f004000")
    assert json.loads(answer.headers["metadata"]) == {
        "id": "embd-1", "created": 7, "model": "m",
        "data": [{"index": 0, "embed_dtype": "bfloat16", "endianness": "big",
                  "start": 0, "end": 6, "shape": [3]},
                 {"index": 1, "embed_dtype": "bfloat16", "endianness": "big",
                  "start": 6, "end": 10, "shape": [2]}],
        "usage": {"prompt_tokens": 12, "total_tokens": 12}}


def test_bytes_only_has_no_metadata():
    fields = EncodingFields(encoding_format="bytes_only", embed_dtype="fp8_e5m2")
    answer = bytes_answer([VECTOR], fields, "embd-1", 7, "m", 3)
    assert answer.body == bytes.fromhex("3cc12e")
    assert "metadata" not in answer.headers
