"""The tensors a model reads and their whole shapes, from config.json alone
(``ipc.weight_shapes``), held against the runner's own plan
(``model.weight_slices()``) at every rank of TP 1 and 2 and against the
checkpoints transformers saves; a GGUF file's
tensor table read from its header (``ipc.gguf_tensors``), held against
``gguf.GGUFReader``; and the start-up check of both against a model
directory (``ipc.weight_files.check_weight_files``)."""

from __future__ import annotations

import json
import os
import shutil

import gguf
import numpy as np
import pytest
import torch

from checkpoint.description import describe, from_hf_dict
from checkpoint.gguf_model import ensure_gguf_model
from ipc.gguf_tensors import tensor_shapes
from ipc.weight_files import check_weight_files
from ipc.weight_shapes import checkpoint_shapes
from runner.distributed import TensorParallelGroup
from runner.models import build_model_from_config
from tests.helpers.model_parity import COMMON, CONFIGS

HF_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "vocab_size": 100, "hidden_size": 32,
    "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False, "torch_dtype": "float32",
}
VARIANTS = {
    "llama": {},
    "tied": {"tie_word_embeddings": True},
    "attention_bias": {"attention_bias": True},
    "one kv head": {"num_key_value_heads": 1},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"]},
    "qwen3 head_dim": {"architectures": ["Qwen3ForCausalLM"], "head_dim": 16},
}


@pytest.mark.parametrize("tp_size", [1, 2])
@pytest.mark.parametrize("variant", VARIANTS)
def test_checkpoint_shapes_are_the_runners_plan(variant, tp_size):
    """Every tensor some rank loads is listed with the whole shape that
    rank's loader checks, and nothing else is listed."""
    config = from_hf_dict({**HF_LLAMA, **VARIANTS[variant]})
    expected = {name: shape.shape for name, shape in checkpoint_shapes(config).items()}
    planned = {}
    for rank in range(tp_size):
        model = build_model_from_config(config, torch.float32, torch.device("cpu"),
                                        TensorParallelGroup(rank, tp_size), init="empty")
        for name, where in model.weight_slices().items():
            planned[name] = where.source_shape()
    assert planned == expected


@pytest.mark.parametrize("name", CONFIGS)
def test_checkpoint_shapes_are_those_transformers_saves(tmp_path, name):
    """Every tensor and shape of a checkpoint ``save_pretrained`` writes for
    each architecture (tied, biased, one kv head, Qwen3's own head_dim),
    nothing more, nothing less; the start-up check passes it."""
    import transformers
    from safetensors import safe_open

    config_cls, model_cls, extra = CONFIGS[name]
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**COMMON, **extra))
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), framework="numpy") as f:
        saved = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}  # noqa: SIM118
    expected = checkpoint_shapes(describe(str(tmp_path)))
    assert saved == {key: shape.shape for key, shape in expected.items()}
    _check(str(tmp_path))


def _write_gguf(path, endianess) -> None:
    """A GGUF file with every kind of metadata value before its tensors."""
    writer = gguf.GGUFWriter(str(path), "llama", endianess=endianess)
    writer.add_uint32("test.u32", 7)
    writer.add_float64("test.f64", 0.5)
    writer.add_bool("test.bool", True)
    writer.add_string("test.string", "héllo")
    writer.add_array("test.strings", ["a", "", "▁b" * 40])
    writer.add_array("test.ints", list(range(1000)))
    writer.add_array("test.nested", [[1, 2], ["x", "yz"]])
    writer.add_tensor("token_embd.weight", np.zeros((6, 4), np.float32))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(4, np.float32))
    writer.add_tensor("rope_freqs.weight", np.ones((2, 3, 5), np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _reader_shapes(path) -> dict[str, tuple[int, ...]]:
    return {t.name: tuple(int(n) for n in reversed(t.shape))
            for t in gguf.GGUFReader(str(path)).tensors}


@pytest.mark.parametrize("endianess", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_gguf_tensor_shapes_from_the_header_are_gguf_readers(tmp_path, endianess):
    path = tmp_path / "m.gguf"
    _write_gguf(path, endianess)
    shapes = tensor_shapes(str(path))
    assert shapes == _reader_shapes(path)
    assert shapes["token_embd.weight"] == (6, 4)  # numpy's order, as it was written
    assert shapes["rope_freqs.weight"] == (2, 3, 5)


def test_gguf_tensor_shapes_of_smollm2_are_gguf_readers(smollm2_path):
    assert tensor_shapes(smollm2_path) == _reader_shapes(smollm2_path)


@pytest.mark.parametrize("kept", [3, 20, 200, -40])
def test_a_gguf_header_cut_short_is_an_error_naming_the_file(tmp_path, kept):
    path = tmp_path / "m.gguf"
    _write_gguf(path, gguf.GGUFEndian.LITTLE)
    data = path.read_bytes()
    tensors_end = data.index(b"rope_freqs.weight") + len(b"rope_freqs.weight")
    path.write_bytes(data[:kept if kept > 0 else tensors_end + kept])
    with pytest.raises(ValueError, match=f"{path} is not a readable GGUF file"):
        tensor_shapes(str(path))


def _edited(source: str, target, **fields) -> str:
    """A copy of the model directory ``source`` with ``fields`` set in its config.json."""
    shutil.copytree(source, target, symlinks=True)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, **fields}))
    return str(target)


