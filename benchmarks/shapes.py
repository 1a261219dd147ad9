"""Real model shapes for benchmarks: config.json only, weights made on the device.

No checkpoint can be downloaded here, so benchmarks write the config of a
real model and run it with ``load_format="dummy"`` (random bf16 weights
through the same model code).
"""

from __future__ import annotations

import json
import os

_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

SHAPES = {
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, head_dim=64,
               tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, head_dim=128,
               tie_word_embeddings=False),
    # For smoke tests on CPU: the same family, small enough for seconds per step.
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 tie_word_embeddings=False, vocab_size=512, bos_token_id=1, eos_token_id=2),
}


def shape_config(name: str, max_position_embeddings: int = 131072) -> dict:
    """The config.json fields of shape ``name`` (a Llama-3 model)."""
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; known: {sorted(SHAPES)}")
    config = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128256,
                  rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE,
                  max_position_embeddings=max_position_embeddings, bos_token_id=128000,
                  eos_token_id=128001, dtype="bfloat16", hidden_act="silu")
    config.update(SHAPES[name])
    return config


def write_shape(name: str, directory: str, max_position_embeddings: int = 131072) -> str:
    """Write config.json (and the byte tokenizer) of a Llama-3 shape; returns the dir."""
    config = shape_config(name, max_position_embeddings)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    from checkpoint.tiny_model import build_tokenizer

    build_tokenizer().save(os.path.join(directory, "tokenizer.json"))
    return directory


def hf_config(name: str, max_position_embeddings: int = 131072):
    """The same shape as a transformers LlamaConfig (for the HF baseline)."""
    import transformers

    fields = shape_config(name, max_position_embeddings)
    for key in ("architectures", "model_type", "dtype"):
        fields.pop(key)
    return transformers.LlamaConfig(**fields)
