"""A GGUF file's metadata as the Hugging Face files tprun reads: config.json.

llama.cpp stores a model's shape under ``{arch}.*`` keys (``llama.block_count``,
``llama.attention.head_count`` ...). ``hf_config`` turns them into the
config.json dict ``checkpoint.description`` reads, so a GGUF model follows
the same code paths as a safetensors checkpoint. Only the Llama architecture is mapped
(llama.cpp files Mistral and SmolLM under it too); anything else is refused.
"""

from __future__ import annotations

from typing import Any

# GGUF file types (general.file_type) whose tensors are all in one float
# format; every other file type is quantized and is dequantized to float32.
_FLOAT_FILE_TYPES = {0: "float32", 1: "float16", 32: "bfloat16"}

SUPPORTED_GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM"}


def field(reader, key: str, default: Any = None) -> Any:
    """The value of metadata ``key`` (str, number, bool or list), or ``default``."""
    entry = reader.fields.get(key)
    if entry is None:
        return default
    return entry.contents()


def require(reader, key: str) -> Any:
    """The value of metadata ``key``; ValueError when the file lacks it."""
    value = field(reader, key)
    if value is None:
        raise ValueError(f"GGUF file lacks metadata key {key!r}")
    return value


def hf_config(reader) -> dict[str, Any]:
    """The config.json equivalent of a GGUF file (a ``gguf.GGUFReader``).

    ``tie_word_embeddings`` holds when the file has no ``output.weight``
    (llama.cpp then reads the LM head from ``token_embd.weight``).
    """
    arch = require(reader, "general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ValueError(f"unsupported GGUF architecture {arch!r}; supported: "
                         f"{', '.join(SUPPORTED_GGUF_ARCHITECTURES)}")
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise ValueError("GGUF files with rope_freqs (Llama 3.1 rope scaling) are not supported")
    scaling = field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise ValueError(f"unsupported GGUF rope scaling {scaling!r}")
    heads = require(reader, f"{arch}.attention.head_count")
    hidden = require(reader, f"{arch}.embedding_length")
    head_dim = field(reader, f"{arch}.attention.key_length") or hidden // heads
    rope_dim = field(reader, f"{arch}.rope.dimension_count", head_dim)
    if rope_dim != head_dim:
        raise ValueError(f"partial rotary (rope dims {rope_dim} of head_dim {head_dim}) "
                         "is not supported")
    tokens = require(reader, "tokenizer.ggml.tokens")
    config = {
        "architectures": [SUPPORTED_GGUF_ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": field(reader, f"{arch}.vocab_size") or len(tokens),
        "hidden_size": hidden,
        "intermediate_size": require(reader, f"{arch}.feed_forward_length"),
        "num_hidden_layers": require(reader, f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": field(reader, f"{arch}.attention.head_count_kv") or heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": require(reader, f"{arch}.context_length"),
        "rms_norm_eps": float(require(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field(reader, f"{arch}.rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in names,
        "dtype": _FLOAT_FILE_TYPES.get(field(reader, "general.file_type", -1), "float32"),
    }
    for key in ("bos", "eos"):
        token_id = field(reader, f"tokenizer.ggml.{key}_token_id")
        if token_id is not None:
            config[f"{key}_token_id"] = int(token_id)
    return config
