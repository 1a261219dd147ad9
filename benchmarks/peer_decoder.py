"""A torch.compile'd Llama decoder: the peer tprun's decode step is timed against.

    python -m benchmarks.bench_decode --shape 8b --peer ...

Written from torch's public API only, after gpt-fast's recipe: plain modules,
fused qkv and gate/up projections, a static KV cache per layer
[batch, kv_heads, max_len, head_dim], the position given as a tensor (so one
captured graph serves every step), greedy argmax inside the compiled step,
``torch.compile(mode="reduce-overhead", fullgraph=True)`` (CUDA graphs).

Numerics follow HF's LlamaForCausalLM (RMSNorm in float32, rotate-half RoPE
with Llama-3 frequency scaling, SiLU MLP), so ``load_hf_state_dict`` gives the
same logits as HF on the same weights (tests/benchmarks/test_peer_decoder.py).

Invariants: one call takes tokens [B, T] at positions ``input_pos`` [T], the
same positions for every row; it writes their K/V at cache index = position
and the query at position p sees cache indices j <= p. GQA: the query heads
of a KV group are stacked along the query axis of one SDPA call per KV head,
so K/V are never expanded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class PeerConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    tie_word_embeddings: bool

    @classmethod
    def from_dict(cls, c: dict) -> PeerConfig:
        """From a Llama config.json's fields."""
        return cls(vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
                   intermediate_size=c["intermediate_size"], num_layers=c["num_hidden_layers"],
                   num_heads=c["num_attention_heads"], num_kv_heads=c["num_key_value_heads"],
                   head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
                   rms_norm_eps=c["rms_norm_eps"], rope_theta=c["rope_theta"],
                   rope_scaling=c.get("rope_scaling"),
                   tie_word_embeddings=c.get("tie_word_embeddings", False))


