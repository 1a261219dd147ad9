"""vLLM's ``profiler_config`` read into the workers' ``ProfilerConfig``.

The value is vLLM's: a dict (``LLM(profiler_config=...)``) or its JSON text
(``--profiler-config '{"profiler": "torch", "torch_profiler_dir": "DIR"}'``).
``profiler`` None (or left out) is profiling off; "torch" is the torch
profiler, whose traces every worker writes under ``torch_profiler_dir``
(made absolute here, as vLLM does; required with "torch", refused without
it; ``EngineConfig.check_machine`` refuses one that is a file). The ``torch_profiler_*`` switches keep vLLM's defaults. vLLM's other
keys (its iteration schedule, the front end's own trace, CUDA graph capture
traces) are taken at their defaults only: any other value asks for what
tprun does not do and is refused by name, as is vLLM's "cuda" profiler and
any key vLLM does not have. Every refusal is a ``ValueError`` of one line.
"""

from __future__ import annotations

import os

from engine.json_option import json_object
from ipc.config import ProfilerConfig

# vLLM's switches of the torch profiler, with vLLM's defaults.
_SWITCHES = {
    "torch_profiler_record_shapes": False,
    "torch_profiler_with_memory": False,
    "torch_profiler_with_stack": True,
    "torch_profiler_with_flops": False,
    "torch_profiler_use_gzip": True,
    "torch_profiler_dump_cuda_time_total": True,
}
# vLLM's keys for what tprun does not do, each taken only at vLLM's default.
_DEFAULTS_ONLY = {
    "delay_iterations": 0,
    "max_iterations": 0,
    "warmup_iterations": 0,
    "active_iterations": 5,
    "wait_iterations": 0,
    "ignore_frontend": False,
    "capture_torch_profiler": False,
    "detailed_trace_annotation": False,
}
_KEYS = ("profiler", "torch_profiler_dir", *_SWITCHES, *_DEFAULTS_ONLY)
# What start_profile / stop_profile raise without a profiler (vLLM's first
# sentence; the example in the spelling tprun takes).
PROFILING_OFF = ("Profiling is not enabled. Please set --profiler-config to enable profiling. "
                 "Example: --profiler-config '{\"profiler\": \"torch\", "
                 "\"torch_profiler_dir\": \"YOUR_DIR_PATH_TO_DUMP_TRACE\"}' "
                 "(LLM(profiler_config={...}) in Python)")


def parse_profiler_config(value: dict | str | None) -> ProfilerConfig | None:
    """The workers' profiler settings, None when profiling is off;
    ``ValueError`` (one line, naming the key) for anything tprun does not take."""
    if value is None:
        return None
    value = json_object(value, "profiler_config")
    if unknown := sorted(set(value) - set(_KEYS)):
        raise ValueError(f"profiler_config: unknown key(s) {unknown} (supported: "
                         f"{', '.join(_KEYS)})")
    for key, default in _DEFAULTS_ONLY.items():
        got = value.get(key, default)
        if type(got) is not type(default) or got != default:
            raise ValueError(f"profiler_config: {key} {got!r} is not supported (only "
                             f"{default!r}, vLLM's default: tprun profiles from start_profile "
                             "to stop_profile, in the workers only)")
    for key in _SWITCHES:
        if key in value and not isinstance(value[key], bool):
            raise ValueError(f"profiler_config: {key} must be true or false, got "
                             f"{value[key]!r}")
    profiler, directory = value.get("profiler"), value.get("torch_profiler_dir") or ""
    if profiler not in (None, "torch"):
        raise ValueError(f"profiler_config: profiler {profiler!r} is not supported (tprun has "
                         "'torch', the torch profiler; null: off)")
    if not isinstance(directory, str):
        raise ValueError(f"profiler_config: torch_profiler_dir must be a path, got "
                         f"{directory!r}")
    if directory and profiler != "torch":
        raise ValueError("profiler_config: torch_profiler_dir is only applicable when "
                         "profiler is set to 'torch'")
    if profiler is None:
        return None
    if not directory:
        raise ValueError("profiler_config: torch_profiler_dir must be set when profiler is "
                         "'torch'")
    if "://" in directory:
        raise ValueError(f"profiler_config: torch_profiler_dir {directory!r} is a URI; tprun "
                         "writes traces to a local directory")
    directory = os.path.abspath(os.path.expanduser(directory))
    return ProfilerConfig(torch_profiler_dir=directory,
                          **{key: value.get(key, default) for key, default in _SWITCHES.items()})
