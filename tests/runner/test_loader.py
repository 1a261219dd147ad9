"""Checkpoint loading: file layouts, dtypes, config parsing, tensor-parallel slicing."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from checkpoint.description import describe, from_hf_dict
from runner.distributed import TensorParallelGroup
from runner.loader import load_weights
from runner.models import build_model_from_config
from tests.helpers.checkpoints import build_model_from_dir

CPU = torch.device("cpu")
HF_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 100,
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": [2, 3], "torch_dtype": "float32",
}


def checkpoint_tensors(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random float32 tensors under Hugging Face Llama names."""
    gen = torch.Generator().manual_seed(seed)
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    d = h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,),
              "lm_head.weight": (v, h)}
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}"
        shapes.update({
            f"{p}.input_layernorm.weight": (h,), f"{p}.post_attention_layernorm.weight": (h,),
            f"{p}.self_attn.q_proj.weight": (q, h), f"{p}.self_attn.k_proj.weight": (kv, h),
            f"{p}.self_attn.v_proj.weight": (kv, h), f"{p}.self_attn.o_proj.weight": (h, q),
            f"{p}.mlp.gate_proj.weight": (i, h), f"{p}.mlp.up_proj.weight": (i, h),
            f"{p}.mlp.down_proj.weight": (h, i),
        })
    return {name: torch.randn(shape, generator=gen) for name, shape in shapes.items()}


def write_checkpoint(path, config: dict, tensors: dict[str, torch.Tensor],
                     num_shards: int = 1) -> str:
    """A model directory; with num_shards > 1, sharded with an index.json."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    if num_shards == 1:
        save_file(tensors, os.path.join(path, "model.safetensors"))
        return str(path)
    names = sorted(tensors)
    weight_map = {}
    for s in range(num_shards):
        file = f"model-{s + 1:05d}-of-{num_shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::num_shards]}
        save_file(part, os.path.join(path, file))
        weight_map.update(dict.fromkeys(part, file))
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return str(path)


def folded(weight: torch.Tensor, norm: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A projection's weight in ``dtype`` with the norm before it folded into
    its columns, as the built model holds it (runner/layers/norm_in_matmul.py)."""
    return (weight.to(dtype).float() * norm.to(dtype).float()).to(dtype)


