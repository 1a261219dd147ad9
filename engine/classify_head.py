"""The classification head the engine applies to a classifier's logits
(vLLM's "classify" task), and the request parameters it reads.

The runner sends each request's ``num_labels`` float32 logits (the pooled
last token through the checkpoint's score weight, on the device). With
``use_activation`` on (the default) they become probabilities as vLLM's
classifier pooler makes them: softmax over the labels where there are two
or more, the sigmoid of the one logit where there is one (a single-label
classifier's score, e.g. a cross-encoder's), and each logit's sigmoid
for a multi-label classifier (config.json's ``problem_type``
"multi_label_classification", whose labels are independent yes/no
answers); off, the raw logits.
"""

from __future__ import annotations

import msgspec
import numpy as np

from engine.pooling_params import PoolingParams, check_task_parameters


def resolved_classify_params(params: PoolingParams,
                             default_use_activation: bool | None) -> PoolingParams:
    """``params`` of a classification (``check_task_parameters``) with
    ``use_activation`` filled: the request's, else ``pooler_config``'s,
    else True."""
    params = check_task_parameters(params, "classify")
    if params.use_activation is None:
        on = True if default_use_activation is None else default_use_activation
        params = msgspec.structs.replace(params, use_activation=on)
    return params


def probabilities_of(logits: bytes, params: PoolingParams, multi_label: bool = False) -> bytes:
    """The request's output from the runner's logits (float32 little-endian
    bytes): activated as the module says where ``params.use_activation``
    (``multi_label``: each label's sigmoid); float32 little-endian bytes
    again."""
    values = np.frombuffer(logits, dtype="<f4").astype(np.float64)
    if params.use_activation:
        if values.size == 1 or multi_label:
            values = 1.0 / (1.0 + np.exp(-values))
        else:
            values = np.exp(values - values.max())
            values = values / values.sum()
    return values.astype("<f4").tobytes()
