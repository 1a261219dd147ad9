"""AsyncOutput: a step's sampled tokens (and logprobs), on their way to the host.

The copies start at once (``HostTransfer.to_host``: on CUDA a side stream
into pinned memory, with an event). ``get_output()`` waits on that copy:
the only wait on the device in the whole step.

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

from ipc.messages import Logprobs, ModelRunnerOutput
from runner.sampler import SamplerOutput
from runner.sampling.prompt_logprobs import PromptLogprobsOutput
from runner.transfer import HostTransfer


class AsyncOutput:
    def __init__(
        self,
        step_id: int,
        plan_order: np.ndarray,
        sample_mask: np.ndarray,
        sampler_output: SamplerOutput,
        transfer: HostTransfer,
        prompt_logprobs: PromptLogprobsOutput | None = None,
    ):
        """``plan_order[i]``: the plan index of batch row i; ``sample_mask[i]``:
        batch row i keeps its token; ``prompt_logprobs``: the step's scored
        prompt tokens, copied with the rest."""
        self.step_id = step_id
        self.plan_order = plan_order
        self.sample_mask = sample_mask
        self.num_logprobs = sampler_output.num_logprobs
        self.prompt_logprobs = prompt_logprobs
        tensors = (sampler_output.sampled_token_ids,)
        if sampler_output.logprobs is not None:
            tensors += sampler_output.logprobs.tensors()
        num_prompt = 0
        if prompt_logprobs is not None:
            prompt_tensors = prompt_logprobs.tensors.tensors()
            tensors += prompt_tensors
            num_prompt = len(prompt_tensors)
        host, self.copy_done = transfer.to_host(tensors)
        split = len(host) - num_prompt
        self.host_tensors, self.prompt_host = host[:split], host[split:]

    def get_output(self) -> ModelRunnerOutput:
        """Wait for the copy, then build the reply in plan order."""
        self.copy_done.synchronize()
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
            prompt_logprobs=(None if self.prompt_logprobs is None
                             else self.prompt_logprobs.to_message(self.prompt_host)),
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