def expected_params(t: dict[str, torch.Tensor], layer: int,
                    dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    p = f"model.layers.{layer}"
    qkv = torch.cat([t[f"{p}.self_attn.{x}_proj.weight"] for x in "qkv"])
    gate_up = torch.cat([t[f"{p}.mlp.gate_proj.weight"], t[f"{p}.mlp.up_proj.weight"]])
    return {
        "qkv": folded(qkv, t[f"{p}.input_layernorm.weight"], dtype),
        "gate_up": folded(gate_up, t[f"{p}.post_attention_layernorm.weight"], dtype),
    }


def test_single_file_fills_fused_parameters(tmp_path):
    tensors = checkpoint_tensors(HF_CONFIG)
    model_dir = write_checkpoint(tmp_path, HF_CONFIG, tensors)
    model = build_model_from_dir(model_dir, torch.float32, CPU, TensorParallelGroup())
    for n, layer in enumerate(model.layers):
        want = expected_params(tensors, n)
        assert torch.equal(layer.self_attn.qkv_proj.weight, want["qkv"])
        assert torch.equal(layer.mlp.gate_up_proj.weight, want["gate_up"])
        assert torch.equal(layer.mlp.down_proj.weight,
                           tensors[f"model.layers.{n}.mlp.down_proj.weight"])
        assert torch.equal(layer.input_layernorm.weight, torch.ones(32))
        assert torch.equal(layer.post_attention_layernorm.weight, torch.ones(32))
    assert torch.equal(model.norm.weight, tensors["model.norm.weight"])
    assert torch.equal(model.embed_tokens.weight[:100], tensors["model.embed_tokens.weight"])
    assert torch.count_nonzero(model.embed_tokens.weight[100:]) == 0
    assert torch.equal(model.lm_head.weight[:100], tensors["lm_head.weight"])


def test_sharded_equals_single_file(tmp_path):
    tensors = checkpoint_tensors(HF_CONFIG)
    single_dir = write_checkpoint(tmp_path / "one", HF_CONFIG, tensors)
    single = build_model_from_dir(single_dir, torch.float32, CPU, TensorParallelGroup())
    sharded_dir = write_checkpoint(tmp_path / "three", HF_CONFIG, tensors, num_shards=3)
    assert len([f for f in os.listdir(sharded_dir) if f.endswith(".safetensors")]) == 3
    sharded = build_model_from_dir(sharded_dir, torch.float32, CPU, TensorParallelGroup())
    a, b = dict(single.named_parameters()), dict(sharded.named_parameters())
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("stored", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("wanted", [torch.float32, torch.bfloat16])
def test_half_precision_checkpoints_cast(tmp_path, stored, wanted):
    tensors = {n: t.to(stored) for n, t in checkpoint_tensors(HF_CONFIG).items()}
    config = {**HF_CONFIG, "torch_dtype": str(stored).removeprefix("torch.")}
    model_dir = write_checkpoint(tmp_path, config, tensors)
    assert describe(model_dir).dtype == str(stored).removeprefix("torch.")
    model = build_model_from_dir(model_dir, wanted, CPU, TensorParallelGroup())
    assert all(p.dtype == wanted for p in model.parameters())
    want = expected_params(tensors, 1, wanted)["qkv"]
    assert torch.equal(model.layers[1].self_attn.qkv_proj.weight, want)


@pytest.mark.parametrize("tp_size", [2, 4])
def test_rank_reads_its_slices(tmp_path, tp_size):
    """Every rank's shard is the right block; 2 kv heads at TP=4 are replicated."""
    tensors = checkpoint_tensors(HF_CONFIG)
    model_dir = write_checkpoint(tmp_path, HF_CONFIG, tensors)
    d = 32 // 4
    p = "model.layers.0"
    for rank in range(tp_size):
        model = build_model_from_dir(model_dir, torch.float32, CPU, TensorParallelGroup(rank, tp_size))
        q_heads = 4 // tp_size
        kv = rank * 2 // tp_size if tp_size > 2 else rank
        q = tensors[f"{p}.self_attn.q_proj.weight"][rank * q_heads * d:(rank + 1) * q_heads * d]
        k = tensors[f"{p}.self_attn.k_proj.weight"][kv * d:(kv + 1) * d]
        v = tensors[f"{p}.self_attn.v_proj.weight"][kv * d:(kv + 1) * d]
        attn = model.layers[0].self_attn
        norm = tensors[f"{p}.input_layernorm.weight"]
        assert torch.equal(attn.qkv_proj.weight, folded(torch.cat([q, k, v]), norm, torch.float32))
        cols = q_heads * d
        o = tensors[f"{p}.self_attn.o_proj.weight"][:, rank * cols:(rank + 1) * cols]
        assert torch.equal(attn.o_proj.weight, o)
        rows = 64  # vocabulary 100 padded to 64 * tp_size rows, split over tp_size ranks
        start = rank * rows
        real = tensors["model.embed_tokens.weight"][start:start + rows]
        assert torch.equal(model.embed_tokens.weight[:len(real)], real)
        assert model.kv_cache_shape(5, 16) == (2, 5, 16, 2 // min(tp_size, 2), d)


def test_unsupported_architecture(tmp_path):
    config = {**HF_CONFIG, "architectures": ["GPT2LMHeadModel"]}
    write_checkpoint(tmp_path, config, {})
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*LlamaForCausalLM"):
        build_model_from_dir(str(tmp_path), torch.float32, CPU, TensorParallelGroup())


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
@pytest.mark.parametrize("name,dtype", [("bfloat16", torch.bfloat16),
                                        ("float16", torch.float16),
                                        ("float32", torch.float32)])
def test_dtype_key_of_either_version(key, name, dtype):
    hf = {k: v for k, v in HF_CONFIG.items() if k != "torch_dtype"}
    config = from_hf_dict({**hf, key: name})
    assert getattr(torch, config.dtype) == dtype
    assert config.head_dim == 8 and config.eos_token_ids == (2, 3)


def test_rope_parameters_of_either_version():
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    v4 = from_hf_dict(
        {**HF_CONFIG, "rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", **scaling}})
    v5 = from_hf_dict({**HF_CONFIG, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 5e5, **scaling}})
    assert v4 == v5
    assert v4.rope_theta == 5e5 and v4.rope_scaling.factor == 8.0
    with pytest.raises(ValueError, match="yarn"):
        from_hf_dict({**HF_CONFIG, "rope_scaling": {"rope_type": "yarn"}})


def test_sliding_window_layers_as_transformers_reads_them():
    layers = HF_CONFIG["num_hidden_layers"]
    mistral = {**HF_CONFIG, "architectures": ["MistralForCausalLM"], "sliding_window": 16}
    assert from_hf_dict(mistral).sliding_layers == tuple(range(layers))
    qwen = {**HF_CONFIG, "architectures": ["Qwen2ForCausalLM"], "sliding_window": 16,
            "max_window_layers": 1}
    assert from_hf_dict(qwen).sliding_window is None  # no use_sliding_window
    config = from_hf_dict({**qwen, "use_sliding_window": True})
    assert config.sliding_layers == tuple(range(1, layers))
    assert config.layer_window(0) is None and config.layer_window(1) == 16
    listed = {**mistral, "layer_types": ["full_attention"] * (layers - 1) + ["sliding_attention"]}
    assert from_hf_dict(listed).sliding_layers == (layers - 1,)
    llama = {**HF_CONFIG, "sliding_window": 16}
    assert from_hf_dict(llama).sliding_window is None
    with pytest.raises(ValueError, match="sliding_window must be >= 1"):
        from_hf_dict({**mistral, "sliding_window": -3})


def test_uneven_tensor_parallel_split_is_rejected():
    config = from_hf_dict(HF_CONFIG)
    with pytest.raises(ValueError, match="4 attention heads, which do not divide by the "
                       "tensor-parallel size 3"):
        build_model_from_config(config, torch.float32, CPU, TensorParallelGroup(0, 3))
    with pytest.raises(ValueError, match="6 KV heads"):
        build_model_from_config(
            from_hf_dict({**HF_CONFIG, "num_attention_heads": 12, "num_key_value_heads": 6,
                          "head_dim": 4}),
            torch.float32, CPU, TensorParallelGroup(0, 4))
    with pytest.raises(ValueError, match="intermediate_size"):
        build_model_from_config(from_hf_dict({**HF_CONFIG, "intermediate_size": 66}),
                                torch.float32, CPU, TensorParallelGroup(0, 4))


def test_missing_and_misshapen_tensors_are_reported(tmp_path):
    tensors = checkpoint_tensors(HF_CONFIG)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    write_checkpoint(tmp_path / "missing", HF_CONFIG, tensors)
    with pytest.raises(ValueError, match="model.layers.1.mlp.up_proj.weight"):
        build_model_from_dir(str(tmp_path / "missing"), torch.float32, CPU, TensorParallelGroup())
    tensors = checkpoint_tensors(HF_CONFIG)
    tensors["model.norm.weight"] = torch.ones(31)
    write_checkpoint(tmp_path / "bad", HF_CONFIG, tensors)
    with pytest.raises(ValueError, match="model.norm.weight"):
        build_model_from_dir(str(tmp_path / "bad"), torch.float32, CPU, TensorParallelGroup())


def test_random_init_needs_no_checkpoint():
    config = from_hf_dict(HF_CONFIG)
    model = build_model_from_config(config, torch.float32, CPU, TensorParallelGroup())
    again = build_model_from_config(config, torch.float32, CPU, TensorParallelGroup())
    for (name, a), b in zip(model.named_parameters(), again.parameters(), strict=True):
        assert torch.isfinite(a).all() and torch.equal(a, b), name
    weight = model.layers[0].mlp.down_proj.weight
    assert 0.5 < float(weight.std() * weight.shape[1] ** 0.5) < 2.0


def test_load_weights_reads_back_what_was_saved(tmp_path):
    """Round trip: a random-init model's own shards, saved under HF names, load unchanged."""
    config = from_hf_dict(HF_CONFIG)
    source = build_model_from_config(config, torch.float32, CPU, TensorParallelGroup(), seed=7)
    tensors = {}
    for name, where in source.weight_slices().items():
        tensors[name] = where.destination().clone()
    write_checkpoint(tmp_path, HF_CONFIG, tensors)
    assert load_file(os.path.join(tmp_path, "model.safetensors")).keys() == tensors.keys()
    target = build_model_from_config(config, torch.float32, CPU, TensorParallelGroup(), seed=8)
    load_weights(target, str(tmp_path))
    for (name, a), b in zip(source.named_parameters(), target.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_random_init_is_one_model_at_every_tp_size():
    """Rank shards of a random model are slices of the TP=1 model with the same seed."""
    config = from_hf_dict(HF_CONFIG)
    whole = build_model_from_config(config, torch.float32, CPU, TensorParallelGroup(), seed=3)
    shard = build_model_from_config(config, torch.float32, CPU, TensorParallelGroup(1, 2), seed=3)
    qkv = whole.layers[1].self_attn.qkv_proj.weight
    q, k, v = qkv.split([32, 16, 16])
    want = torch.cat([q[16:], k[8:], v[8:]])
    assert torch.equal(shard.layers[1].self_attn.qkv_proj.weight, want)
    down = whole.layers[1].mlp.down_proj.weight
    assert torch.equal(shard.layers[1].mlp.down_proj.weight, down[:, 32:])
    assert torch.equal(shard.embed_tokens.weight[:36], whole.embed_tokens.weight[64:100])
    assert torch.count_nonzero(shard.embed_tokens.weight[36:]) == 0
