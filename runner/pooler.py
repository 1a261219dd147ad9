"""The pooling runner's step output: one vector per request whose prompt
has run, or one row per prompt token for a token-level request, from the
model's final-normed hidden states (vLLM's pooling runner for decoder
models, ``runner="pooling"``).

A pooling runner never computes logits and never samples. In each step,
the rows whose chunk reaches the end of their prompt are pooled
(``Pooler``): "LAST" takes the prompt's last token's hidden state, "MEAN"
the mean over every prompt token, "CLS" the first token's. LAST reads one
token of the last chunk, so the prompt may be chunked and take prefix-cache
hits; MEAN and CLS read tokens of the first chunk, so the engine schedules
their prompts whole and without prefix hits (vLLM's rule for causal pooling
models), and a row that arrives otherwise is a broken plan. A token-level
request (``NewRequestData.pooling_task`` "token_embed" or
"token_classify", vLLM's token-wise pooling) is pooled by none of these:
every step that runs a chunk of its prompt answers that chunk's hidden
states, one row a token, and the engine joins the chunks (it takes no
prefix-cache hits, whose hidden states nothing computes). The pooled rows
are float32 (vLLM pools in float32 too). Truncation (``dimensions``) and
L2 normalization are the engine's, per request, on the host: the runner's
only per-request pooling state is whether a request pools its tokens
(``RequestState.pools_tokens_np``). A classifier's pooler (the "classify"
and "token_classify" tasks) projects the rows through the model's score
head on the device, so a request's reply is ``num_labels`` float32 logits
a row; the activation (softmax or sigmoid) is the engine's too.

``PooledOutput`` is the pooling runner's ``AsyncOutput``: one copy of the
step's answered rows to the host starts at once; ``get_output()`` waits
for it and answers rows of no tokens, with each request's rows by request
id (``ModelRunnerOutput.pooled``).
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
    a token-level row's tokens are slices of the hidden states at the
    host's offsets (``batch.query_start_loc_np``). ``head``: a classifier's
    score head, applied to the answered rows (None: the rows are the
    output)."""

    def __init__(self, pooling_type: str, head: ScoreHead | None = None) -> None:
        if pooling_type not in POOLING_TYPES:
            raise ValueError(f"pooling_type must be one of {POOLING_TYPES}, got {pooling_type!r}")
        self.pooling_type = pooling_type
        self.head = head

    def __call__(self, hidden: torch.Tensor, batch: InputBatch, prefill_len_np: np.ndarray,
                 pools_tokens_np: np.ndarray, query_start_loc: torch.Tensor
                 ) -> tuple[list[tuple[str, int, int]], torch.Tensor]:
        """(each answered request's ``(req_id, first row, rows)`` in the
        output, the float32 output: [num_reqs] pooled rows of the whole
        batch, then each token-level row's tokens of this step; [.., hidden]
        or, with a ``head``, [.., num_labels] logits). A sequence request is
        answered where its prompt ends in this step (one row), a
        token-level one wherever it runs (a row per token).
        ``prefill_len_np`` and ``pools_tokens_np``: each slot's prompt
        length and whether it pools its tokens; ``query_start_loc``: the
        step's device offsets, ``batch.query_start_loc_np``'s copy."""
        n = batch.num_reqs
        slots = batch.idx_mapping_np[:n]
        tokenwise = pools_tokens_np[slots]
        ended = batch.seq_lens_np[:n] >= prefill_len_np[slots]
        spans = [(batch.req_ids[i], i, 1) for i in np.flatnonzero(ended & ~tokenwise).tolist()]
        parts = [self.pool(hidden, batch, query_start_loc)]
        qsl, first = batch.query_start_loc_np, n
        for i in np.flatnonzero(tokenwise).tolist():
            start, end = int(qsl[i]), int(qsl[i + 1])
            parts.append(hidden[start:end].float())
            spans.append((batch.req_ids[i], first, end - start))
            first += end - start
        rows = parts[0] if len(parts) == 1 else torch.cat(parts)
        return spans, rows if self.head is None else self.head(rows)

    def pool(self, hidden: torch.Tensor, batch: InputBatch,
             query_start_loc: torch.Tensor) -> torch.Tensor:
        """Float32 [num_reqs, hidden] pooled rows of the whole batch
        (``pooling_type``'s). ``query_start_loc``: the step's device offsets,
        ``batch.query_start_loc_np``'s copy."""
        n = batch.num_reqs
        qsl = query_start_loc[: n + 1].to(torch.int64)
        if self.pooling_type == "LAST":
            return hidden.index_select(0, qsl[1:] - 1).float()
        if np.any(batch.seq_lens_np[:n] != batch.num_scheduled_np[:n]):
            raise RuntimeError(f"{self.pooling_type} pooling needs each prompt whole in one "
                               "step, without prefix-cache hits; the plan chunked one")
        if self.pooling_type == "CLS":
            return hidden.index_select(0, qsl[:-1]).float()
        # MEAN: differences of a float64 running sum, one per row.
        sums = torch.cat([hidden.new_zeros((1, hidden.shape[1]), dtype=torch.float64),
                          hidden[: batch.num_tokens].double().cumsum(dim=0)])
        counts = (qsl[1:] - qsl[:-1]).clamp(min=1).unsqueeze(1)
        return ((sums[qsl[1:]] - sums[qsl[:-1]]) / counts).float()


class PooledOutput:
    """A pooling step's output on its way to the host (see the module)."""

    def __init__(self, step_id: int, num_rows: int, spans: list[tuple[str, int, int]],
                 rows: torch.Tensor, transfer: HostTransfer) -> None:
        """``rows``: the step's output rows (``Pooler``); ``spans``: each
        answered request's ``(req_id, first row, rows)`` in them."""
        self.step_id = step_id
        self.num_rows = num_rows
        self.spans = spans
        (self.host,), self.copy_done = transfer.to_host((rows,))

    def get_output(self) -> ModelRunnerOutput:
        """Wait for the copy; every row samples nothing."""
        self.copy_done.synchronize()
        rows = self.host.numpy().astype("<f4", copy=False)
        return ModelRunnerOutput(
            step_id=self.step_id, sampled_token_ids=[], num_sampled=[0] * self.num_rows,
            pooled={r: rows[first:first + n].tobytes() for r, first, n in self.spans})
