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

With speculative decoding a row emits ``num_accepted + 1`` tokens, the head
of its row of ``tokens`` [N, 1 + k]; logprobs are then per logits row, and
row i's j-th token has logits row ``cu_num_logits[i] + j``. The drafts
proposed for the next step of the requests with a grammar (``NextDrafts``)
travel with the tokens, so the engine can fill that step's bitmask over
them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ipc.messages import Logprobs, ModelRunnerOutput
from runner.sampler import SamplerOutput
from runner.sampling.prompt_logprobs import PromptLogprobsOutput
from runner.transfer import HostTransfer


@dataclass(frozen=True)
class NextDrafts:
    """The drafts of ``req_ids`` for their next step: ``tokens`` [N, k] on
    the device, one row per batch row, request i's at batch row
    ``batch_rows[i]``."""

    req_ids: list[str]
    batch_rows: np.ndarray
    tokens: torch.Tensor


class AsyncOutput:
    def __init__(
        self,
        step_id: int,
        plan_order: np.ndarray,
        sample_mask: np.ndarray,
        sampler_output: SamplerOutput,
        transfer: HostTransfer,
        tokens: torch.Tensor | None = None,
        num_accepted: torch.Tensor | None = None,
        cu_num_logits: np.ndarray | None = None,
        prompt_logprobs: PromptLogprobsOutput | None = None,
        next_drafts: NextDrafts | None = None,
    ):
        """``plan_order[i]``: the plan index of batch row i; ``sample_mask[i]``:
        batch row i keeps its token(s). ``tokens``, ``num_accepted`` (device)
        and ``cu_num_logits`` (host) only with drafts; ``prompt_logprobs``:
        the step's scored prompt tokens, and ``next_drafts``, copied with
        the rest."""
        self.step_id = step_id
        self.plan_order = plan_order
        self.sample_mask = sample_mask
        self.num_logprobs = sampler_output.num_logprobs
        self.cu_num_logits = cu_num_logits
        self.prompt_logprobs = prompt_logprobs
        self.spec = tokens is not None
        self.next_drafts = next_drafts
        if self.spec:
            head = (tokens, num_accepted)
            if next_drafts is not None:
                head += (next_drafts.tokens,)
        else:
            head = (sampler_output.sampled_token_ids,)
        self.num_head = len(head)
        tensors = head
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
        if self.spec:
            return self._spec_output()
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
            prompt_logprobs=self._prompt_message(),
        )

    def _prompt_message(self):
        if self.prompt_logprobs is None:
            return None
        return self.prompt_logprobs.to_message(self.prompt_host)

    def _spec_output(self) -> ModelRunnerOutput:
        """Rows of several tokens: each kept row's accepted drafts and the
        bonus or recovered token."""
        tokens, accepted = (t.numpy() for t in self.host_tensors[:2])
        n = len(self.plan_order)
        counts = np.where(self.sample_mask, accepted + 1, 0)
        batch_row = np.empty(n, dtype=np.int64)
        batch_row[self.plan_order] = np.arange(n)
        flat, num_sampled, logit_rows = [], [], []
        for i in batch_row.tolist():
            c = int(counts[i])
            flat.extend(tokens[i, :c].tolist())
            num_sampled.append(c)
            logit_rows.extend(range(int(self.cu_num_logits[i]), int(self.cu_num_logits[i]) + c))
        next_drafts = {}
        if self.next_drafts is not None:
            drafts = self.host_tensors[2].numpy()
            next_drafts = {r: drafts[i].tolist() for r, i in
                           zip(self.next_drafts.req_ids, self.next_drafts.batch_rows.tolist())}
        return ModelRunnerOutput(step_id=self.step_id, sampled_token_ids=flat,
                                 num_sampled=num_sampled,
                                 logprobs=self._logprob_rows(logit_rows, batch_row, counts),
                                 prompt_logprobs=self._prompt_message(),
                                 next_draft_token_ids=next_drafts)

    def _logprob_rows(self, logit_rows: list[int], batch_row: np.ndarray,
                      counts: np.ndarray) -> Logprobs | None:
        if len(self.host_tensors) == self.num_head:
            return None
        top_ids, top_lps, sampled_lps, ranks = (t.tolist() for t in
                                                self.host_tensors[self.num_head:])
        asked = [max(int(self.num_logprobs[i]), 0) for i in batch_row.tolist()
                 for _ in range(int(counts[i]))]
        return Logprobs(
            top_token_ids=[top_ids[r][:k] for r, k in zip(logit_rows, asked)],
            top_logprobs=[top_lps[r][:k] for r, k in zip(logit_rows, asked)],
            sampled_logprobs=[sampled_lps[r] for r in logit_rows],
            sampled_ranks=[ranks[r] for r in logit_rows],
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
