"""A LoRA adapter in PEFT's format, read and checked against a model.

The directory holds ``adapter_config.json`` (``r``, ``lora_alpha``,
``target_modules``, ``use_rslora``, ``bias``) and
``adapter_model.safetensors``, whose tensors are named
``base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_{A|B}.weight``:
A is [r, in_features], B [out_features, r], and the module's output gains
``scale * x @ A^T @ B^T``, ``scale = lora_alpha / r`` (``lora_alpha /
sqrt(r)`` with ``use_rslora``).

``read_adapter`` is the one check of an adapter: the engine runs it when a
request names the adapter, before the request is queued (its failures are
the request's: ``InvalidRequestError``), and reads only the config file and
the safetensors header; the workers then load the tensors it listed
(``runner/lora``). It lives here because both sides use it and the runner
imports no package but ipc.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

from ipc.errors import InvalidRequestError
from ipc.model_config import ModelConfig

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# The projections an adapter may target, by the block that holds them.
ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")
TARGET_MODULES = ATTENTION_TARGETS + MLP_TARGETS
_TENSOR_NAME = re.compile(
    r"base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight")


@dataclass(frozen=True)
class AdapterTensor:
    """One tensor of the adapter file: layer ``layer``'s ``module``, factor
    "A" or "B"."""

    name: str
    layer: int
    module: str
    factor: str


@dataclass(frozen=True)
class LoRAAdapter:
    """An adapter that passed ``read_adapter``: ``weights_path`` holds
    ``tensors``, each of the shape the model implies for ``rank``."""

    path: str
    weights_path: str
    rank: int
    scale: float
    target_modules: tuple[str, ...]
    tensors: tuple[AdapterTensor, ...]


def module_shape(model: ModelConfig, module: str) -> tuple[int, int]:
    """(in_features, out_features) of one target projection, whole (before
    tensor-parallel sharding)."""
    c = model
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    return {"q_proj": (c.hidden_size, q), "k_proj": (c.hidden_size, kv),
            "v_proj": (c.hidden_size, kv), "o_proj": (q, c.hidden_size),
            "gate_proj": (c.hidden_size, c.intermediate_size),
            "up_proj": (c.hidden_size, c.intermediate_size),
            "down_proj": (c.intermediate_size, c.hidden_size)}[module]


class LoRAAdapterNotFoundError(InvalidRequestError):
    """No directory at the adapter's path (vLLM's name; an HTTP front end
    answers it 404, as vLLM's server answers an adapter it cannot find)."""


def _refuse(path: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"LoRA adapter {path!r}: {message}", param="lora_request")


def read_adapter(path: str, model: ModelConfig, max_lora_rank: int) -> LoRAAdapter:
    """The adapter at ``path``, checked against ``model`` and ``max_lora_rank``:
    ``InvalidRequestError`` naming what tprun cannot serve (a missing
    directory or file, a rank above the limit, a bias, DoRA, embeddings or
    the LM head, a module other than ``TARGET_MODULES``, a tensor of the
    wrong shape or a factor without its pair)."""
    config = _read_config(path)
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise _refuse(path, f"{CONFIG_FILE} needs 'r', an int >= 1, got {rank!r}")
    if rank > max_lora_rank:
        raise _refuse(path, f"LoRA rank {rank} is greater than max_lora_rank {max_lora_rank}")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise _refuse(path, f"{CONFIG_FILE} needs 'lora_alpha', a number, got {alpha!r}")
    if config.get("bias", "none") != "none":
        raise _refuse(path, f"bias {config['bias']!r} is not supported (only 'none')")
    if config.get("use_dora"):
        raise _refuse(path, "DoRA adapters (use_dora) are not supported")
    for key in ("modules_to_save", "rank_pattern", "alpha_pattern"):
        if config.get(key):
            raise _refuse(path, f"{key!r} is not supported (embeddings, the LM head and "
                          "per-module ranks cannot be served)")
    targets = _target_modules(path, config.get("target_modules"))
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    weights_path = os.path.join(path, WEIGHTS_FILE)
    tensors = _check_tensors(path, weights_path, model, rank, targets)
    return LoRAAdapter(path, weights_path, rank, float(scale), targets, tensors)


def _read_config(path: str) -> dict:
    config_path = os.path.join(path, CONFIG_FILE)
    if not os.path.isdir(path):
        raise LoRAAdapterNotFoundError(f"LoRA adapter {path!r}: no such directory",
                                       param="lora_request")
    if not os.path.isfile(config_path):
        raise _refuse(path, f"no {CONFIG_FILE} in it")
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise _refuse(path, f"cannot read {CONFIG_FILE}: {e}") from None
    if not isinstance(config, dict):
        raise _refuse(path, f"{CONFIG_FILE} is not a JSON object")
    return config


def _target_modules(path: str, targets) -> tuple[str, ...]:
    """The config's target modules as names (one name alone may be a string)."""
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not targets or not all(
            isinstance(t, str) for t in targets):
        raise _refuse(path, f"'target_modules' must list module names, got {targets!r}")
    names = [t.rsplit(".", 1)[-1] for t in targets]
    other = sorted(set(names) - set(TARGET_MODULES))
    if other:
        raise _refuse(path, f"target modules {other} cannot be served: LoRA applies to "
                      f"{', '.join(TARGET_MODULES)} (not embeddings or the LM head)")
    return tuple(dict.fromkeys(names))


def _check_tensors(path: str, weights_path: str, model: ModelConfig, rank: int,
                   targets: tuple[str, ...]) -> tuple[AdapterTensor, ...]:
    """Every tensor of the weights file named and shaped as the model
    implies (headers only), each A with its B."""
    from safetensors import safe_open

    if not os.path.isfile(weights_path):
        raise _refuse(path, f"no {WEIGHTS_FILE} in it (adapters are read from safetensors)")
    tensors = []
    try:
        with safe_open(weights_path, framework="numpy") as f:
            shapes = {name: tuple(f.get_slice(name).get_shape())
                      for name in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    except Exception as e:  # noqa: BLE001 (safetensors raises its own error type)
        raise _refuse(path, f"{WEIGHTS_FILE} is not a readable safetensors file: {e}") from None
    for name, shape in shapes.items():
        match = _TENSOR_NAME.fullmatch(name)
        if match is None:
            raise _refuse(path, f"tensor {name!r} is not a LoRA factor of a decoder "
                          f"projection ({', '.join(TARGET_MODULES)}); embeddings and the "
                          "LM head cannot be served")
        layer, block, module, factor = (int(match[1]), match[2], match[3], match[4])
        if module not in targets or block != ("self_attn" if module in ATTENTION_TARGETS
                                              else "mlp"):
            raise _refuse(path, f"tensor {name!r} is of no target module {list(targets)}")
        if layer >= model.num_hidden_layers:
            raise _refuse(path, f"tensor {name!r}: the model has {model.num_hidden_layers} "
                          "layers")
        fan_in, fan_out = module_shape(model, module)
        want = (rank, fan_in) if factor == "A" else (fan_out, rank)
        if shape != want:
            raise _refuse(path, f"tensor {name!r} has shape {list(shape)}, the model and "
                          f"rank {rank} imply {list(want)}")
        pair = name.replace(f"lora_{factor}.", "lora_B." if factor == "A" else "lora_A.")
        if pair not in shapes:
            raise _refuse(path, f"tensor {name!r} has no {pair!r}")
        tensors.append(AdapterTensor(name, layer, module, factor))
    if not tensors:
        raise _refuse(path, f"{WEIGHTS_FILE} holds no LoRA tensors")
    return tuple(tensors)
