"""The checkpoint tensors a model reads and their whole shapes, from its
``ModelConfig`` alone.

``checkpoint_shapes`` names every tensor the runner's loader fills (Hugging
Face naming, as ``model.weight_slices()`` lists them) with the shape the
checkpoint must hold it in: the whole tensor, before any tensor-parallel
split, so one table serves every ``tensor_parallel_size``. Each shape comes
with the config.json fields it follows from, so an error can say which field
disagrees with the weights. The engine compares it with the weight files'
headers before any worker starts (``ipc.weight_files.check_weight_files``);
tests hold it equal to the runner's own plan.
"""

from __future__ import annotations

from typing import NamedTuple

from ipc.model_config import ModelConfig


class TensorShape(NamedTuple):
    """A tensor's whole shape and, dimension by dimension, the config.json
    fields it follows from (``"num_key_value_heads * head_dim"``)."""

    shape: tuple[int, ...]
    fields: tuple[str, ...]

    def describe(self) -> str:
        """``[32, 64] (num_key_value_heads * head_dim, hidden_size)``."""
        return f"{list(self.shape)} ({', '.join(self.fields)})"


def checkpoint_shapes(config: ModelConfig, classify: bool = False) -> dict[str, TensorShape]:
    """Checkpoint tensor name -> its whole shape, for every tensor the model
    reads: the embedding, each layer's norms, q/k/v/o (biases and q/k norms
    where the architecture has them) and gate/up/down, the final norm, and
    ``lm_head`` unless the embeddings are tied; a classifier (``classify``)
    reads ``score`` [num_labels, hidden] instead of ``lm_head``."""
    sizes = {
        "num_labels": config.num_labels,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "head_dim": config.head_dim,
        "num_attention_heads * head_dim": config.num_attention_heads * config.head_dim,
        "num_key_value_heads * head_dim": config.num_key_value_heads * config.head_dim,
    }

    def shape(*fields: str) -> TensorShape:
        return TensorShape(tuple(sizes[f] for f in fields), fields)

    q, kv = "num_attention_heads * head_dim", "num_key_value_heads * head_dim"
    tensors = {"model.embed_tokens.weight": shape("vocab_size", "hidden_size")}
    for i in range(config.num_hidden_layers):
        layer = f"model.layers.{i}"
        tensors[f"{layer}.input_layernorm.weight"] = shape("hidden_size")
        for part, rows in (("q", q), ("k", kv), ("v", kv)):
            tensors[f"{layer}.self_attn.{part}_proj.weight"] = shape(rows, "hidden_size")
            if config.qkv_bias:
                tensors[f"{layer}.self_attn.{part}_proj.bias"] = shape(rows)
        tensors[f"{layer}.self_attn.o_proj.weight"] = shape("hidden_size", q)
        if config.o_bias:
            tensors[f"{layer}.self_attn.o_proj.bias"] = shape("hidden_size")
        if config.qk_norm:
            tensors[f"{layer}.self_attn.q_norm.weight"] = shape("head_dim")
            tensors[f"{layer}.self_attn.k_norm.weight"] = shape("head_dim")
        tensors[f"{layer}.post_attention_layernorm.weight"] = shape("hidden_size")
        tensors[f"{layer}.mlp.gate_proj.weight"] = shape("intermediate_size", "hidden_size")
        tensors[f"{layer}.mlp.up_proj.weight"] = shape("intermediate_size", "hidden_size")
        tensors[f"{layer}.mlp.down_proj.weight"] = shape("hidden_size", "intermediate_size")
    tensors["model.norm.weight"] = shape("hidden_size")
    if classify:
        tensors["score.weight"] = shape("num_labels", "hidden_size")
    elif not config.tie_word_embeddings:
        tensors["lm_head.weight"] = shape("vocab_size", "hidden_size")
    return tensors
