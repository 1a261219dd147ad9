"""AsyncOutput: a step's sampled tokens (and logprobs), on their way to the host.

On CUDA the copies run on a side stream that first waits for the main
stream, copy into pinned memory and record an event. ``get_output()`` waits
on that event: the only wait on the device in the whole step.

The reply lists rows in the plan's order (``plan_order`` maps batch rows
back to it), flat (see ``ModelRunnerOutput``). Its ``logprobs`` is None when
no request of the batch asked for logprobs. Otherwise it has one row per
sampled token, in the same order (rows of requests that sampled nothing are
skipped, as their token is); a request that asked for N top logprobs gets N
top entries, one that asked for none gets empty top lists (the engine
ignores its row).
"""

from __future__ import annotations

import numpy as np
import torch

from ipc.messages import Logprobs, ModelRunnerOutput
from runner.sampler import SamplerOutput


def _to_host(tensors: tuple[torch.Tensor, ...], copy_stream: torch.cuda.Stream | None):
    """Start copying ``tensors`` to the host; returns (host tensors, event or None)."""
    if copy_stream is None:
        return tuple(t.clone() for t in tensors), None
    main_stream = torch.cuda.current_stream()
    host = tuple(torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors)
    with torch.cuda.stream(copy_stream):
        copy_stream.wait_stream(main_stream)
        for src, dst in zip(tensors, host):
            dst.copy_(src, non_blocking=True)
            src.record_stream(copy_stream)
        event = torch.cuda.Event(blocking=True)
        event.record(copy_stream)
    return host, event


class AsyncOutput:
    def __init__(
        self,
        step_id: int,
        plan_order: np.ndarray,
        sample_mask: np.ndarray,
        sampler_output: SamplerOutput,
        copy_stream: torch.cuda.Stream | None,
    ):
        """``plan_order[i]``: the plan index of batch row i; ``sample_mask[i]``:
        batch row i keeps its token."""
        self.step_id = step_id
        self.plan_order = plan_order
        self.sample_mask = sample_mask
        self.num_logprobs = sampler_output.num_logprobs
        tensors = (sampler_output.sampled_token_ids,)
        if sampler_output.logprobs is not None:
            tensors += sampler_output.logprobs.tensors()
        self.host_tensors, self.copy_event = _to_host(tensors, copy_stream)

    def get_output(self) -> ModelRunnerOutput:
        """Wait for the copy, then build the reply in plan order."""
        if self.copy_event is not None:
            self.copy_event.synchronize()
        tokens = np.empty(len(self.plan_order), dtype=np.int64)
        tokens[self.plan_order] = self.host_tensors[0].numpy()
        keep = np.empty(len(self.plan_order), dtype=bool)
        keep[self.plan_order] = self.sample_mask
        all_kept = bool(keep.all())
        return ModelRunnerOutput(
            step_id=self.step_id,
            sampled_token_ids=(tokens if all_kept else tokens[keep]).tolist(),
            num_sampled=None if all_kept else keep.astype(np.int64).tolist(),
            logprobs=self._logprobs(keep),
        )

    def _logprobs(self, keep_in_plan_order: np.ndarray) -> Logprobs | None:
        if len(self.host_tensors) == 1:
            return None
        top_ids, top_lps, sampled_lps, ranks = (t.tolist() for t in self.host_tensors[1:])
        batch_row = np.empty(len(self.plan_order), dtype=np.int64)
        batch_row[self.plan_order] = np.arange(len(self.plan_order))
        rows = batch_row[keep_in_plan_order].tolist()
        counts = [max(int(self.num_logprobs[i]), 0) for i in rows]
        return Logprobs(
            top_token_ids=[top_ids[i][:n] for i, n in zip(rows, counts)],
            top_logprobs=[top_lps[i][:n] for i, n in zip(rows, counts)],
            sampled_logprobs=[sampled_lps[i] for i in rows],
            sampled_ranks=[ranks[i] for i in rows],
        )
