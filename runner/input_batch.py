"""One step's batch: its order, its persistent input buffers, its inputs.

Only ``idx_mapping`` and ``query_start_loc`` go from host to device each
step; every other input is built on the device from slot numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from runner.ops import device_ops


def batch_order(num_tokens: np.ndarray, has_drafts: np.ndarray,
                decode_query_len: int) -> np.ndarray:
    """Row indices in batch order: rows with drafts, then decodes (exactly
    ``decode_query_len`` tokens), then the rest by token count; ties keep
    their order (a stable sort). Attention backends rely on decode-like rows
    leading the batch."""
    return np.lexsort((num_tokens, num_tokens != decode_query_len, ~has_drafts))


def sort_batch_req_ids(
    num_tokens_per_req: dict[str, int],
    draft_tokens: dict[str, list[int]],
    decode_query_len: int,
) -> list[str]:
    """The request ids of ``num_tokens_per_req`` in ``batch_order``."""
    req_ids = list(num_tokens_per_req)
    counts = np.fromiter(num_tokens_per_req.values(), dtype=np.int64, count=len(req_ids))
    drafts = np.array([bool(draft_tokens.get(r)) for r in req_ids], dtype=bool)
    return [req_ids[i] for i in batch_order(counts, drafts, decode_query_len)]


class InputBuffers:
    """Persistent per-step buffers at fixed addresses (CUDA graphs need them).

    ``query_start_loc`` has ``max_num_reqs + 1`` entries; entries past the
    batch repeat the total, so it is non-decreasing.
    """

    def __init__(self, max_num_reqs: int, max_num_batched_tokens: int, device: torch.device):
        self.max_num_reqs = max_num_reqs
        self.max_num_tokens = max_num_batched_tokens
        self.input_ids = torch.zeros(max_num_batched_tokens, dtype=torch.int32, device=device)
        self.positions = torch.zeros(max_num_batched_tokens, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        self.logits_indices = torch.zeros(
            max_num_batched_tokens, dtype=torch.int64, device=device
        )
        # idx_mapping and query_start_loc share one buffer: one copy a step.
        self.step_meta = torch.zeros(2 * max_num_reqs + 1, dtype=torch.int32, device=device)
        self.idx_mapping = self.step_meta[:max_num_reqs]
        self.query_start_loc = self.step_meta[max_num_reqs:]
        self.step_meta_np = np.zeros(2 * max_num_reqs + 1, dtype=np.int32)
        self.transfer = device_ops(device).new_transfer()

    def copy_step_meta(self, idx_mapping_np: np.ndarray, query_start_loc_np: np.ndarray,
                       pad_slot: int) -> None:
        """The step's only host-to-device input copy (non-blocking on CUDA).

        Rows past the batch, up to ``len(query_start_loc_np) - 1`` (the padded
        count), map to ``pad_slot``.
        """
        n, m = len(idx_mapping_np), len(query_start_loc_np)
        meta = self.step_meta_np
        meta[:n] = idx_mapping_np
        meta[n : m - 1] = pad_slot
        meta[self.max_num_reqs : self.max_num_reqs + m] = query_start_loc_np
        self.transfer.copy_into(meta[: self.max_num_reqs + m], self.step_meta)


@dataclass(frozen=True)
class BatchPlan:
    """The host's view of one step's batch, computed without the device.

    ``idx_mapping_np[i]`` is the slot of batch row ``i``;
    ``query_start_loc_np`` has ``num_reqs_padded + 1`` entries;
    ``sample_mask_np[i]`` is False for a prefill chunk that stops short of
    the end of its prefill tokens (its sampled token is discarded).
    """

    req_ids: list[str]
    plan_order: np.ndarray  # batch row i is the plan_order[i]-th request of the plan
    idx_mapping_np: np.ndarray
    num_scheduled_np: np.ndarray
    query_start_loc_np: np.ndarray
    seq_lens_np: np.ndarray
    sample_mask_np: np.ndarray
    num_reqs: int
    num_reqs_padded: int
    num_tokens: int
    num_tokens_padded: int
    num_decodes: int
    has_prefill: bool


def plan_batch(
    num_scheduled_tokens: dict[str, int],
    req_id_to_index: dict[str, int],
    num_computed_np: np.ndarray,
    prefill_len_np: np.ndarray,
    num_reqs_padded: int | None = None,
    num_tokens_padded: int | None = None,
) -> BatchPlan:
    """Sort the scheduled requests (``batch_order``; no drafts here) and
    compute every host-side count."""
    plan_req_ids = list(num_scheduled_tokens)
    num_reqs = len(plan_req_ids)
    counts = np.fromiter(num_scheduled_tokens.values(), dtype=np.int32, count=num_reqs)
    plan_order = batch_order(counts, np.zeros(num_reqs, dtype=bool), decode_query_len=1)
    req_ids = [plan_req_ids[i] for i in plan_order]
    idx_mapping_np = np.array([req_id_to_index[r] for r in req_ids], dtype=np.int32)
    num_scheduled_np = counts[plan_order]
    num_tokens = int(num_scheduled_np.sum())
    num_reqs_padded = num_reqs if num_reqs_padded is None else num_reqs_padded
    num_tokens_padded = num_tokens if num_tokens_padded is None else num_tokens_padded
    query_start_loc_np = np.full(num_reqs_padded + 1, num_tokens, dtype=np.int32)
    query_start_loc_np[0] = 0
    np.cumsum(num_scheduled_np, out=query_start_loc_np[1 : num_reqs + 1])
    computed = num_computed_np[idx_mapping_np]
    seq_lens_np = computed + num_scheduled_np
    prefill = prefill_len_np[idx_mapping_np]
    return BatchPlan(
        req_ids=req_ids,
        plan_order=plan_order,
        idx_mapping_np=idx_mapping_np,
        num_scheduled_np=num_scheduled_np,
        query_start_loc_np=query_start_loc_np,
        seq_lens_np=seq_lens_np,
        sample_mask_np=seq_lens_np >= prefill,
        num_reqs=num_reqs,
        num_reqs_padded=num_reqs_padded,
        num_tokens=num_tokens,
        num_tokens_padded=num_tokens_padded,
        num_decodes=int(np.sum(num_scheduled_np == 1)),
        has_prefill=bool(np.any(computed < prefill)),
    )
