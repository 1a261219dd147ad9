"""``ModelConfig``: the one description of a model's shape and numerics.

The engine reads a checkpoint's config.json (and generation_config.json;
a GGUF file's metadata arrives as such a directory) once, in
``checkpoint.description.describe``, into this typed Struct. It travels to
every worker inside ``RunnerConfig``, so the runner builds its model from it
without reading a file. The rules about a model live here and nowhere else:
the supported architectures, the dtypes, the shapes that must agree
(checked on construction and on decoding), and the tensor-parallel
divisibility (``check_tensor_parallel``).
"""

from __future__ import annotations

import msgspec

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "LlamaForSequenceClassification",
)

# Architectures whose checkpoint is a sequence classifier: the decoder and a
# ``score.weight`` [num_labels, hidden] without bias, read at the last token
# (vLLM serves them with the pooling runner's "classify" task).
SEQUENCE_CLASSIFIERS = ("LlamaForSequenceClassification",)

# Weight and activation dtypes, by the name torch gives them
# (``getattr(torch, name)`` is the dtype).
MODEL_DTYPES = ("float32", "float16", "bfloat16")
# Their other spellings (Hugging Face's configs, vLLM's --dtype).
DTYPE_ALIASES = {"float": "float32", "half": "float16"}


class Llama3RopeScaling(msgspec.Struct, frozen=True, kw_only=True):
    """Llama 3.1 frequency-dependent rope scaling ("rope_type": "llama3")."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        if self.factor <= 0 or self.low_freq_factor <= 0:
            raise ValueError(f"llama3 rope scaling needs positive factors, got {self}")
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"llama3 rope scaling needs high_freq_factor > low_freq_factor, got {self}"
            )


class ModelConfig(msgspec.Struct, frozen=True, kw_only=True):
    """A Llama-family decoder: every architecture in SUPPORTED_ARCHITECTURES.

    ``qkv_bias`` adds biases to q/k/v projections, ``o_bias`` to the output
    projection, ``qk_norm`` applies per-head RMSNorm to q and k before rope
    (Qwen3). ``dtype`` is the checkpoint's dtype (what "auto" resolves to).
    ``sliding_window`` W (when set) limits the layers in ``sliding_layers``
    to the last W keys: query position q sees keys k with q - W < k <= q.
    ``max_position_embeddings`` is None when the checkpoint gives none (then
    the engine needs ``max_model_len``). ``eos_token_ids``: every id that
    ends a sequence, config.json's and generation_config.json's.
    ``labels``: a classifier's label names by index (config.json's
    ``id2label``, else transformers' ``LABEL_<i>``), ``num_labels`` of them (config.json's,
    Hugging Face's default 2 where it gives neither); a classify engine's
    score head has one row per label. ``problem_type``: config.json's
    (transformers' "regression", "single_label_classification" or
    "multi_label_classification"; None where it gives none), which chooses
    a classifier's activation. ``sentence_transformers_activation``: the
    qualified name of the torch module a sentence-transformers
    cross-encoder applies to its logits (config.json's
    ``sentence_transformers.activation_fn``, else its
    ``sbert_ce_default_activation_function``; None where it names none),
    the activation where ``problem_type`` names none.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Llama3RopeScaling | None
    max_position_embeddings: int | None
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool
    dtype: str
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    sliding_window: int | None
    sliding_layers: tuple[int, ...]
    labels: tuple[str, ...] = ("LABEL_0", "LABEL_1")
    problem_type: str | None = None
    sentence_transformers_activation: str | None = None

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {self.architecture!r} "
                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.dtype not in MODEL_DTYPES:
            raise ValueError(f"unsupported checkpoint dtype {self.dtype!r}; "
                             f"supported: {', '.join(MODEL_DTYPES)}")
        if not self.labels:
            raise ValueError("num_labels must be >= 1, got 0")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1, got {self.sliding_window}")
        if self.sliding_layers and self.sliding_window is None:
            raise ValueError("sliding_layers given without a sliding_window")
        if any(not 0 <= i < self.num_hidden_layers for i in self.sliding_layers):
            raise ValueError(f"sliding_layers {self.sliding_layers} outside "
                             f"0 .. {self.num_hidden_layers - 1}")

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of decoder layer ``layer``, or None (full attention)."""
        return self.sliding_window if layer in self.sliding_layers else None

    def check_tensor_parallel(self, tp_size: int, name: str = "the model") -> None:
        """ValueError unless heads and MLP columns split evenly over ``tp_size``
        ranks (``name`` is the model as the message names it).

        Fewer kv heads than ranks is allowed when tp_size is a multiple of them
        (each rank then holds one replicated kv head).
        """
        heads, kv = self.num_attention_heads, self.num_key_value_heads
        if heads % tp_size:
            raise ValueError(f"{name} has {heads} attention heads, which do not divide by the "
                             f"tensor-parallel size {tp_size}")
        if (kv >= tp_size and kv % tp_size) or (kv < tp_size and tp_size % kv):
            raise ValueError(f"{name} has {kv} KV heads; they and the tensor-parallel size "
                             f"{tp_size} must divide one another")
        if self.intermediate_size % tp_size:
            raise ValueError(f"{name}'s intermediate_size {self.intermediate_size} does not "
                             f"divide by the tensor-parallel size {tp_size}")
