"""One Llama-family decoder layer: attention and gated MLP, tensor-parallel.

Covers Llama 2/3, Mistral, Qwen2 (qkv bias) and Qwen3 (per-head q/k norm).
The tensor-parallel layers do the sharding; the arithmetic here is the
single-device model's, applied to this rank's heads and columns.
"""

from __future__ import annotations

import torch
from torch import nn

from ipc.model_config import ModelConfig
from runner.attention.metadata import AttentionMetadata
from runner.attention.selector import AttentionBackend, attends_to_written_kv
from runner.distributed import TensorParallelGroup
from runner.layers import (
    ColumnParallelLinear,
    RMSNorm,
    RotaryEmbedding,
    RowParallelLinear,
    WeightSlice,
)
from runner.layers.norm_in_matmul import fold_norm_weight
from runner.lora.stack import LoRAStack
from runner.ops import device_ops


class LlamaAttention(nn.Module):
    """qkv projection -> (q/k norm) -> rope -> paged attention -> o projection."""

    def __init__(self, config: ModelConfig, tp: TensorParallelGroup, rotary: RotaryEmbedding,
                 backend: AttentionBackend, dtype: torch.dtype,
                 sliding_window: int | None = None) -> None:
        super().__init__()
        c = config
        self.sliding_window = sliding_window
        self.head_dim = c.head_dim
        self.scale = c.head_dim ** -0.5
        self.qkv_proj = ColumnParallelLinear.qkv(
            c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads, tp,
            c.qkv_bias, dtype)
        self.q_size = self.qkv_proj.parts["q"].size
        self.kv_size = self.qkv_proj.parts["k"].size
        self.o_proj = RowParallelLinear(c.num_attention_heads * c.head_dim, c.hidden_size, tp,
                                        c.o_bias, dtype, reduce_output=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dtype) if c.qk_norm else None
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dtype) if c.qk_norm else None
        self.rotary = rotary
        self.backend = backend
        self.fused_kv_write = attends_to_written_kv(backend)
        # The projection itself can rotate and store k and v (one launch for
        # decode batches on CUDA) when nothing sits between it and the rotation.
        self.projects_into_cache = (self.fused_kv_write and not c.qkv_bias
                                    and self.q_norm is None)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, kv_cache: torch.Tensor,
                attn: AttentionMetadata) -> torch.Tensor:
        return self.o_proj(self.attend(positions, x, kv_cache, attn))

    def use_lora(self, qkv: LoRAStack, o: LoRAStack) -> None:
        """Add LoRA deltas to the qkv and o projections; the qkv projection
        then runs as its own matmul (never the one launch that also rotates
        and caches, which reads the base weight alone)."""
        self.qkv_proj.lora, self.o_proj.lora = qkv, o
        self.projects_into_cache = False

    def reads_raw_residual(self, attn: AttentionMetadata) -> bool:
        """Whether ``attend`` can take the raw residual with its parts (the
        norm carried by the matmuls, ``norm_in_matmul.py``): when the qkv
        projection is the one launch that rotates and caches, whose epilogue
        scales by rstd."""
        return self.projects_into_cache and not self._fresh(attn)

    def _fresh(self, attn: AttentionMetadata) -> bool:
        return self.fused_kv_write and self.backend.wants_fresh_kv(attn, self.sliding_window)

    def attend(self, positions: torch.Tensor, x: torch.Tensor, kv_cache: torch.Tensor,
               attn: AttentionMetadata, parts: torch.Tensor | None = None,
               eps: float = 0.0) -> torch.Tensor:
        """The attention output [T, heads * head_dim], before the o projection.
        With ``parts`` (only where ``reads_raw_residual``), x is the raw
        residual and the qkv projection scales by its rstd."""
        fresh = self._fresh(attn)
        if self.projects_into_cache and not fresh:
            q = self.rotary.project_rotate_and_cache(
                positions, x, self.qkv_proj.weight, kv_cache, attn.slot_mapping,
                self.q_size // self.head_dim, self.kv_size // self.head_dim, parts, eps)
            out = self.backend.attend(q, kv_cache, attn, self.scale, self.sliding_window)
            return out.flatten(-2)
        if parts is not None:
            raise ValueError("this qkv projection cannot take the raw residual")
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.unflatten(-1, (-1, self.head_dim))
        k = k.unflatten(-1, (-1, self.head_dim))
        v = v.unflatten(-1, (-1, self.head_dim))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.fused_kv_write:
            q = self.rotary.rotate_and_cache(positions, q, k, v, kv_cache, attn.slot_mapping,
                                             rotate_k_in_place=fresh)
            out = self.backend.attend(q, kv_cache, attn, self.scale, self.sliding_window,
                                      fresh_kv=(k, v) if fresh else None)
        else:
            q, k = self.rotary(positions, q, k)
            out = self.backend.forward(q, k, v, kv_cache, attn, self.scale,
                                       sliding_window=self.sliding_window)
        return out.flatten(-2)

    def weight_slices(self, prefix: str) -> dict[str, WeightSlice]:
        slices: dict[str, WeightSlice] = {}
        for part in ("q", "k", "v"):
            weight, bias = self.qkv_proj.weight_slices(part)
            slices[f"{prefix}.{part}_proj.weight"] = weight
            if bias is not None:
                slices[f"{prefix}.{part}_proj.bias"] = bias
        weight, bias = self.o_proj.weight_slices()
        slices[f"{prefix}.o_proj.weight"] = weight
        if bias is not None:
            slices[f"{prefix}.o_proj.bias"] = bias
        if self.q_norm is not None:
            slices[f"{prefix}.q_norm.weight"] = WeightSlice.whole(self.q_norm.weight)
            slices[f"{prefix}.k_norm.weight"] = WeightSlice.whole(self.k_norm.weight)
        return slices


class LlamaMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), gate and up fused into one column-parallel matmul."""

    def __init__(self, config: ModelConfig, tp: TensorParallelGroup, dtype: torch.dtype) -> None:
        super().__init__()
        n = config.intermediate_size
        self.gate_up_proj = ColumnParallelLinear.split_evenly(
            config.hidden_size, {"gate": n, "up": n}, tp, False, dtype)
        self.down_proj = RowParallelLinear(n, config.hidden_size, tp, False, dtype,
                                           reduce_output=False)
        self.ops = device_ops(self.gate_up_proj.weight.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The projection and the activation are one ``gate_up_silu`` call
        (one launch for decode batches on CUDA); with LoRA, the projection
        with its delta, then the activation."""
        if self.gate_up_proj.lora is not None:
            return self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))
        return self.down_proj(self.ops.gate_up_silu(x, self.gate_up_proj.weight))

    def use_lora(self, gate_up: LoRAStack, down: LoRAStack) -> None:
        """Add LoRA deltas to the gate/up and down projections."""
        self.gate_up_proj.lora, self.down_proj.lora = gate_up, down

    def add_to_residual(self, residual: torch.Tensor, parts: torch.Tensor,
                        eps: float) -> torch.Tensor:
        """The block with the norms carried by the matmuls: gate/up reads the
        raw ``residual`` and scales by the rstd of ``parts``; down adds its
        output into ``residual`` in place. Returns the new residual's parts."""
        act = self.ops.gate_up_silu(residual, self.gate_up_proj.weight, parts, eps)
        return self.down_proj.add_into(act, residual)

    def weight_slices(self, prefix: str) -> dict[str, WeightSlice]:
        return {
            f"{prefix}.gate_proj.weight": self.gate_up_proj.weight_slices("gate")[0],
            f"{prefix}.up_proj.weight": self.gate_up_proj.weight_slices("up")[0],
            f"{prefix}.down_proj.weight": self.down_proj.weight_slices()[0],
        }


