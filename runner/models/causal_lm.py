"""The Llama-family causal language model over a paged KV cache."""

from __future__ import annotations

import torch
from torch import nn

from ipc.model_config import ModelConfig
from runner.attention.metadata import AttentionMetadata
from runner.attention.selector import AttentionBackend
from runner.distributed import TensorParallelGroup
from runner.layers import (
    ParallelLMHead,
    RMSNorm,
    RotaryEmbedding,
    VocabParallelEmbedding,
    WeightSlice,
)
from runner.layers.linear import kv_head_range
from runner.layers.score_head import ScoreHead
from runner.models.llama import LlamaDecoderLayer
from runner.ops import device_ops


class CausalLM(nn.Module):
    """embed -> decoder layers -> final norm; ``compute_logits`` applies the LM head.

    Every rank holds its shard of the weights and returns the same hidden
    states and the same full-vocabulary logits. A classifier
    (``classify``: a pooling runner's "classify" task) has a ``score`` head
    (``ScoreHead``, the checkpoint's ``score.weight``) instead of the LM
    head: ``lm_head`` is None and ``compute_logits`` is not to be called.
    """

    def __init__(self, config: ModelConfig, tp: TensorParallelGroup, backend: AttentionBackend,
                 dtype: torch.dtype, max_positions: int | None = None,
                 classify: bool = False) -> None:
        super().__init__()
        config.check_tensor_parallel(tp.size)
        self.config = config
        self.tp = tp
        self.dtype = dtype
        self.num_kv_heads = kv_head_range(config.num_key_value_heads, tp)[1]
        positions = max_positions or config.max_position_embeddings
        if positions is None:
            raise ValueError("the model gives no max_position_embeddings: pass max_positions")
        rotary = RotaryEmbedding(config.head_dim, positions, config.rope_theta,
                                 config.rope_scaling)
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp,
                                                   dtype)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, tp, rotary, backend, dtype, layer)
            for layer in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, tp)
        self.lm_head = (None if classify
                        else ParallelLMHead(self.embed_tokens, config.tie_word_embeddings))
        self.score = (ScoreHead(config.hidden_size, config.num_labels, dtype) if classify
                      else None)
        self.ops = device_ops(self.norm.weight.device)
        # Set by fold_norm_weights: the decoder norms' weights live in qkv and gate/up.
        self.norms_folded = False
        self._carries_norms: dict[tuple, bool] = {}

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        """One layer's cache on this rank: (2, num_blocks, block_size, kv heads, head_dim)."""
        return (2, num_blocks, block_size, self.num_kv_heads, self.config.head_dim)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], attn: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions [T] -> final-normed hidden states [T, hidden]."""
        carry = self.carries_norms(input_ids.shape[0])
        if carry:
            # The embedding is layer 0's producer: the residual and its parts.
            x = None
            residual, parts = self.ops.embedding_with_parts(input_ids, self.embed_tokens.weight)
        else:
            x, residual, parts = self.embed_tokens(input_ids), None, None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual, parts = layer(positions, x, residual, kv_cache, attn, parts, carry)
        if parts is not None:
            return self.norm(residual)
        normed, _ = self.norm(x, residual)
        return normed

    def fold_norm_weights(self) -> None:
        """Fold every decoder norm's weight into the projection that reads it,
        once, after the weights are loaded (``norm_in_matmul.py``); the final
        norm keeps its own (the LM head may be the embedding table)."""
        if self.norms_folded:
            raise RuntimeError("the norm weights are folded already")
        for layer in self.layers:
            layer.fold_norm_weights()
        self.norms_folded = True

    def carries_norms(self, num_tokens: int) -> bool:
        """Whether a forward of ``num_tokens`` carries the decoder norms in the
        matmuls (``LlamaDecoderLayer``): on one rank, with the norm weights
        folded, no o_proj bias, and where the device's kernels for every
        projection of that size take it (``norms_in_matmuls``; on CUDA the
        decode-size Triton kernels). Asked once per size and ops (a
        benchmark may replace the ops: ``bench_decode.py --cublas-only``)."""
        key = (num_tokens, self.ops.norms_in_matmuls)
        if key not in self._carries_norms:
            first = self.layers[0]
            self._carries_norms[key] = (
                self.norms_folded and self.tp.size == 1
                and first.self_attn.o_proj.bias is None
                and self.ops.norms_in_matmuls(
                    num_tokens, self.dtype, self.norm.weight.device,
                    first.self_attn.qkv_proj.weight, first.self_attn.o_proj.weight,
                    first.mlp.gate_up_proj.weight, first.mlp.down_proj.weight,
                    self.config.head_dim))
        return self._carries_norms[key]

    def compute_logits(self, hidden: torch.Tensor,
                       dtype: torch.dtype | None = torch.float32) -> torch.Tensor:
        """hidden [N, hidden] -> logits [N, vocab_size] in ``dtype`` (None: the
        model's), identical on every rank."""
        return self.lm_head(hidden, dtype)

    def weight_slices(self) -> dict[str, WeightSlice]:
        """Checkpoint tensor name (Hugging Face naming) -> where it lands on this rank.

        Names of shards that hold only vocabulary padding are absent.
        """
        slices: dict[str, WeightSlice] = {"model.norm.weight": WeightSlice.whole(self.norm.weight)}
        embed = self.embed_tokens.weight_slices()
        if embed is not None:
            slices["model.embed_tokens.weight"] = embed
        if self.score is not None:
            slices["score.weight"] = self.score.weight_slices()
        head = None if self.lm_head is None else self.lm_head.weight_slices()
        if head is not None and not self.config.tie_word_embeddings:
            slices["lm_head.weight"] = head
        for i, layer in enumerate(self.layers):
            slices.update(layer.weight_slices(f"model.layers.{i}"))
        return slices
