"""``logprob_token_ids`` (vLLM's): the tokens whose logprobs a request's
sampled tokens report, in place of the top ones.

State per slot, on the device: an int64 [max_num_reqs,
MAX_LOGPROB_TOKEN_IDS] table holding each id + 1, 0 past the request's
list (so the zero-filled table starts as "no ids", and a row read back
minus 1 is -1 where nothing is asked), written by staged writes with the
other per-slot parameters. On the host: each slot's count (``counts_np``),
so a batch whose slots ask for none costs nothing. A slot taken by a
request without ids after one with them has its row cleared then: a
batch's rows without ids always meet a zero row.

Reading the ids costs no host sync: ``rows`` gathers the batch's rows by
slot on the device, and the logprobs kernels take them (``token_ids`` of
``compute_logprobs_ref`` / ``compute_logprobs_triton``): each id's logprob
is its raw logit minus the row's log-sum-exp, the same log-softmax the top
logprobs come from, written over the first top columns. The slot's
``num_logprobs`` is the list's length (``SamplingStates``), so the batch's
top width covers it and the host keeps exactly those columns.
"""

from __future__ import annotations

import numpy as np
import torch

from ipc.messages import MAX_LOGPROB_TOKEN_IDS
from runner.staged_write import StagedWriteTensor


class LogprobTokenIdsState:
    def __init__(self, max_num_reqs: int, device: torch.device):
        self.table = StagedWriteTensor((max_num_reqs, MAX_LOGPROB_TOKEN_IDS), torch.int64,
                                       device)
        self.counts_np = np.zeros(max_num_reqs, dtype=np.int32)

    def add_request(self, slot: int, token_ids: list[int] | None) -> None:
        """Stage the slot's row (ids + 1, zeros after), or clear it where
        the slot's last request had ids and this one has none."""
        ids = token_ids or []
        if ids or self.counts_np[slot]:
            row = np.zeros(MAX_LOGPROB_TOKEN_IDS, dtype=np.int64)
            row[: len(ids)] = np.asarray(ids, dtype=np.int64) + 1
            self.table.stage_write(slot, 0, row)
        self.counts_np[slot] = len(ids)

    @property
    def staged_tensors(self) -> tuple[StagedWriteTensor, ...]:
        return (self.table,)

    def any_active(self, idx_mapping_np: np.ndarray) -> bool:
        return bool(len(idx_mapping_np)) and bool(self.counts_np[idx_mapping_np].any())

    def rows(self, idx: torch.Tensor, width: int) -> torch.Tensor:
        """[N, min(width, MAX_LOGPROB_TOKEN_IDS)] int64: the ids of each
        batch row's slot (``idx``, int64), -1 past its list."""
        return self.table.gpu[idx, : min(width, MAX_LOGPROB_TOKEN_IDS)] - 1
