"""The device seam: every operation whose implementation depends on the device.

``device_ops(device)`` picks, once per device, a frozen ``DeviceOps``: the
Triton kernels and the pinned, asynchronous transfers on CUDA
(``triton_ops``), the torch references and plain copies elsewhere
(``torch_ops``). The runner, its layers and its buffers look their
operations up here when they are built and never ask again which device
they run on; this module is the only place that does.

Each kernel exists twice, a torch reference beside the data it writes and a
Triton launch in the ``triton_*`` module next to it, with one signature.
Where a kernel's inputs can be wrong, one ``check_<name>`` function beside
the reference validates them, and both versions run behind it (``_checked``).
Triton modules are imported only when ``triton_ops`` is built, so the CPU
path never imports Triton; tests build ``triton_ops`` for a CPU device to
run the kernels under the interpreter.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from runner.transfer import HostTransfer, PinnedTransfer

# Streaming multiprocessors assumed where there are none to ask (Triton's
# interpreter on CPU): an H100/H200's count.
DEFAULT_NUM_SMS = 132


@dataclass(frozen=True)
class DeviceOps:
    """The operations of one device. Kernel signatures are those of the torch
    references named in each comment (``_KERNELS`` lists both versions)."""

    # runner/input_batch.py and runner/block_table.py: the step's inputs.
    prepare_prefill_inputs: Callable[..., None]  # prepare_prefill_inputs_ref
    prepare_pos_seq_lens: Callable[..., None]  # prepare_pos_seq_lens_ref
    combine_sampled_tokens: Callable[..., torch.Tensor]  # combine_sampled_tokens_ref
    combine_draft_tokens: Callable[..., None]  # combine_draft_tokens_ref
    gather_block_tables: Callable[..., torch.Tensor]  # gather_block_tables_ref
    compute_slot_mappings: Callable[..., torch.Tensor]  # compute_slot_mappings_ref
    finish_step_rows: Callable[..., tuple]  # finish_step_rows_ref
    # runner/staged_write_group.py
    apply_grouped_writes: Callable[..., None]  # apply_grouped_writes_ref
    # runner/layers/
    rms_norm: Callable[..., torch.Tensor]  # rms_norm_ref
    fused_add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    rotary: Callable[..., tuple[torch.Tensor, torch.Tensor]]  # rotary_ref
    qkv_rotary_write_kv: Callable[..., torch.Tensor]  # qkv_rotary_write_kv_ref
    silu_and_mul: Callable[[torch.Tensor], torch.Tensor]  # silu_and_mul_ref
    row_parallel_matmul: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # F.linear
    row_parallel_matmul_add: Callable[..., torch.Tensor]  # row_parallel_matmul_add_ref
    gate_up_silu: Callable[..., torch.Tensor]  # gate_up_silu_ref
    lm_head_matmul: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # F.linear
    norms_in_matmuls: Callable[..., bool]  # norms_in_matmuls_ref
    embedding_with_parts: Callable[..., tuple[torch.Tensor, torch.Tensor]]  # embedding_with_parts_ref
    # runner/lora/stack.py
    lora_add_delta: Callable[..., torch.Tensor]  # lora_add_delta_ref
    # runner/spec_decode/ngram.py
    ngram_propose: Callable[..., None]  # ngram_propose_ref
    # runner/sampling/noise.py
    greedy_argmax: Callable[..., torch.Tensor]  # greedy_argmax_ref
    gumbel_argmax: Callable[..., torch.Tensor]  # gumbel_argmax_ref
    # runner/sampling/filters.py
    filter_thresholds: Callable[..., torch.Tensor]  # filter_thresholds_ref
    # runner/sampling/logprobs.py
    compute_logprobs: Callable[..., object]  # compute_logprobs_ref
    # runner/sampling/penalties.py
    apply_penalties: Callable[..., torch.Tensor]  # apply_penalties_ref
    record_sampled: Callable[..., None]  # record_sampled_ref
    # runner/structured_outputs.py
    apply_grammar_bitmask: Callable[..., None]  # apply_grammar_bitmask_ref
    # Host/device transfer (runner/transfer.py): a new, independent one per call.
    new_transfer: Callable[[], HostTransfer]
    # What the device offers.
    attention_backend: str  # the default attention backend's name
    dist_backend: str  # torch.distributed backend of the tensor-parallel group
    cuda_graphs: bool  # decode steps can be captured and replayed
    flash_kernels: bool  # torch's fused attention kernels (varlen_attn, flash SDPA) run here
    kv_budget_from_free_memory: bool  # else kv_cache_memory_bytes sizes the cache
    shares_host_memory: bool  # device tensors are host memory (their own host copy)
    # torch.profiler activities that record this device's work (worker/torch_profiler.py).
    profiler_activities: tuple[str, ...] = ("CPU",)


def _checked(check: Callable[..., None], impl: Callable):
    """``impl`` behind ``check``, which takes a subset of ``impl``'s
    parameters by name. The kernels are called with positional arguments."""
    names = list(inspect.signature(impl).parameters)
    picks = [names.index(name) for name in inspect.signature(check).parameters]

    @functools.wraps(impl)
    def run(*args):
        check(*[args[i] for i in picks])
        return impl(*args)

    return run


def unchecked(kernel: Callable) -> Callable:
    """``kernel`` (a ``DeviceOps`` field) without its check, for a caller
    that checked once what the check would check at every call."""
    return getattr(kernel, "__wrapped__", kernel)


# DeviceOps field -> (torch reference, Triton version), as "module:function".
_KERNELS = {
    "prepare_prefill_inputs": ("runner.input_batch:prepare_prefill_inputs_ref",
                               "runner.triton_input_batch:prepare_prefill_inputs_triton"),
    "prepare_pos_seq_lens": ("runner.input_batch:prepare_pos_seq_lens_ref",
                             "runner.triton_input_batch:prepare_pos_seq_lens_triton"),
    "combine_sampled_tokens": ("runner.input_batch:combine_sampled_tokens_ref",
                               "runner.triton_input_batch:combine_sampled_tokens_triton"),
    "combine_draft_tokens": ("runner.input_batch:combine_draft_tokens_ref",
                             "runner.triton_input_batch:combine_draft_tokens_triton"),
    "finish_step_rows": ("runner.input_batch:finish_step_rows_ref",
                         "runner.triton_input_batch:finish_step_rows_triton"),
    "gather_block_tables": ("runner.block_table:gather_block_tables_ref",
                            "runner.triton_block_table:gather_block_tables_triton"),
    "compute_slot_mappings": ("runner.block_table:compute_slot_mappings_ref",
                              "runner.triton_block_table:compute_slot_mappings_triton"),
    "apply_grouped_writes": ("runner.staged_write_group:apply_grouped_writes_ref",
                             "runner.triton_staged_write:apply_grouped_writes_triton"),
    "rms_norm": ("runner.layers.rms_norm:rms_norm_ref",
                 "runner.layers.triton_rms_norm:rms_norm_triton"),
    "fused_add_rms_norm": ("runner.layers.rms_norm:fused_add_rms_norm_ref",
                           "runner.layers.triton_rms_norm:fused_add_rms_norm_triton"),
    "rotary": ("runner.layers.rotary:rotary_ref", "runner.layers.triton_rotary:rotary_triton"),
    "qkv_rotary_write_kv": ("runner.layers.rotary:qkv_rotary_write_kv_ref",
                            "runner.layers.triton_qkv_rotary:qkv_rotary_write_kv"),
    "silu_and_mul": ("runner.layers.activation:silu_and_mul_ref",
                     "runner.layers.triton_silu_mul:silu_mul_triton"),
    "row_parallel_matmul": ("torch.nn.functional:linear",
                            "runner.layers.triton_skinny_matmul:row_parallel_matmul"),
    "row_parallel_matmul_add": ("runner.layers.norm_in_matmul:row_parallel_matmul_add_ref",
                                "runner.layers.triton_skinny_matmul:row_parallel_matmul_add"),
    "gate_up_silu": ("runner.layers.activation:gate_up_silu_ref",
                     "runner.layers.triton_skinny_matmul:gate_up_silu"),
    "lm_head_matmul": ("torch.nn.functional:linear",
                       "runner.layers.triton_skinny_matmul:lm_head_matmul"),
    "norms_in_matmuls": ("runner.layers.norm_in_matmul:norms_in_matmuls_ref",
                         "runner.layers.triton_norm_in_matmul:norms_in_matmuls"),
    "embedding_with_parts": ("runner.layers.norm_in_matmul:embedding_with_parts_ref",
                             "runner.layers.triton_embedding:embedding_with_parts_triton"),
    "lora_add_delta": ("runner.lora.stack:lora_add_delta_ref",
                       "runner.lora.triton_lora:lora_add_delta_triton"),
    "ngram_propose": ("runner.spec_decode.ngram:ngram_propose_ref",
                      "runner.spec_decode.triton_ngram:ngram_propose_triton"),
    "greedy_argmax": ("runner.sampling.noise:greedy_argmax_ref",
                      "runner.sampling.triton_noise:greedy_argmax_triton"),
    "gumbel_argmax": ("runner.sampling.noise:gumbel_argmax_ref",
                      "runner.sampling.triton_noise:gumbel_argmax_triton"),
    "filter_thresholds": ("runner.sampling.filters:filter_thresholds_ref",
                          "runner.sampling.triton_filters:filter_thresholds_triton"),
    "compute_logprobs": ("runner.sampling.logprobs:compute_logprobs_ref",
                         "runner.sampling.triton_logprobs:compute_logprobs_triton"),
    "apply_penalties": ("runner.sampling.penalties:apply_penalties_ref",
                        "runner.sampling.triton_penalties:apply_penalties_triton"),
    "record_sampled": ("runner.sampling.penalties:record_sampled_ref",
                       "runner.sampling.triton_penalties:record_sampled_triton"),
    "apply_grammar_bitmask": ("runner.structured_outputs:apply_grammar_bitmask_ref",
                              "runner.triton_grammar_mask:apply_grammar_bitmask_triton"),
}
# Kernels whose inputs can be wrong: field -> their check, beside the reference.
_CHECKS = {
    name: f"{_KERNELS[name][0].split(':')[0]}:check_{name}"
    for name in ("prepare_prefill_inputs", "prepare_pos_seq_lens", "combine_sampled_tokens",
                 "combine_draft_tokens", "ngram_propose", "gather_block_tables",
                 "compute_slot_mappings", "apply_grouped_writes",
                 "apply_grammar_bitmask")
}


def _load(path: str) -> Callable:
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def _kernels(version: int) -> dict[str, Callable]:
    """Every kernel field: version 0 the torch references, 1 the Triton
    versions; each checked kernel behind its check."""
    kernels = {name: _load(paths[version]) for name, paths in _KERNELS.items()}
    for name, check in _CHECKS.items():
        kernels[name] = _checked(_load(check), kernels[name])
    return kernels


def torch_ops(device: torch.device) -> DeviceOps:
    """Torch references and synchronous copies (a CPU device)."""
    return DeviceOps(**_kernels(0), new_transfer=functools.partial(HostTransfer, device),
                     attention_backend="sdpa", dist_backend="gloo", cuda_graphs=False,
                     flash_kernels=False,
                     kv_budget_from_free_memory=False, shares_host_memory=True)


def triton_ops(device: torch.device) -> DeviceOps:
    """Triton kernels and pinned, asynchronous transfers (a CUDA device).

    Built for a CPU device (tests), the kernels run under Triton's
    interpreter; transfers and device facts are then still CUDA's.
    """
    return DeviceOps(**_kernels(1), new_transfer=functools.partial(PinnedTransfer, device),
                     attention_backend="triton", dist_backend="nccl", cuda_graphs=True,
                     flash_kernels=True,
                     kv_budget_from_free_memory=True, shares_host_memory=False,
                     profiler_activities=("CPU", "CUDA"))


@functools.cache
def device_ops(device: torch.device | str) -> DeviceOps:
    """The operations for ``device``: Triton on CUDA, torch references elsewhere."""
    device = torch.device(device)
    return triton_ops(device) if device.type == "cuda" else torch_ops(device)


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; DEFAULT_NUM_SMS elsewhere."""
    if device.type != "cuda":
        return DEFAULT_NUM_SMS
    return _cuda_num_sms(device.index)


@functools.cache
def _cuda_num_sms(index: int | None) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


# Programmatic dependent launch of the Triton kernels (triton_dependent_launch.py)
# where the device has it; False for A/B runs (bench_decode.py --no-pdl), set
# before any graph is captured.
PDL_ENABLED = True


def launch_pdl(device: torch.device) -> bool:
    """Whether Triton kernels on ``device`` launch with programmatic dependent
    launch: CUDA devices of compute capability 9.0 and up, unless disabled."""
    return PDL_ENABLED and device.type == "cuda" and _sm90_or_newer(device.index)


def pdl_launch(device: torch.device) -> dict:
    """A kernel's PDL constexpr and Triton's launch option for ``device``
    (``launch_pdl``), for a kernel that starts with ``wait_for_previous_kernel(PDL)``."""
    pdl = launch_pdl(device)
    return dict(PDL=pdl, launch_pdl=pdl)


@functools.cache
def _sm90_or_newer(index: int | None) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def is_capturing(device: torch.device) -> bool:
    """Whether a CUDA graph capture is running on ``device``'s current stream."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()
