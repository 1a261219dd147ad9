"""vLLM's ``runner`` / ``convert`` / ``pooler_config`` options, resolved.

``runner="pooling"`` (or ``convert="embed"``) serves embeddings instead of
generating: the engine takes pooling requests only (``LLM.embed``, HTTP
``/v1/embeddings``). ``pooler_config`` is a JSON object, as vLLM's:
``pooling_type`` "LAST" (the default for decoder models), "MEAN" or "CLS";
``normalize`` and ``dimensions``, the defaults of requests that leave them
unset. As in vLLM, a causal model pooled by MEAN or CLS runs each prompt
whole, in one step and without prefix-cache hits (those pool tokens of the
first chunk); LAST takes both chunked prefill and prefix caching.

The task is vLLM's too: "embed" serves embeddings; "classify"
(``convert="classify"``, or a sequence classifier's checkpoint, e.g.
``LlamaForSequenceClassification``, under runner "auto" or "pooling")
serves class probabilities (``LLM.classify``, HTTP ``/classify``): the
last token's hidden state through the checkpoint's ``score.weight``, then
the classifier's activation (``engine.classify_head``: softmax over the
labels, or the sigmoid for one label, unless config.json names another)
unless ``use_activation`` is off. ``use_activation`` in ``pooler_config``
is the default of requests that leave theirs unset.
"""

from __future__ import annotations

import msgspec

from engine.json_option import json_object
from ipc.config import POOLING_TYPES
from ipc.model_config import SEQUENCE_CLASSIFIERS

RUNNERS = ("auto", "generate", "pooling")
CONVERTS = ("auto", "none", "embed", "classify")
TASKS = ("embed", "classify")
# What each task's requests are called in messages.
TASK_NAMES = {"embed": "embeddings", "classify": "classifications",
              "token_embed": "token embeddings", "token_classify": "token classifications"}
DEFAULT_POOLING_TYPE = "LAST"
# The keys ``pooler_config`` takes (the task comes from convert and the model).
POOLER_CONFIG_KEYS = ("pooling_type", "normalize", "dimensions", "use_activation")


class PoolerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """A pooling engine's ``pooler_config``, checked, and its ``task``
    (one of ``TASKS``)."""

    pooling_type: str = DEFAULT_POOLING_TYPE
    normalize: bool | None = None
    dimensions: int | None = None
    use_activation: bool | None = None
    task: str = "embed"

    @property
    def whole_prompts(self) -> bool:
        """Each prompt runs in one step, without prefix hits (MEAN, CLS)."""
        return self.pooling_type != "LAST"


def resolve_pooler(runner: str, convert: str, pooler_config: dict | str | None,
                   architecture: str | None = None) -> PoolerSettings | None:
    """The pooling settings of these options for a checkpoint of
    ``architecture`` (None: not known yet, the options alone); None for a
    generating engine. A ``ValueError`` names the option that cannot work."""
    if runner not in RUNNERS:
        raise ValueError(f"runner must be one of {RUNNERS}, got {runner!r}")
    if convert not in CONVERTS:
        raise ValueError(f"convert must be one of {CONVERTS}, got {convert!r}")
    classifier = architecture in SEQUENCE_CLASSIFIERS
    converting = convert in TASKS
    if runner == "generate" and converting:
        raise ValueError(f"convert {convert!r} makes a pooling model: it needs runner 'pooling' "
                         "(or 'auto'), not 'generate'")
    if runner == "generate" and classifier:
        raise ValueError(f"{architecture} is a sequence classifier, which does not generate: "
                         "start it with runner 'pooling' (or 'auto')")
    pooling = runner == "pooling" or converting or classifier
    if not pooling:
        # Before the model is known, a classifier's checkpoint may still pool.
        if pooler_config is not None and architecture is not None:
            raise ValueError("pooler_config applies to a pooling model: give runner 'pooling'")
        return None
    fields = _json_object(pooler_config)
    unknown = sorted(set(fields) - set(POOLER_CONFIG_KEYS))
    if unknown:
        raise ValueError(f"pooler_config {unknown} not supported: tprun takes "
                         f"{list(POOLER_CONFIG_KEYS)}")
    task = convert if converting else "classify" if classifier else "embed"
    try:
        settings = msgspec.convert({**fields, "task": task}, PoolerSettings)
    except msgspec.ValidationError as e:
        raise ValueError(f"pooler_config: {e}") from None
    if settings.pooling_type not in POOLING_TYPES:
        raise ValueError(f"pooler_config pooling_type must be one of {POOLING_TYPES} (a "
                         f"decoder's sequence pooling), got {settings.pooling_type!r}")
    if settings.dimensions is not None and settings.dimensions < 1:
        raise ValueError(f"pooler_config dimensions must be >= 1, got {settings.dimensions}")
    return settings


def _json_object(value: dict | str | None) -> dict:
    return {} if value is None else json_object(value, "pooler_config")
