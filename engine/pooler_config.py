"""vLLM's ``runner`` / ``convert`` / ``pooler_config`` options, resolved.

``runner="pooling"`` (or ``convert="embed"``) serves embeddings instead of
generating: the engine takes pooling requests only (``LLM.embed``, HTTP
``/v1/embeddings``). ``pooler_config`` is a JSON object, as vLLM's:
``pooling_type`` "LAST" (the default for decoder models), "MEAN" or "CLS";
``normalize`` and ``dimensions``, the defaults of requests that leave them
unset. As in vLLM, a causal model pooled by MEAN or CLS runs each prompt
whole, in one step and without prefix-cache hits (those pool tokens of the
first chunk); LAST takes both chunked prefill and prefix caching.
"""

from __future__ import annotations

import json

import msgspec

from ipc.config import POOLING_TYPES

RUNNERS = ("auto", "generate", "pooling")
CONVERTS = ("auto", "none", "embed")
DEFAULT_POOLING_TYPE = "LAST"


class PoolerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """A pooling engine's ``pooler_config``, checked."""

    pooling_type: str = DEFAULT_POOLING_TYPE
    normalize: bool | None = None
    dimensions: int | None = None

    @property
    def whole_prompts(self) -> bool:
        """Each prompt runs in one step, without prefix hits (MEAN, CLS)."""
        return self.pooling_type != "LAST"


def resolve_pooler(runner: str, convert: str,
                   pooler_config: dict | str | None) -> PoolerSettings | None:
    """The pooling settings of these options; None for a generating engine.
    A ``ValueError`` names the option that cannot work."""
    if runner not in RUNNERS:
        raise ValueError(f"runner must be one of {RUNNERS}, got {runner!r}")
    if convert not in CONVERTS:
        raise ValueError(f"convert must be one of {CONVERTS}, got {convert!r}")
    pooling = runner == "pooling" or convert == "embed"
    if runner == "generate" and convert == "embed":
        raise ValueError("convert 'embed' makes a pooling model: it needs runner 'pooling' "
                         "(or 'auto'), not 'generate'")
    if not pooling:
        if pooler_config is not None:
            raise ValueError("pooler_config applies to a pooling model: give runner 'pooling'")
        return None
    fields = _json_object(pooler_config)
    unknown = sorted(set(fields) - set(PoolerSettings.__struct_fields__))
    if unknown:
        raise ValueError(f"pooler_config {unknown} not supported: tprun takes "
                         f"{list(PoolerSettings.__struct_fields__)}")
    try:
        settings = msgspec.convert(fields, PoolerSettings)
    except msgspec.ValidationError as e:
        raise ValueError(f"pooler_config: {e}") from None
    if settings.pooling_type not in POOLING_TYPES:
        raise ValueError(f"pooler_config pooling_type must be one of {POOLING_TYPES} (a "
                         f"decoder's sequence pooling), got {settings.pooling_type!r}")
    if settings.dimensions is not None and settings.dimensions < 1:
        raise ValueError(f"pooler_config dimensions must be >= 1, got {settings.dimensions}")
    return settings


def _json_object(value: dict | str | None) -> dict:
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"pooler_config is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"pooler_config must be a JSON object, got {type(value).__name__}")
    return value
