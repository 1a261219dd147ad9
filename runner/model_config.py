"""The model's shape and numerics, read from a Hugging Face ``config.json``."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from ipc.config import SUPPORTED_ARCHITECTURES

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
}


@dataclass(frozen=True)
class Llama3RopeScaling:
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


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-family decoder: every architecture in SUPPORTED_ARCHITECTURES.

    ``qkv_bias`` adds biases to q/k/v projections, ``o_bias`` to the output
    projection, ``qk_norm`` applies per-head RMSNorm to q and k before rope
    (Qwen3). ``dtype`` is the checkpoint's dtype ("auto" resolves to it).
    ``sliding_window`` W (when set) limits the layers in ``sliding_layers``
    to the last W keys: query position q sees keys k with q - W < k <= q.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Llama3RopeScaling | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    dtype: torch.dtype = torch.float32
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {self.architecture!r}; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim",
                     "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.dtype not in _DTYPES.values():
            raise ValueError(f"unsupported dtype {self.dtype}")
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

    def check_tensor_parallel(self, tp_size: int) -> None:
        """ValueError unless heads and MLP columns split evenly over ``tp_size`` ranks.

        Fewer kv heads than ranks is allowed when tp_size is a multiple of them
        (each rank then holds one replicated kv head).
        """
        if self.num_attention_heads % tp_size:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) is not "
                             f"divisible by tensor-parallel size {tp_size}")
        kv = self.num_key_value_heads
        if (kv >= tp_size and kv % tp_size) or (kv < tp_size and tp_size % kv):
            raise ValueError(f"num_key_value_heads ({kv}) and tensor-parallel size {tp_size} "
                             "must divide one another")
        if self.intermediate_size % tp_size:
            raise ValueError(f"intermediate_size ({self.intermediate_size}) is not divisible "
                             f"by tensor-parallel size {tp_size}")

    @property
    def eos_token_id(self) -> int | None:
        """The first end-of-sequence id, or None."""
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @classmethod
    def from_dir(cls, model_dir: str) -> ModelConfig:
        """Read ``model_dir/config.json`` (transformers 4 or 5 layout)."""
        path = os.path.join(model_dir, "config.json")
        if not os.path.isfile(path):
            raise ValueError(f"no config.json in {model_dir!r}")
        with open(path) as f:
            return cls.from_hf_dict(json.load(f))

    @classmethod
    def from_hf_dict(cls, hf: dict) -> ModelConfig:
        """Build from the parsed contents of a Hugging Face config.json."""
        archs = hf.get("architectures") or []
        arch = archs[0] if archs else f"<none, model_type={hf.get('model_type')!r}>"
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        _check_activation(hf)
        heads = hf["num_attention_heads"]
        theta, scaling = _rope(hf)
        bias = bool(hf.get("attention_bias", False))
        return cls(
            architecture=arch,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=bias or arch == "Qwen2ForCausalLM",
            o_bias=bias and arch != "Qwen2ForCausalLM",
            qk_norm=arch == "Qwen3ForCausalLM",
            dtype=_dtype(hf),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=_eos_ids(hf.get("eos_token_id")),
            **_sliding(hf, arch),
        )


def _check_activation(hf: dict) -> None:
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"unsupported hidden_act {act!r}; only 'silu' is implemented")
    if hf.get("mlp_bias", False):
        raise ValueError("mlp_bias=True is not supported")


def _rope(hf: dict) -> tuple[float, Llama3RopeScaling | None]:
    """(theta, scaling) from ``rope_parameters`` (transformers 5) or the older keys."""
    params = dict(hf.get("rope_parameters") or {})
    legacy = hf.get("rope_scaling") or {}
    for key, value in legacy.items():
        params.setdefault(key, value)
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in (None, "default"):
        return theta, None
    if kind != "llama3":
        raise ValueError(f"unsupported rope type {kind!r}; supported: 'default', 'llama3'")
    scaling = Llama3RopeScaling(
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]),
    )
    return theta, scaling


def _dtype(hf: dict) -> torch.dtype:
    name = hf.get("dtype") or hf.get("torch_dtype") or "float32"
    name = str(name).removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"unsupported checkpoint dtype {name!r}; supported: {sorted(_DTYPES)}")
    return _DTYPES[name]


def _eos_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _sliding(hf: dict, arch: str) -> dict:
    """``sliding_window`` and ``sliding_layers`` as transformers reads them:
    ``layer_types`` when the config lists them; else Qwen2/3 slide from layer
    ``max_window_layers`` on (only with ``use_sliding_window``), Mistral on
    every layer, Llama never."""
    window = hf.get("sliding_window")
    qwen = arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM")
    if not window or arch == "LlamaForCausalLM" or (qwen and not hf.get("use_sliding_window")):
        return {}
    num_layers = hf["num_hidden_layers"]
    if hf.get("layer_types"):
        layers = [i for i, kind in enumerate(hf["layer_types"]) if kind == "sliding_attention"]
    elif qwen:
        layers = list(range(hf.get("max_window_layers", 28), num_layers))
    else:
        layers = list(range(num_layers))
    return {"sliding_window": int(window), "sliding_layers": tuple(layers)} if layers else {}
