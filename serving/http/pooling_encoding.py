"""How /v1/embeddings and /pooling carry their pooled vectors, as vLLM
encodes them: the request's ``encoding_format``, ``embed_dtype`` and
``endianness`` (``EncodingFields``).

- "float" (the default): each vector a JSON list of its float32 values;
  ``embed_dtype`` and ``endianness`` do not apply (vLLM ignores them).
- "base64": each vector the base64 of its bytes (``vector_bytes``) in a
  JSON answer. With the defaults (float32, native order on a
  little-endian host) these are the float32 little-endian bytes the
  ``openai`` client decodes.
- "bytes": no JSON; the body is every vector's bytes, one after the other
  in input order, typed ``application/octet-stream``, and the ``metadata``
  header is a JSON object: ``{"id", "created", "model", "data": [{"index",
  "embed_dtype", "endianness", "start", "end", "shape"}], "usage":
  {"prompt_tokens", "total_tokens"}}``, each item the byte range
  ``[start, end)`` of its vector in the body and its shape (``[n]``).
- "bytes_only": the same body without the ``metadata`` header.

A vector's bytes: its float32 values cast to ``embed_dtype`` ("float32",
"float16", "bfloat16", "fp8_e4m3", "fp8_e5m2": torch's rounding, to
nearest even; fp8_e4m3 is torch's ``float8_e4m3fn``), each value's raw
bits written in ``endianness``'s byte order ("native": the server's,
else "big" or "little"). A one-byte dtype has no byte order. Invariant: the
engine's vectors arrive as float32 little-endian bytes, and only this
module turns them into the bytes of an answer.
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel
from starlette.responses import Response

EmbedDType = Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"]
Endianness = Literal["native", "big", "little"]
EncodingFormat = Literal["float", "base64", "bytes", "bytes_only"]

# Each embed_dtype's torch dtype: the values are cast to it on the host.
EMBED_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}

BYTES_MEDIA_TYPE = "application/octet-stream"


class EncodingFields(BaseModel):
    """The encoding fields of a pooling body, with vLLM's names and defaults."""

    encoding_format: EncodingFormat = "float"
    embed_dtype: EmbedDType = "float32"
    endianness: Endianness = "native"


def float_values(vector: bytes) -> np.ndarray:
    """The engine's float32 little-endian bytes as float32 values in the
    host's order (a writable copy)."""
    return np.frombuffer(vector, dtype="<f4").astype(np.float32)


def vector_bytes(vector: bytes, embed_dtype: str, endianness: str) -> bytes:
    """``vector`` (the engine's float32 little-endian bytes) as ``embed_dtype``
    values, each one's bits in ``endianness``'s byte order."""
    dtype = EMBED_DTYPES[embed_dtype]
    values = torch.from_numpy(float_values(vector)).to(dtype)
    # Each value's bytes in the host's order, one row a value.
    raw = values.view(torch.uint8).reshape(-1, dtype.itemsize)
    if endianness not in ("native", sys.byteorder):
        raw = raw.flip(1)
    return raw.numpy().tobytes()


def encoded_vector(
    vector: bytes, fields: EncodingFields, num_rows: int | None = None
) -> list[float] | list[list[float]] | str:
    """A vector as a JSON answer carries it: a list of floats for "float"
    (a list of ``num_rows`` lists where given: a token-level task's rows),
    else (base64) the base64 of ``vector_bytes``, rows one after the other."""
    if fields.encoding_format == "float":
        values = float_values(vector)
        return (values if num_rows is None else values.reshape(num_rows, -1)).tolist()
    raw = vector_bytes(vector, fields.embed_dtype, fields.endianness)
    return base64.b64encode(raw).decode("ascii")


def shape(num_values: int, num_rows: int | None) -> list[int]:
    """A vector's shape in the bytes answer's metadata: ``[n]``, or ``[rows,
    n / rows]`` for a token-level task's rows."""
    return [num_values] if num_rows is None else [num_rows, num_values // num_rows]


def is_binary(fields: EncodingFields) -> bool:
    """Whether the answer is the vectors' bytes rather than JSON."""
    return fields.encoding_format in ("bytes", "bytes_only")


def bytes_answer(
    vectors: list[bytes],
    fields: EncodingFields,
    answer_id: str,
    created: int,
    model: str,
    prompt_tokens: int,
    rows: list[int | None] | None = None,
) -> Response:
    """The "bytes" or "bytes_only" answer of ``vectors`` (module docstring);
    ``rows[i]``, where given and not None, makes vector i's shape ``[rows,
    n / rows]`` (a token-level task's rows)."""
    rows = rows or [None] * len(vectors)
    parts = [vector_bytes(v, fields.embed_dtype, fields.endianness) for v in vectors]
    items, start = [], 0
    for index, (vector, part) in enumerate(zip(vectors, parts)):
        items.append(
            {
                "index": index,
                "embed_dtype": fields.embed_dtype,
                "endianness": fields.endianness,
                "start": start,
                "end": start + len(part),
                "shape": shape(len(vector) // 4, rows[index]),
            }
        )
        start += len(part)
    headers = None
    if fields.encoding_format == "bytes":
        # json.dumps writes ASCII only, as a header's value must be.
        headers = {
            "metadata": json.dumps(
                {
                    "id": answer_id,
                    "created": created,
                    "model": model,
                    "data": items,
                    "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
                }
            )
        }
    return Response(b"".join(parts), headers=headers, media_type=BYTES_MEDIA_TYPE)
