"""Random LoRA adapters for a small HF Llama, written in PEFT's format, and
the reference they are checked against: the same model with each adapter's
product merged into its weights, W + scale * B @ A."""

from __future__ import annotations

import copy
import json
import math

import torch
from safetensors.torch import save_file

from ipc.lora_request import LoRARequest

_BLOCK = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
          "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def write_adapter(path, model, targets: list[str], rank: int, alpha: float, seed: int,
                  use_rslora: bool = False, config_extra: dict | None = None) -> dict:
    """A random adapter of ``model`` (an HF LlamaForCausalLM) on ``targets``
    in every layer, written under ``path`` as PEFT writes one; returns its
    factors {(layer, module): (A, B)} and its scale."""
    gen = torch.Generator().manual_seed(seed)
    factors = {}
    tensors = {}
    for i, layer in enumerate(model.model.layers):
        for module in targets:
            weight = getattr(getattr(layer, _BLOCK[module]), module).weight
            out_features, in_features = weight.shape
            a = torch.randn(rank, in_features, generator=gen) * 0.1
            b = torch.randn(out_features, rank, generator=gen) * 0.1
            factors[(i, module)] = (a, b)
            prefix = f"base_model.model.model.layers.{i}.{_BLOCK[module]}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = a.contiguous()
            tensors[f"{prefix}.lora_B.weight"] = b.contiguous()
    path.mkdir(parents=True, exist_ok=True)
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": targets,
              "use_rslora": use_rslora, "bias": "none", "lora_dropout": 0.0,
              "task_type": "CAUSAL_LM", **(config_extra or {})}
    (path / "adapter_config.json").write_text(json.dumps(config))
    save_file(tensors, str(path / "adapter_model.safetensors"))
    scale = alpha / math.sqrt(rank) if use_rslora else alpha / rank
    return {"factors": factors, "scale": scale}


def read_adapter_files(path) -> dict:
    """The adapter ``write_adapter`` wrote under ``path``, read back from its
    files in the form ``write_adapter`` returns."""
    from safetensors.torch import load_file

    config = json.loads((path / "adapter_config.json").read_text())
    rank, alpha = config["r"], config["lora_alpha"]
    tensors = load_file(str(path / "adapter_model.safetensors"))
    factors = {}
    for name, a in tensors.items():
        if ".lora_A." in name:
            parts = name.split(".")
            factors[(int(parts[4]), parts[6])] = (a, tensors[name.replace(".lora_A.", ".lora_B.")])
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return {"factors": factors, "scale": scale}


def merged(model, adapter: dict):
    """A copy of ``model`` with the adapter merged: W += scale * B @ A."""
    copy_ = copy.deepcopy(model)
    with torch.no_grad():
        for (i, module), (a, b) in adapter["factors"].items():
            layer = copy_.model.layers[i]
            weight = getattr(getattr(layer, _BLOCK[module]), module).weight
            weight += adapter["scale"] * (b @ a)
    return copy_


def greedy(model, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """HF's greedy continuation of each prompt (eos ignored)."""
    with torch.no_grad():
        return [model.generate(torch.tensor([p]), max_new_tokens=max_tokens, do_sample=False,
                               eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
                for p in prompts]


ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# lora_int_id -> (targets, rank, alpha, use_rslora): every target at rank 8;
# q and v at rank 4 with rsLoRA; the MLP alone at the limit of 16.
ADAPTERS = {1: (ALL_TARGETS, 8, 16.0, False), 2: (["q_proj", "v_proj"], 4, 8.0, True),
            3: (["gate_proj", "up_proj", "down_proj"], 16, 16.0, False)}


def model_with_adapters(root, prompts: list[list[int]], max_tokens: int,
                        max_position_embeddings: int = 512):
    """A small Llama with one kv head (replicated under tensor parallelism)
    saved in ``root / "model"``, the ``ADAPTERS`` beside it in ``root /
    "adapter{id}"``, and HF's greedy tokens of each prompt per adapter id
    (None: the base model). Returns (model dir, {id: adapter dir},
    {id or None: tokens per prompt}); each adapter changes the output.
    ``max_position_embeddings``: the model's length (a request that should
    stay running while a test looks at it asks for many tokens)."""
    from tests.helpers.hf_models import save_with_greedy_reference, small_llama

    model = small_llama(0, 256, num_attention_heads=4, num_key_value_heads=1,
                        max_position_embeddings=max_position_embeddings, rms_norm_eps=1e-6)
    expected = {None: save_with_greedy_reference(model, root / "model", prompts, max_tokens)}
    paths = {}
    for lora_id, (targets, rank, alpha, rslora) in ADAPTERS.items():
        paths[lora_id] = root / f"adapter{lora_id}"
        adapter = write_adapter(paths[lora_id], model, targets, rank, alpha, seed=lora_id,
                                use_rslora=rslora)
        expected[lora_id] = greedy(merged(model, adapter), prompts, max_tokens)
    outputs = [tuple(map(tuple, tokens)) for tokens in expected.values()]
    assert len(set(outputs)) == len(outputs), "an adapter leaves the output unchanged"
    return str(root / "model"), {k: str(v) for k, v in paths.items()}, expected


def model_with_adapter_requests(root, prompts: list[list[int]], max_tokens: int):
    """``model_with_adapters``, each adapter given as the ``LoRARequest``
    that serves it (named ``adapter{id}``, its id, its folder). Returns
    (model dir, {id: request}, {id or None: tokens per prompt})."""
    model_dir, paths, expected = model_with_adapters(root, prompts, max_tokens)
    loras = {i: LoRARequest(f"adapter{i}", i, path) for i, path in paths.items()}
    return model_dir, loras, expected
