"""The embedded default model ``tiny``: a small Llama with a byte-level tokenizer.

``ensure_tiny_model()`` writes it once as an ordinary Hugging Face directory
(config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
special_tokens_map.json) and returns its path; it loads through the same
loader as any checkpoint, and in transformers too.

Vocabulary: id b (0..255) is the byte b, written as its GPT-2 byte-level
symbol; <s>=256, </s>=257, <pad>=258; ids 259..319 are padding (their LM-head
rows are zero). Encoding prepends <s>; the literal strings "<s>", "</s>" and
"<pad>" in a text encode as those special tokens, as in Llama tokenizers. Weights are float32, drawn from a
fixed seed and scaled so the logits spread with a std of about 2. The tokenizer config carries a
small chat template (``CHAT_TEMPLATE``), so chat requests work against ``tiny`` too.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file

from checkpoint.cache_dir import default_cache_dir, ensure_written

TINY_VERSION = 2
TINY_NAME = f"tiny-v{TINY_VERSION}"
SEED = 20240601

BOS, EOS, PAD = 256, 257, 258
SPECIAL_TOKENS = {"<s>": BOS, "</s>": EOS, "<pad>": PAD}
NUM_REAL_TOKENS = 259

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "attention_bias": False,
    "attention_dropout": 0.0,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "pad_token_id": PAD,
    "dtype": "float32",
    "use_cache": True,
}


def ensure_tiny_model(cache_dir: str | None = None) -> str:
    """Path of the ``tiny`` model directory, written on first use."""
    return ensure_written(cache_dir or default_cache_dir(), TINY_NAME, write_tiny_model)


def write_tiny_model(out_dir: str) -> None:
    """Write every file of the model into the existing directory ``out_dir``
    (config.json last: it marks the directory complete)."""
    save_file(tiny_weights(), os.path.join(out_dir, "model.safetensors"),
              metadata={"format": "pt"})
    build_tokenizer().save(os.path.join(out_dir, "tokenizer.json"))
    _write_tokenizer_configs(out_dir)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)


def tiny_weights() -> dict[str, torch.Tensor]:
    """Deterministic float32 weights in Hugging Face Llama naming."""
    c = CONFIG
    hidden, inter, head_dim = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q_out = c["num_attention_heads"] * head_dim
    kv_out = c["num_key_value_heads"] * head_dim
    gen = torch.Generator().manual_seed(SEED)

    def normal(rows: int, cols: int, std: float) -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen) * std

    weights = {"model.embed_tokens.weight": normal(c["vocab_size"], hidden, 1.0)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        weights[f"{p}.input_layernorm.weight"] = torch.ones(hidden)
        weights[f"{p}.post_attention_layernorm.weight"] = torch.ones(hidden)
        for name, rows in (("q", q_out), ("k", kv_out), ("v", kv_out)):
            weights[f"{p}.self_attn.{name}_proj.weight"] = normal(rows, hidden, hidden ** -0.5)
        weights[f"{p}.self_attn.o_proj.weight"] = normal(hidden, q_out, q_out ** -0.5)
        weights[f"{p}.mlp.gate_proj.weight"] = normal(inter, hidden, hidden ** -0.5)
        weights[f"{p}.mlp.up_proj.weight"] = normal(inter, hidden, hidden ** -0.5)
        weights[f"{p}.mlp.down_proj.weight"] = normal(hidden, inter, inter ** -0.5)
    weights["model.norm.weight"] = torch.ones(hidden)
    lm_head = normal(c["vocab_size"], hidden, 2.0 * hidden ** -0.5)
    lm_head[NUM_REAL_TOKENS:] = 0.0
    weights["lm_head.weight"] = lm_head
    return {name: t.contiguous() for name, t in weights.items()}


def byte_symbols() -> list[str]:
    """GPT-2 byte-level alphabet: symbol of byte b at index b.

    Printable Latin-1 bytes stand for themselves; the other bytes, in
    increasing order, take the characters U+0100, U+0101, ...
    """
    printable = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    symbols, extra = [], 0
    for b in range(256):
        if b in printable:
            symbols.append(chr(b))
        else:
            symbols.append(chr(0x100 + extra))
            extra += 1
    return symbols


def build_tokenizer():
    """Byte-level BPE without merges: every byte is one token, id = byte value."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {symbol: b for b, symbol in enumerate(byte_symbols())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(name, special=True) for name in SPECIAL_TOKENS])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS)])
    for name, token_id in SPECIAL_TOKENS.items():
        if tok.token_to_id(name) != token_id:
            raise RuntimeError(f"special token {name} got id {tok.token_to_id(name)}")
    return tok


# A small chat template in transformers' convention: each message as
# "<|role|>\n" + content + eos, BOS first, the assistant's header last when a
# reply is wanted; unknown roles are refused.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role: ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def _write_tokenizer_configs(out_dir: str) -> None:
    special = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": CONFIG["max_position_embeddings"],
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        **special,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config, f, indent=2)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as f:
        json.dump(special, f, indent=2)
