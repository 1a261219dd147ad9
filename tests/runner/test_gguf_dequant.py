"""Each GGUF tensor type tprun reads, from small GGUF files written with
``gguf.GGUFWriter``, against an independent decoding: transformers' own
GGUF dequantizer for block types, torch's float views for float types.

Block types get random bytes with random (finite) float16 scales, so every
bit of every field matters. Shards by rows and by columns are read as a
tensor-parallel rank reads them, into float32 and bfloat16 parameters.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from ipc.gguf_tensors import hf_name
from runner.gguf_loader import _copy_slice, unpermute_rows
from runner.layers import WeightSlice

dequant = pytest.importorskip("transformers.integrations.gguf.dequant")

Q = gguf.GGMLQuantizationType
# type -> byte offsets of the float16 scales inside one block
BLOCK_TYPES = {Q.Q8_0: (0,), Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q4_K: (0, 2), Q.Q6_K: (208,)}
FLOAT_TYPES = (Q.F32, Q.F16, Q.BF16)
ROWS, COLS = 6, 512


def _raw(qtype, gen: np.random.Generator) -> np.ndarray:
    """Random contents of a [ROWS, COLS] tensor of ``qtype``, as the file stores them."""
    if qtype == Q.F32:
        return gen.standard_normal((ROWS, COLS), dtype=np.float32)
    if qtype == Q.F16:
        return gen.standard_normal((ROWS, COLS)).astype(np.float16)
    if qtype == Q.BF16:
        bits = torch.randn(ROWS, COLS).to(torch.bfloat16).view(torch.int16).numpy()
        return bits.view(np.uint8).reshape(ROWS, COLS * 2)
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    blocks = gen.integers(0, 256, (ROWS * COLS // block_elems, block_bytes), dtype=np.uint8)
    for offset in BLOCK_TYPES[qtype]:
        scales = (gen.standard_normal(len(blocks)) * 0.01).astype(np.float16)
        blocks[:, offset:offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(ROWS, -1)


def _reference(qtype, raw: np.ndarray) -> torch.Tensor:
    """[ROWS, COLS] float32 decoded without the gguf package."""
    if qtype in (Q.F32, Q.F16):
        return torch.from_numpy(raw.astype(np.float32))
    if qtype == Q.BF16:
        return torch.from_numpy(raw.copy()).view(torch.bfloat16).float()
    flat = dequant.dequantize(torch.from_numpy(raw.reshape(-1).copy()), int(qtype))
    return flat.reshape(ROWS, COLS).float()


def _write_and_read(tmp_path, qtype, raw: np.ndarray):
    path = str(tmp_path / f"{qtype.name}.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    if qtype in (Q.F32, Q.F16):
        writer.add_tensor("blk.0.ffn_up.weight", raw)
    else:
        writer.add_tensor("blk.0.ffn_up.weight", raw, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (tensor,) = gguf.GGUFReader(path).tensors
    assert tensor.tensor_type == qtype
    return tensor


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("qtype", [*FLOAT_TYPES, *BLOCK_TYPES], ids=lambda t: getattr(t, "name", t))
def test_dequantized_shards_match_reference(tmp_path, qtype, dtype):
    raw = _raw(qtype, np.random.default_rng(int(qtype)))
    tensor = _write_and_read(tmp_path, qtype, raw)
    want = _reference(qtype, raw)
    assert torch.isfinite(want).all()
    # (dim, start, length): the whole tensor, a row shard, a column shard
    for dim, start, length in ((0, 0, ROWS), (0, 2, 3), (1, 256, 256)):
        shape = [ROWS, COLS]
        shape[dim] = length
        param = torch.full(shape, float("nan"), dtype=dtype)
        _copy_slice(tensor, WeightSlice(param, dim, start, length, (ROWS, COLS)[dim]),
                    "model.layers.0.mlp.up_proj.weight", None)
        expected = want.narrow(dim, start, length).to(dtype)
        torch.testing.assert_close(param, expected, atol=0, rtol=0)


def test_wrong_shape_is_a_clear_error(tmp_path):
    tensor = _write_and_read(tmp_path, Q.F32, _raw(Q.F32, np.random.default_rng(0)))
    param = torch.empty(ROWS, COLS // 2)
    with pytest.raises(ValueError, match="has shape"):
        _copy_slice(tensor, WeightSlice(param, 0, 0, ROWS, ROWS), "x", None)


def _llama_cpp_permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """The row order llama.cpp's converter writes q and k in (per head: the
    first and second halves of the rotary dims interleaved)."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, 2, half, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


@pytest.mark.parametrize("heads,head_dim", [(9, 64), (3, 16), (1, 8)])
def test_unpermute_undoes_llama_cpp_permutation(heads, head_dim):
    w = torch.randn(heads * head_dim, 5)
    stored = _llama_cpp_permute(w, heads).numpy()
    assert not np.array_equal(stored, w.numpy())
    np.testing.assert_array_equal(unpermute_rows(stored, head_dim), w.numpy())
    # A shard of whole heads unpermutes on its own.
    shard = stored[head_dim * (heads - 1):]
    np.testing.assert_array_equal(unpermute_rows(shard, head_dim), w[head_dim * (heads - 1):])


def test_llama_cpp_names_map_to_checkpoint_names():
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("output.weight") == "lm_head.weight"
    assert hf_name("output_norm.weight") == "model.norm.weight"
    assert hf_name("blk.12.attn_q.weight") == "model.layers.12.self_attn.q_proj.weight"
    assert hf_name("blk.0.attn_output.weight") == "model.layers.0.self_attn.o_proj.weight"
    assert hf_name("blk.3.ffn_down.weight") == "model.layers.3.mlp.down_proj.weight"
    assert hf_name("blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    assert hf_name("rope_freqs.weight") is None
