"""The pooling runner's step output: one vector per request whose prompt
has run, from the model's final-normed hidden states (vLLM's pooling runner
for decoder models, ``runner="pooling"``).

A pooling runner never computes logits and never samples. In each step,
the rows whose chunk reaches the end of their prompt are pooled
(``Pooler``): "LAST" takes the prompt's last token's hidden state, "MEAN"
the mean over every prompt token, "CLS" the first token's. LAST reads one
token of the last chunk, so the prompt may be chunked and take prefix-cache
hits; MEAN and CLS read tokens of the first chunk, so the engine schedules
their prompts whole and without prefix hits (vLLM's rule for causal pooling
models), and a row that arrives otherwise is a broken plan. The pooled
rows are float32 (vLLM pools in float32 too). Truncation (``dimensions``)
and L2 normalization are the engine's, per request, on the host: the
runner holds no per-request pooling state. A classifier's pooler (the
"classify" task) projects the pooled rows through the model's score head
on the device, so a request's reply is its ``num_labels`` float32 logits;
the activation (softmax or sigmoid) is the engine's too.

``PooledOutput`` is the pooling runner's ``AsyncOutput``: the copy of the
pooled rows to the host starts at once; ``get_output()`` waits for it and
answers rows of no tokens, with the vectors by request id
(``ModelRunnerOutput.pooled``).
"""

from __future__ import annotations

import numpy as np
import torch

from ipc.config import POOLING_TYPES
from ipc.messages import ModelRunnerOutput
from runner.input_batch import InputBatch
from runner.layers.score_head import ScoreHead
from runner.transfer import HostTransfer


class Pooler:
    """Pools one step's rows by ``pooling_type`` (one of ``POOLING_TYPES``).

    Every batch row is pooled on the device from ``query_start_loc`` (a
    device buffer the step has), so pooling adds no upload to the step;
    the host picks the rows whose prompt ended once they are copied.
    ``head``: a classifier's score head, applied to the pooled rows (None:
    the rows are the output)."""

    def __init__(self, pooling_type: str, head: ScoreHead | None = None) -> None:
        if pooling_type not in POOLING_TYPES:
            raise ValueError(f"pooling_type must be one of {POOLING_TYPES}, got {pooling_type!r}")
        self.pooling_type = pooling_type
        self.head = head

    def __call__(self, hidden: torch.Tensor, batch: InputBatch, prefill_len_np: np.ndarray,
                 query_start_loc: torch.Tensor) -> tuple[list[str], np.ndarray, torch.Tensor]:
        """(the request ids whose prompt ends in this step, their batch rows,
        float32 [num_reqs, hidden] pooled rows of the whole batch, or
        [num_reqs, num_labels] logits with a ``head``). ``prefill_len_np``:
        each slot's prompt length; ``query_start_loc``: the step's device
        offsets, ``batch.query_start_loc_np``'s copy."""
        ids, rows, pooled = self.pool(hidden, batch, prefill_len_np, query_start_loc)
        return ids, rows, pooled if self.head is None else self.head(pooled)

    def pool(self, hidden: torch.Tensor, batch: InputBatch, prefill_len_np: np.ndarray,
             query_start_loc: torch.Tensor) -> tuple[list[str], np.ndarray, torch.Tensor]:
        """(the request ids whose prompt ends in this step, their batch rows,
        float32 [num_reqs, hidden] pooled rows of the whole batch).
        ``prefill_len_np``: each slot's prompt length; ``query_start_loc``:
        the step's device offsets, ``batch.query_start_loc_np``'s copy."""
        n = batch.num_reqs
        slots = batch.idx_mapping_np[:n]
        rows = np.flatnonzero(batch.seq_lens_np[:n] >= prefill_len_np[slots])
        ids = [batch.req_ids[i] for i in rows.tolist()]
        qsl = query_start_loc[: n + 1].to(torch.int64)
        if self.pooling_type == "LAST":
            return ids, rows, hidden.index_select(0, qsl[1:] - 1).float()
        if np.any(batch.seq_lens_np[:n] != batch.num_scheduled_np[:n]):
            raise RuntimeError(f"{self.pooling_type} pooling needs each prompt whole in one "
                               "step, without prefix-cache hits; the plan chunked one")
        if self.pooling_type == "CLS":
            return ids, rows, hidden.index_select(0, qsl[:-1]).float()
        # MEAN: differences of a float64 running sum, one per row.
        sums = torch.cat([hidden.new_zeros((1, hidden.shape[1]), dtype=torch.float64),
                          hidden[: batch.num_tokens].double().cumsum(dim=0)])
        counts = (qsl[1:] - qsl[:-1]).clamp(min=1).unsqueeze(1)
        return ids, rows, ((sums[qsl[1:]] - sums[qsl[:-1]]) / counts).float()


class PooledOutput:
    """A pooling step's output on its way to the host (see the module)."""

    def __init__(self, step_id: int, num_rows: int, req_ids: list[str], rows: np.ndarray,
                 pooled: torch.Tensor, transfer: HostTransfer) -> None:
        """``pooled``: every batch row's vector; ``rows``: the batch rows
        of ``req_ids``, the ones answered."""
        self.step_id = step_id
        self.num_rows = num_rows
        self.req_ids = req_ids
        self.rows = rows
        (self.host,), self.copy_done = transfer.to_host((pooled,))

    def get_output(self) -> ModelRunnerOutput:
        """Wait for the copy; every row samples nothing."""
        self.copy_done.synchronize()
        vectors = self.host.numpy()[self.rows].astype("<f4", copy=False)
        return ModelRunnerOutput(
            step_id=self.step_id, sampled_token_ids=[], num_sampled=[0] * self.num_rows,
            pooled={r: vectors[i].tobytes() for i, r in enumerate(self.req_ids)})
