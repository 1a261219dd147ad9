"""A GGUF file's tensors as a checkpoint names them, from its header alone.

``hf_name`` maps a llama.cpp tensor name (``blk.N.attn_q.weight`` ...) to
the Hugging Face name the model asks for; the runner's GGUF loader reads the
weights by it. ``tensor_shapes`` reads the file's tensor table (name, shape)
and skips the metadata before it without decoding it, so the engine can
check the shapes before any worker starts for the price of one pass over
the header (a vocabulary's strings are stepped over, never decoded; no
tensor data is touched). ``gguf.GGUFReader`` decodes every metadata value
first, seconds for a vocabulary of 50k tokens. It lives here because both
sides use it and the runner imports no package but ipc.
"""

from __future__ import annotations

import mmap
import re
import struct

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")

GGUF_MAGIC = b"GGUF"
VERSIONS = (2, 3)  # those gguf.GGUFReader reads; version 1 counted in 32 bits
# Metadata value types (GGUF's numbering): byte size of each fixed-size one.
_FIXED_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
MAX_DIMS = 4  # llama.cpp's GGML_MAX_DIMS


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face checkpoint name of a llama.cpp tensor, or None if unknown."""
    match = _BLOCK.fullmatch(gguf_name)
    if match:
        layer, part, kind = match.groups()
        mapped = _LAYER_NAMES.get(part)
        return None if mapped is None else f"model.layers.{layer}.{mapped}.{kind}"
    base, _, kind = gguf_name.rpartition(".")
    mapped = _TOP_NAMES.get(base)
    return None if mapped is None else f"{mapped}.{kind}"


def tensor_shapes(path: str) -> dict[str, tuple[int, ...]]:
    """Each tensor's llama.cpp name -> its shape, slowest dimension first (as
    torch and safetensors give it; GGUF lists the fastest first). ValueError
    naming ``path`` when its header does not read as GGUF version 2 or 3."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _Header(data).tensor_shapes()
    except (struct.error, UnicodeDecodeError, ValueError, OSError) as e:
        raise ValueError(f"{path} is not a readable GGUF file: {e}") from None


class _Header:
    """A cursor over a GGUF header in the file's byte order."""

    def __init__(self, data: mmap.mmap) -> None:
        if data[:4] != GGUF_MAGIC:
            raise ValueError("no GGUF magic")
        self.data = data
        self.order = "<"
        (version,) = struct.unpack_from("<I", data, 4)
        if not version & 0xFFFF:  # written on a machine of the other byte order
            self.order = ">"
            (version,) = struct.unpack_from(">I", data, 4)
        if version not in VERSIONS:
            raise ValueError(f"GGUF version {version} (read: {', '.join(map(str, VERSIONS))})")
        self.pos = 8

    def take(self, fmt: str) -> tuple:
        values = struct.unpack_from(self.order + fmt, self.data, self.pos)
        self.pos += struct.calcsize(self.order + fmt)
        return values

    def skip_string(self) -> None:
        (length,) = self.take("Q")
        self.pos += length
        if self.pos > len(self.data):
            raise ValueError("cut short")

    def skip_value(self, kind: int) -> None:
        if kind in _FIXED_SIZES:
            self.pos += _FIXED_SIZES[kind]
        elif kind == _STRING:
            self.skip_string()
        elif kind == _ARRAY:
            item_kind, count = self.take("IQ")
            if item_kind in _FIXED_SIZES:
                self.pos += count * _FIXED_SIZES[item_kind]
            else:
                for _ in range(count):
                    self.skip_value(item_kind)
        else:
            raise ValueError(f"unknown metadata value type {kind}")

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        tensor_count, kv_count = self.take("QQ")
        for _ in range(kv_count):
            self.skip_string()
            (kind,) = self.take("I")
            self.skip_value(kind)
        shapes = {}
        for _ in range(tensor_count):
            (length,) = self.take("Q")
            name = bytes(self.data[self.pos:self.pos + length]).decode("utf-8")
            self.pos += length
            (n_dims,) = self.take("I")
            if n_dims > MAX_DIMS:
                raise ValueError(f"tensor {name!r} has {n_dims} dimensions")
            dims = self.take(f"{n_dims}Q")
            self.take("IQ")  # the tensor's type and data offset
            shapes[name] = tuple(reversed(dims))
        return shapes