def inverse_frequencies(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """RoPE inverse frequencies [head_dim / 2], float32, with Llama-3 scaling:
    wavelengths past the original context's low-frequency bound are divided
    by ``factor``, those under its high-frequency bound kept, and the band
    between interpolated smoothly."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    if not scaling or scaling.get("rope_type", scaling.get("type")) != "llama3":
        return inv
    factor, old_len = scaling["factor"], scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelen = 2 * math.pi / inv
    smooth = (old_len / wavelen - low) / (high - low)
    interpolated = (1 - smooth) * inv / factor + smooth * inv
    out = torch.where(wavelen > old_len / low, inv / factor, inv)
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, interpolated, out)


def rope_tables(config: PeerConfig, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [max_len, head_dim] (each half repeated), float32."""
    inv = inverse_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D] rotated by the tables' rows [T, D] (rotate-half pairs)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class PeerBlock(nn.Module):
    """One decoder layer with its own static KV cache."""

    def __init__(self, c: PeerConfig, batch: int, max_len: int, dtype, device):
        super().__init__()
        kw = {"bias": False, "dtype": dtype, "device": device}
        self.c = c
        qkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
        self.wqkv = nn.Linear(c.hidden_size, qkv, **kw)
        self.wo = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, **kw)
        self.w13 = nn.Linear(c.hidden_size, 2 * c.intermediate_size, **kw)
        self.w2 = nn.Linear(c.intermediate_size, c.hidden_size, **kw)
        self.attn_norm = nn.Parameter(torch.ones(c.hidden_size, dtype=dtype, device=device))
        self.mlp_norm = nn.Parameter(torch.ones(c.hidden_size, dtype=dtype, device=device))
        self.set_cache(batch, max_len)

    def set_cache(self, batch: int, max_len: int) -> None:
        """Fresh zero K and V caches [batch, kv_heads, max_len, head_dim]."""
        shape = (batch, self.c.num_kv_heads, max_len, self.c.head_dim)
        w = self.wo.weight
        self.register_buffer("k_cache", torch.zeros(shape, dtype=w.dtype, device=w.device),
                             persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=w.dtype, device=w.device),
                             persistent=False)

    def attention(self, q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """q [B, H, T, D] over the whole cache, ``mask`` [T, max_len] -> [B, H, T, D]."""
        batch, heads, tokens, dim = q.shape
        kv_heads = self.c.num_kv_heads
        group = heads // kv_heads
        q = q.reshape(batch, kv_heads, group * tokens, dim)
        mask = mask.expand(group, tokens, mask.shape[-1]).reshape(group * tokens, -1)
        out = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask,
                                             scale=dim**-0.5)
        return out.view(batch, heads, tokens, dim)

    def forward(self, x, cos, sin, input_pos, mask):
        c = self.c
        batch, tokens, _ = x.shape
        h = rms_norm(x, self.attn_norm, c.rms_norm_eps)
        sizes = [c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim,
                 c.num_kv_heads * c.head_dim]
        q, k, v = self.wqkv(h).split(sizes, dim=-1)
        q = q.view(batch, tokens, c.num_heads, c.head_dim).transpose(1, 2)
        k = k.view(batch, tokens, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = v.view(batch, tokens, c.num_kv_heads, c.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        self.k_cache.index_copy_(2, input_pos, k)
        self.v_cache.index_copy_(2, input_pos, v)
        out = self.attention(q, mask).transpose(1, 2).reshape(batch, tokens, -1)
        x = x + self.wo(out)
        gate, up = self.w13(rms_norm(x, self.mlp_norm, c.rms_norm_eps)).chunk(2, dim=-1)
        return x + self.w2(F.silu(gate) * up)


class PeerDecoder(nn.Module):
    """Embedding -> blocks -> norm -> LM head, over static caches of ``batch`` rows.

    Weights are random (nn.Module's default initialisations) until
    ``load_hf_state_dict`` replaces them.
    """

    def __init__(self, config: PeerConfig, batch: int, max_len: int, dtype=torch.bfloat16,
                 device="cpu"):
        super().__init__()
        self.config = config
        kw = {"dtype": dtype, "device": device}
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, **kw)
        self.layers = nn.ModuleList(PeerBlock(config, batch, max_len, dtype, device)
                                    for _ in range(config.num_layers))
        self.norm = nn.Parameter(torch.ones(config.hidden_size, **kw))
        self.output = nn.Linear(config.hidden_size, config.vocab_size, bias=False, **kw)
        if config.tie_word_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.set_cache(batch, max_len)

    def set_cache(self, batch: int, max_len: int) -> None:
        """New zero caches for ``batch`` rows of ``max_len`` positions each."""
        for layer in self.layers:
            layer.set_cache(batch, max_len)
        cos, sin = rope_tables(self.config, max_len)
        device = self.norm.device
        self.register_buffer("cos", cos.to(device), persistent=False)
        self.register_buffer("sin", sin.to(device), persistent=False)
        self.register_buffer("positions", torch.arange(max_len, device=device), persistent=False)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] at positions input_pos [T] -> logits [B, T, vocab]."""
        cos, sin = self.cos[input_pos], self.sin[input_pos]
        mask = self.positions[None, :] <= input_pos[:, None]
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin, input_pos, mask)
        return self.output(rms_norm(x, self.norm, self.config.rms_norm_eps))

    @torch.no_grad()
    def load_hf_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy an HF LlamaForCausalLM's weights in (q/k/v and gate/up fused)."""
        self.tok_embeddings.weight.copy_(state["model.embed_tokens.weight"])
        self.norm.copy_(state["model.norm.weight"])
        if not self.config.tie_word_embeddings:
            self.output.weight.copy_(state["lm_head.weight"])
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            layer.wqkv.weight.copy_(torch.cat([state[p + f"self_attn.{n}_proj.weight"]
                                               for n in "qkv"]))
            layer.wo.weight.copy_(state[p + "self_attn.o_proj.weight"])
            layer.w13.weight.copy_(torch.cat([state[p + "mlp.gate_proj.weight"],
                                              state[p + "mlp.up_proj.weight"]]))
            layer.w2.weight.copy_(state[p + "mlp.down_proj.weight"])
            layer.attn_norm.copy_(state[p + "input_layernorm.weight"])
            layer.mlp_norm.copy_(state[p + "post_attention_layernorm.weight"])


def greedy_step(model: PeerDecoder, tokens: torch.Tensor, input_pos: torch.Tensor):
    """One decode step: tokens [B, 1] at input_pos [1] -> next tokens [B, 1]."""
    return model(tokens, input_pos)[:, -1].argmax(dim=-1, keepdim=True)


def compile_step(mode: str | None = "reduce-overhead"):
    """``greedy_step`` compiled whole (static shapes: a new batch recompiles)."""
    return torch.compile(greedy_step, mode=mode, fullgraph=True, dynamic=False)


@torch.no_grad()
def generate(model: PeerDecoder, step, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuation of ``prompt`` [B, T] by ``new_tokens`` tokens: an
    eager prefill, then ``step`` (greedy_step or a compiled one) per token."""
    length = prompt.shape[1]
    positions = torch.arange(length, device=prompt.device)
    token = model(prompt, positions)[:, -1].argmax(dim=-1, keepdim=True)
    out = [token]
    pos = torch.tensor([length], device=prompt.device)
    for _ in range(new_tokens - 1):
        token = step(model, token, pos).clone()
        pos += 1
        out.append(token)
    return torch.cat(out, dim=1)
