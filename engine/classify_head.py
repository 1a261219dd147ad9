"""The head the engine applies to a classifier's logits (vLLM's
"classify" task, which a cross-encoder's pair scores run too), and the
request parameters it reads.

The runner sends each request's ``num_labels`` float32 logits (the pooled
last token through the checkpoint's score weight, on the device; for a
"token_classify" request, each prompt token's, one row a token). With
``use_activation`` on (the default) they pass through the classifier's
activation, as vLLM's classifier pooler chooses it; off, the raw logits.
An activation is one of these names:

- ``CLASSIFY``: softmax over the labels where there are two or more, the
  sigmoid of the one logit where there is one (vLLM's default);
- ``MULTI_LABEL``: each logit's sigmoid (labels that are independent
  yes/no answers);
- ``IDENTITY``: the logits as they are (a regression head's values);
- the qualified name of another ``torch.nn.modules`` class, built with no
  arguments and applied in eval mode to the ``[rows, num_labels]`` float32
  logits (e.g. ``torch.nn.modules.activation.Tanh``).

``classifier_activation`` reads it from config.json as vLLM does, the
first that says: its ``problem_type`` (as transformers' sequence
classification loss reads it: "regression" is ``IDENTITY``,
"single_label_classification" ``CLASSIFY``, "multi_label_classification"
``MULTI_LABEL``); else the activation a sentence-transformers
cross-encoder saved (Identity is ``IDENTITY``, Sigmoid and Softmax are
``CLASSIFY``, another class is applied as it is; only ``torch.nn.modules``
classes are loaded, as vLLM restricts them); else ``CLASSIFY``.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

import msgspec
import numpy as np

from engine.pooling_params import PoolingParams, check_task_parameters

CLASSIFY = "classify"
MULTI_LABEL = "multi_label"
IDENTITY = "identity"
# transformers' problem types, by the activation each takes.
_PROBLEM_TYPES = {"regression": IDENTITY, "single_label_classification": CLASSIFY,
                  "multi_label_classification": MULTI_LABEL}
# The only package whose classes a config.json may name as an activation.
_TORCH_MODULES = "torch.nn.modules."


def resolved_classify_params(params: PoolingParams, default_use_activation: bool | None,
                             task: str = "classify") -> PoolingParams:
    """``params`` of a classification (``task`` "classify" or
    "token_classify", ``check_task_parameters``) with ``use_activation``
    filled: the request's, else ``pooler_config``'s, else True."""
    params = check_task_parameters(params, task)
    if params.use_activation is None:
        on = True if default_use_activation is None else default_use_activation
        params = msgspec.structs.replace(params, use_activation=on)
    return params


def classifier_activation(problem_type: str | None, function_name: str | None,
                          num_labels: int) -> str:
    """The activation of a classifier of ``num_labels`` labels whose
    config.json gives ``problem_type`` and names the sentence-transformers
    activation ``function_name`` (None: not given). A ``ValueError`` for a
    function outside ``torch.nn.modules``, one that does not build with no
    arguments into a module, or one that fails on a row of ``num_labels``
    logits (tried once here, as vLLM's start-up pooler run tries it, so
    that no request is the first to find out)."""
    if problem_type in _PROBLEM_TYPES:
        return _PROBLEM_TYPES[problem_type]
    if function_name is None:
        return CLASSIFY
    module = _torch_module(function_name)
    from torch import nn

    if isinstance(module, nn.Identity):
        return IDENTITY
    if isinstance(module, (nn.Sigmoid, nn.Softmax)):
        return CLASSIFY
    try:
        activation_fn(function_name)(np.zeros((1, num_labels)))
    except Exception as e:  # the module's own code failed on the logits
        noun = "logit" if num_labels == 1 else "logits"
        raise ValueError(f"activation function {function_name!r} cannot be applied to "
                         f"{num_labels} {noun}: {e}") from None
    return function_name


def _torch_module(function_name: str):
    """An instance of the ``torch.nn.modules`` class ``function_name`` names,
    in eval mode (as a model's modules run at inference: dropout off,
    RReLU's fixed slope). What the name resolves to is called only once it
    is known to be a ``torch.nn.Module`` class: a checkpoint's text builds
    nothing else."""
    if not function_name.startswith(_TORCH_MODULES):
        raise ValueError(f"activation function {function_name!r}: only classes of "
                         f"torch.nn.modules are loaded")
    from torch import nn

    module_name, _, class_name = function_name.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"activation function {function_name!r} cannot be built: {e}") from None
    if not (isinstance(found, type) and issubclass(found, nn.Module)):
        raise ValueError(f"activation function {function_name!r} is not a torch module")
    try:
        return found().eval()
    except TypeError as e:
        raise ValueError(f"activation function {function_name!r} cannot be built: {e}") from None


@functools.cache
def activation_fn(activation: str) -> Callable[[np.ndarray], np.ndarray]:
    """The function of an activation name (the module's list): float64
    logits in, [rows, num_labels], float64 values out, each row's own (a
    request's one row, or a token-level request's row a token)."""
    if activation == IDENTITY:
        return lambda values: values
    if activation == MULTI_LABEL:
        return _sigmoid
    if activation == CLASSIFY:
        return lambda values: _sigmoid(values) if values.shape[-1] == 1 else _softmax(values)
    module = _torch_module(activation)

    def apply(values: np.ndarray) -> np.ndarray:
        import torch

        with torch.no_grad():
            out = module(torch.from_numpy(values.astype(np.float32)))
        return out.double().numpy()
    return apply


def _sigmoid(values: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-values))


def _softmax(values: np.ndarray) -> np.ndarray:
    values = np.exp(values - values.max(axis=-1, keepdims=True))
    return values / values.sum(axis=-1, keepdims=True)


def probabilities_of(logits: bytes, params: PoolingParams, activation: str = CLASSIFY,
                     num_rows: int = 1) -> bytes:
    """The request's output from the runner's logits (float32 little-endian
    bytes, ``num_rows`` rows one after the other: one for "classify", one
    a prompt token for "token_classify"): each row through ``activation``
    (the classifier's activation's name) where ``params.use_activation``;
    float32 little-endian bytes again, row after row."""
    values = np.frombuffer(logits, dtype="<f4").astype(np.float64).reshape(num_rows, -1)
    if params.use_activation:
        values = activation_fn(activation)(values)
    return values.astype("<f4").tobytes()