class LlamaDecoderLayer(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x)).

    The residual stream is passed alongside the block's output so that each
    add fuses into the norm after it: ``forward`` takes (h, residual, parts)
    and returns them for the next layer, in one of two states:

    - parts None: h + residual is the stream (the first layer gets
      ``residual=None``); the norm that follows does the add.
    - h None: the stream is ``residual``, complete, and ``parts`` holds
      its rows' sums of squares. This is the state ``carry_norms`` leaves:
      the norms are carried by the matmuls (``norm_in_matmul.py``; their
      weights folded into qkv and gate/up at build), o_proj and down add
      into the residual, and qkv and gate/up scale by rstd. The caller
      decides per forward (``CausalLM.carries_norms``), and then the first
      layer gets this state too: the embedding's rows and their parts
      (``embedding_with_parts``).

    Under tensor parallelism the o and down projections return each rank's
    partial sum: h' is summed over the ranks by the norm that adds it to the
    residual (one fused all-reduce + add + norm where the message is small);
    norms are never carried there.
    """

    def __init__(self, config: ModelConfig, tp: TensorParallelGroup, rotary: RotaryEmbedding,
                 backend: AttentionBackend, dtype: torch.dtype, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, tp)
        self.self_attn = LlamaAttention(config, tp, rotary, backend, dtype,
                                        config.layer_window(layer))
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype,
                                                tp)
        self.mlp = LlamaMLP(config, tp, dtype)

    def forward(self, positions: torch.Tensor, h: torch.Tensor | None,
                residual: torch.Tensor | None, kv_cache: torch.Tensor,
                attn: AttentionMetadata, parts: torch.Tensor | None = None,
                carry_norms: bool = False):
        """(h, residual, parts) -> the same for the next layer (see the class)."""
        if residual is None:
            residual, x = h, self.input_layernorm(h)
        elif parts is None:
            x, residual = self.input_layernorm(h, residual)
        elif self.self_attn.reads_raw_residual(attn):
            x = residual
        else:  # the norm on its own (its weight folded into qkv: 1)
            x, parts = self.input_layernorm(residual), None
        out = self.self_attn.attend(positions, x, kv_cache, attn, parts,
                                    self.input_layernorm.eps)
        if carry_norms:
            parts = self.self_attn.o_proj.add_into(out, residual)
            parts = self.mlp.add_to_residual(residual, parts, self.post_attention_layernorm.eps)
            return None, residual, parts
        h, residual = self.post_attention_layernorm(self.self_attn.o_proj(out), residual)
        return self.mlp(h), residual, None

    def fold_norm_weights(self) -> None:
        """Fold both norms' weights into the projections that read them
        (qkv, gate/up): see ``norm_in_matmul.fold_norm_weight``."""
        fold_norm_weight(self.self_attn.qkv_proj.weight, self.input_layernorm.weight)
        fold_norm_weight(self.mlp.gate_up_proj.weight, self.post_attention_layernorm.weight)

    def weight_slices(self, prefix: str) -> dict[str, WeightSlice]:
        slices = {
            f"{prefix}.input_layernorm.weight": WeightSlice.whole(self.input_layernorm.weight),
            f"{prefix}.post_attention_layernorm.weight":
                WeightSlice.whole(self.post_attention_layernorm.weight),
        }
        slices.update(self.self_attn.weight_slices(f"{prefix}.self_attn"))
        slices.update(self.mlp.weight_slices(f"{prefix}.mlp"))
        return slices