def _check(model_dir: str) -> None:
    check_weight_files(model_dir, describe(model_dir))


def test_real_checkpoints_pass(tiny_dir, smollm2_path, tmp_path):
    _check(tiny_dir)
    smollm2_dir = ensure_gguf_model(smollm2_path, str(tmp_path / "cache"))
    assert describe(smollm2_dir).tie_word_embeddings  # no output.weight in the file
    _check(smollm2_dir)


# (config.json fields, the tensor named, its shape, the expected shape and its fields)
# The tiny model: vocab 320, hidden 64 (4 heads of 16; 2 kv heads), MLP 192, 4 layers.
EDITS = [
    ({"num_key_value_heads": 1}, "model.layers.0.self_attn.k_proj.weight", [32, 64],
     "[16, 64] (num_key_value_heads * head_dim, hidden_size); 8 tensors differ"),
    ({"intermediate_size": 128}, "model.layers.0.mlp.gate_proj.weight", [192, 64],
     "[128, 64] (intermediate_size, hidden_size); 12 tensors differ"),
    ({"vocab_size": 300}, "model.embed_tokens.weight", [320, 64],
     "[300, 64] (vocab_size, hidden_size); 2 tensors differ"),
    ({"hidden_size": 128}, "model.embed_tokens.weight", [320, 64],
     "[320, 128] (vocab_size, hidden_size); 39 tensors differ"),
    ({"head_dim": 8}, "model.layers.0.self_attn.q_proj.weight", [64, 64],
     "[32, 64] (num_attention_heads * head_dim, hidden_size); 16 tensors differ"),
]


@pytest.mark.parametrize("fields, tensor, found, expected", EDITS)
def test_a_config_that_disagrees_with_the_weights_names_file_tensor_and_shapes(
        tiny_dir, tmp_path, fields, tensor, found, expected):
    model_dir = _edited(tiny_dir, tmp_path / "m", **fields)
    weights = os.path.join(model_dir, "model.safetensors")
    config = os.path.join(model_dir, "config.json")
    with pytest.raises(ValueError) as raised:
        _check(model_dir)
    assert str(raised.value) == (f"{weights}: tensor {tensor} has shape {found}, "
                                 f"but {config} implies {expected}")


def test_tensors_config_json_implies_but_no_file_holds_are_named(tiny_dir, tmp_path):
    model_dir = _edited(tiny_dir, tmp_path / "m", num_hidden_layers=5)
    with pytest.raises(ValueError, match=r"model.safetensors lacks 9 tensors that .*config.json "
                                         r"implies: model.layers.4.input_layernorm.weight, "):
        _check(model_dir)
    untied = _edited(tiny_dir, tmp_path / "untied")
    from safetensors.numpy import load_file, save_file

    weights = os.path.join(untied, "model.safetensors")
    tensors = load_file(weights)
    del tensors["lm_head.weight"]
    save_file(tensors, weights)
    with pytest.raises(ValueError, match=r"lacks 1 tensors that .* implies: lm_head.weight$"):
        _check(untied)
    _check(_edited(untied, tmp_path / "tied", tie_word_embeddings=True))


def test_a_gguf_model_whose_config_disagrees_names_the_gguf_file(smollm2_path, tmp_path):
    converted = ensure_gguf_model(smollm2_path, str(tmp_path / "cache"))
    model_dir = _edited(converted, tmp_path / "m", num_key_value_heads=1)
    with pytest.raises(ValueError) as raised:
        _check(model_dir)
    assert str(raised.value) == (
        f"{os.path.realpath(smollm2_path)}: tensor blk.0.attn_k.weight "
        f"(model.layers.0.self_attn.k_proj.weight) has shape [192, 576], but "
        f"{model_dir}/config.json implies [64, 576] (num_key_value_heads * head_dim, "
        f"hidden_size); 60 tensors differ")
