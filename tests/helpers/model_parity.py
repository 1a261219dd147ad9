"""Random float32 HF checkpoints of each supported architecture and the
paged scenario that computes a model's logits through the KV cache, shared by
the model parity tests.

Two requests run as the runner would drive them: chunked prefill (the second
chunk starts past the first block), a step with padding tokens, then decode
steps; block tables are shuffled. ``check_close`` compares the logits with
HF's on the full sequences.
"""

from __future__ import annotations

import torch

from runner.attention.metadata import AttentionMetadata

PROMPT_LENS = (37, 21)
DECODE_STEPS = 3
BLOCK_SIZES = (16, 8)
# (request, start, end) per step; a step whose rows are all one token long is a decode step.
CHUNKS = [
    [(0, 0, 20), (1, 0, 5)],
    [(0, 20, 37), (1, 5, 21)],
] + [[(0, 37 + i, 38 + i), (1, 21 + i, 22 + i)] for i in range(DECODE_STEPS)]
PADDED_STEP, NUM_PAD = 1, 2

COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=256, rms_norm_eps=1e-5)
CONFIGS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(num_key_value_heads=2, vocab_size=199, tie_word_embeddings=False)),
    "llama3_tied": ("LlamaConfig", "LlamaForCausalLM",
                    dict(num_key_value_heads=2, vocab_size=150, tie_word_embeddings=True,
                         rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                           high_freq_factor=4.0,
                                           original_max_position_embeddings=16),
                         rope_theta=500000.0)),
    "llama_1kv_bias": ("LlamaConfig", "LlamaForCausalLM",
                       dict(num_key_value_heads=1, vocab_size=131, attention_bias=True)),
    "mistral": ("MistralConfig", "MistralForCausalLM",
                dict(num_key_value_heads=2, vocab_size=160, sliding_window=None)),
    "mistral_window": ("MistralConfig", "MistralForCausalLM",
                       dict(num_key_value_heads=2, vocab_size=163, sliding_window=8)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(num_key_value_heads=2, vocab_size=177, tie_word_embeddings=False)),
    # Layer 0 attends fully, layer 1 through a window of 6 (max_window_layers=1).
    "qwen2_window": ("Qwen2Config", "Qwen2ForCausalLM",
                     dict(num_key_value_heads=2, vocab_size=171, use_sliding_window=True,
                          sliding_window=6, max_window_layers=1)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(num_key_value_heads=2, vocab_size=140, head_dim=32)),
}


def sequences(vocab_size: int) -> list[list[int]]:
    """The full token sequence (prompt + decoded tokens) of each request."""
    gen = torch.Generator().manual_seed(vocab_size)
    return [torch.randint(0, vocab_size, (n + DECODE_STEPS,), generator=gen).tolist()
            for n in PROMPT_LENS]


def block_tables(block_size: int) -> tuple[torch.Tensor, int]:
    """Shuffled, disjoint block rows for the two requests, and the pool size."""
    per_req = -(-(max(PROMPT_LENS) + DECODE_STEPS) // block_size)
    num_blocks = 2 * per_req + 3
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(block_size))
    return perm[: 2 * per_req].view(2, per_req).to(torch.int32), num_blocks


def step_metadata(chunks, table: torch.Tensor, block_size: int, pad: int,
                  device: torch.device) -> AttentionMetadata:
    """Metadata of one step; ``pad`` extra tokens (slot -1) follow the real ones."""
    lens = [end - start for _, start, end in chunks]
    qsl = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    seq_lens = torch.tensor([end for _, _, end in chunks], dtype=torch.int32)
    slots = []
    for req, start, end in chunks:
        for pos in range(start, end):
            slots.append(int(table[req, pos // block_size]) * block_size + pos % block_size)
    slots += [-1] * pad
    rows = torch.stack([table[req] for req, _, _ in chunks])
    return AttentionMetadata(
        num_reqs=len(chunks), num_tokens=int(qsl[-1]),
        num_decodes=len(chunks) if max(lens) == 1 else 0,
        max_query_len=max(lens), max_seq_len=int(seq_lens.max()),
        query_start_loc=qsl.to(device), seq_lens=seq_lens.to(device),
        block_tables=rows.to(device), slot_mapping=torch.tensor(slots, device=device),
        query_start_loc_cpu=qsl.clone(), seq_lens_cpu=seq_lens.clone())


@torch.inference_mode()
def run_scenario(model, block_size: int, device: str = "cpu") -> list[torch.Tensor]:
    """Logits of every position of each request, computed step by step through the cache."""
    seqs = sequences(model.config.vocab_size)
    table, num_blocks = block_tables(block_size)
    caches = [torch.full(model.kv_cache_shape(num_blocks, block_size), float("nan"), device=device)
              for _ in range(model.config.num_hidden_layers)]
    out: list[list[torch.Tensor]] = [[], []]
    for step, chunks in enumerate(CHUNKS):
        pad = NUM_PAD if step == PADDED_STEP else 0
        attn = step_metadata(chunks, table, block_size, pad, device)
        ids = [seqs[r][p] for r, s, e in chunks for p in range(s, e)] + [0] * pad
        pos = [p for _, s, e in chunks for p in range(s, e)] + [0] * pad
        hidden = model(torch.tensor(ids, dtype=torch.int32, device=device),
                       torch.tensor(pos, device=device), caches, attn)
        logits = model.compute_logits(hidden[: attn.num_tokens]).cpu()
        for i, (req, _, _) in enumerate(chunks):
            out[req].append(logits[attn.query_start_loc_cpu[i]:attn.query_start_loc_cpu[i + 1]])
    return [torch.cat(chunks) for chunks in out]


def randomize(model, seed: int) -> None:
    """Weights with unit-scale activations and logits of std about 2 (no near-ties)."""
    gen = torch.Generator().manual_seed(seed)
    hidden = model.config.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.dim() == 1:
                p.copy_(noise * 0.1 + (0.0 if name.endswith("bias") else 1.0))
            elif "lm_head" in name or ("embed" in name and model.config.tie_word_embeddings):
                p.copy_(noise * 2.0 / hidden ** 0.5)
            else:
                p.copy_(noise * (1.0 if "embed" in name else p.shape[1] ** -0.5))


def save_hf_model(name: str, out_dir: str) -> list[torch.Tensor]:
    """Save config ``name`` to out_dir; return HF's logits for each full sequence."""
    import transformers

    config_cls, model_cls, extra = CONFIGS[name]
    config = getattr(transformers, config_cls)(**COMMON, **extra)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).float().eval()
    randomize(model, seed=len(name))
    model.save_pretrained(out_dir)
    with torch.no_grad():
        return [model(torch.tensor([s])).logits[0].float() for s in sequences(config.vocab_size)]


def check_close(ours: list[torch.Tensor], reference: list[torch.Tensor], tol: float = 1e-4) -> None:
    for got, want in zip(ours, reference, strict=True):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
