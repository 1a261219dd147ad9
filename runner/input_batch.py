"""One step's batch: its order, its persistent input buffers, its inputs.

Only ``idx_mapping`` and ``query_start_loc`` go from host to device each
step; every other input is built on the device from slot numbers by the
kernels at the end of this file, which write ``InputBuffers`` (torch
references; their Triton versions are in triton_input_batch.py). For batch
row i, slot s = idx_mapping[i], query tokens t = qsl[i] .. qsl[i+1]-1 at
positions p = num_computed_tokens[s] + (t - qsl[i]):

- prepare_prefill_inputs: where p < prefill_len[s], input_ids[t] =
  all_token_ids[s, p]; every other entry of input_ids is left as it was.
  all_token_ids may be a UVA view of pinned host memory: the kernel then
  reads the prompt straight from host memory.
- prepare_pos_seq_lens: positions[t] = p and seq_lens[i] =
  num_computed_tokens[s] + (qsl[i+1] - qsl[i]). Padded rows num_reqs <= i <
  seq_lens.shape[0] get seq_lens[i] = 0 (CUDA graphs replay over padded
  rows, and attention must see them as empty). Positions past qsl[num_reqs]
  are left as they were.
- combine_sampled_tokens: logits_indices[i] = qsl[i+1] - 1 (the last token of
  every row, prefill rows included), and, only if seq_lens[i] > prefill_len[s]
  (the row decodes; seq_lens was written by prepare_pos_seq_lens earlier in the
  step), input_ids[qsl[i+1] - 1] = last_sampled_tokens[s]. This is how a
  decode gets its input token without the host ever seeing it.
  last_sampled_tokens may be [max_num_reqs] or [max_num_reqs, 1] (column 0).
- combine_draft_tokens (speculative decoding, instead of
  combine_sampled_tokens): row i owns logits rows cu_num_logits[i] ..
  cu_num_logits[i+1]-1, m of them, and logits_indices[cu_num_logits[i] + j]
  = qsl[i+1] - m + j (its last m tokens: all of a row with drafts, the last
  one otherwise). A row that decodes (seq_lens[i] - its token count >=
  prefill_len[s]: every token past the prompt) gets input_ids[qsl[i]] =
  last_sampled_tokens[s] and input_ids[qsl[i] + 1 + j] = draft_tokens[s, j]
  for its other tokens (a decode of n tokens carries n - 1 drafts).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from runner.ops import device_ops
from runner.staged_write_group import RowTarget


def batch_order(num_tokens: np.ndarray, has_drafts: np.ndarray,
                decode_query_len: int) -> np.ndarray:
    """Row indices in batch order: rows with drafts, then decodes (exactly
    ``decode_query_len`` tokens), then the rest by token count; ties keep
    their order (a stable sort). Attention backends rely on decode-like rows
    leading the batch."""
    return np.lexsort((num_tokens, num_tokens != decode_query_len, ~has_drafts))


def sort_batch_req_ids(num_tokens_per_req: dict[str, int], draft_tokens: dict[str, list[int]],
                       decode_query_len: int) -> list[str]:
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
        """``cu_num_logits`` [max_num_reqs + 1] (speculative decoding: logits
        rows per batch row, cumulated) shares the step's one copy."""
        self.max_num_reqs = max_num_reqs
        self.max_num_tokens = max_num_batched_tokens
        self.input_ids = torch.zeros(max_num_batched_tokens, dtype=torch.int32, device=device)
        self.positions = torch.zeros(max_num_batched_tokens, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        self.logits_indices = torch.zeros(
            max_num_batched_tokens, dtype=torch.int64, device=device
        )
        # Constant: the logits indices of a step whose every token has a logits row.
        self.every_token = torch.arange(max_num_batched_tokens, dtype=torch.int64, device=device)
        # idx_mapping, query_start_loc (and cu_num_logits) share one buffer,
        # the step meta: one copy a step, or one write in the launch of the
        # step's staged writes where it has any.
        r = max_num_reqs
        self.step_meta = torch.zeros(3 * r + 2, dtype=torch.int32, device=device)
        self.idx_mapping = self.step_meta[:r]
        self.query_start_loc = self.step_meta[r : 2 * r + 1]
        self.cu_num_logits = self.step_meta[2 * r + 1 :]
        self.step_meta_np = np.zeros(3 * r + 2, dtype=np.int32)
        # The same buffer as one row: the staged writes' launch may carry it.
        self.step_meta_target = RowTarget(self.step_meta.view(1, -1))
        self.transfer = device_ops(device).new_transfer()
        self.transfer.reserve(copy_bytes=self.step_meta_np.nbytes)
        # What step_meta holds on the device, as far as the host wrote it:
        # its first ``meta_known`` entries equal ``meta_on_device``'s.
        self.meta_on_device = np.zeros_like(self.step_meta_np)
        self.meta_known = len(self.meta_on_device)

    def holds_step_meta(self, meta: np.ndarray) -> bool:
        """Whether the device's ``step_meta`` starts with ``meta`` already
        (``stage_step_meta``'s result): a decode batch that keeps its rows
        and padding has the same meta step after step, and needs no copy."""
        return (len(meta) <= self.meta_known
                and np.array_equal(self.meta_on_device[: len(meta)], meta))

    def step_meta_written(self, meta: np.ndarray) -> None:
        """Record that ``meta`` reached the start of the device's ``step_meta``
        (by its own copy or in the staged writes' launch)."""
        self.meta_on_device[: len(meta)] = meta
        self.meta_known = max(self.meta_known, len(meta))

    def fill_for_capture(self, size: int, pad_slot: int) -> None:
        """Harmless meta for warming up and capturing a graph of ``size``
        rows: every row maps to ``pad_slot`` and has no token (written on
        the device directly, so the host's record of it is dropped)."""
        self.idx_mapping[:size].fill_(pad_slot)
        self.query_start_loc[: size + 1].zero_()
        self.cu_num_logits[: size + 1].zero_()
        self.meta_known = 0

    def copy_step_meta(self, idx_mapping_np: np.ndarray, query_start_loc_np: np.ndarray,
                       pad_slot: int, cu_num_logits_np: np.ndarray | None = None) -> None:
        """The step's host-to-device input copy (non-blocking on CUDA) of
        ``stage_step_meta``'s values (a step without staged writes)."""
        self.copy_staged_meta(self.stage_step_meta(idx_mapping_np, query_start_loc_np, pad_slot,
                                                   cu_num_logits_np))

    def copy_staged_meta(self, meta: np.ndarray) -> None:
        """Copy ``stage_step_meta``'s result into ``step_meta`` (non-blocking
        on CUDA)."""
        self.transfer.copy_into(meta, self.step_meta)
        self.step_meta_written(meta)

    def stage_step_meta(self, idx_mapping_np: np.ndarray, query_start_loc_np: np.ndarray,
                        pad_slot: int, cu_num_logits_np: np.ndarray | None = None) -> np.ndarray:
        """The step's values of ``step_meta``, from its start (a view of a
        host buffer that the next call rewrites): a copy of their own
        (``copy_staged_meta``), or a write in the staged writes' launch
        (``step_meta_target``), brings them to the device.

        Rows past the batch, up to ``len(query_start_loc_np) - 1`` (the padded
        count), map to ``pad_slot``. ``cu_num_logits_np`` (as long as
        ``query_start_loc_np``) only with speculative decoding.
        """
        n, m, r = len(idx_mapping_np), len(query_start_loc_np), self.max_num_reqs
        meta = self.step_meta_np
        meta[:n] = idx_mapping_np
        meta[n : m - 1] = pad_slot
        meta[r : r + m] = query_start_loc_np
        end = r + m
        if cu_num_logits_np is not None:
            meta[2 * r + 1 : 2 * r + 1 + m] = cu_num_logits_np
            end = 2 * r + 1 + m
        return meta[:end]


@dataclass(frozen=True)
class InputBatch:
    """The host's view of one step's batch, computed without the device.

    ``idx_mapping_np[i]`` is the slot of batch row ``i``;
    ``query_start_loc_np`` has ``num_reqs_padded + 1`` entries;
    ``sample_mask_np[i]`` is False for a prefill chunk that stops short of
    the end of its prefill tokens (its sampled token is discarded).
    ``num_logits_np[i]``: logits rows of batch row i (its token count when
    it decodes with drafts, else 1); ``cu_num_logits_np`` their offsets,
    padded like ``query_start_loc_np``. ``num_decodes``: leading rows with
    exactly one token. With speculative decoding the seq_lens of decoding
    rows are upper bounds (``runner.request_state``).
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
    num_logits_np: np.ndarray
    cu_num_logits_np: np.ndarray
    num_draft_rows: int

    @property
    def num_logits(self) -> int:
        return int(self.cu_num_logits_np[self.num_reqs])


def make_input_batch(plan_req_ids: list[str], num_scheduled_tokens: list[int],
                     req_id_to_index: dict[str, int], num_computed_np: np.ndarray,
                     prefill_len_np: np.ndarray, num_reqs_padded: int | None = None,
                     num_tokens_padded: int | None = None,
                     decode_query_len: int = 1) -> InputBatch:
    """Sort the scheduled requests (``plan_req_ids[i]`` gets
    ``num_scheduled_tokens[i]`` tokens; ``batch_order``) and compute every
    host-side count. ``decode_query_len`` is 1 + the number of speculative
    tokens; when it is above 1, a row has drafts when it decodes (its
    computed tokens reach its prefill) with more than one token."""
    num_reqs = len(plan_req_ids)
    counts = np.array(num_scheduled_tokens, dtype=np.int32)
    num_tokens = sum(num_scheduled_tokens)
    if decode_query_len == 1:  # no drafts: the batch order needs the counts alone
        if num_scheduled_tokens.count(num_scheduled_tokens[0] if num_reqs else 0) == num_reqs:
            plan_order = np.arange(num_reqs)  # equal counts: batch_order keeps the plan's
            req_ids = list(plan_req_ids)
            num_scheduled_np = counts
        else:
            plan_order = batch_order(counts, np.zeros(num_reqs, dtype=bool), decode_query_len)
            req_ids = [plan_req_ids[i] for i in plan_order]
            num_scheduled_np = counts[plan_order]
        idx_mapping_np = np.fromiter(map(req_id_to_index.__getitem__, req_ids), dtype=np.int32,
                                     count=num_reqs)
        drafts = None
    else:
        plan_slots = np.fromiter((req_id_to_index[r] for r in plan_req_ids), dtype=np.int32,
                                 count=num_reqs)
        has_drafts = counts > 1
        has_drafts &= num_computed_np[plan_slots] >= prefill_len_np[plan_slots]
        plan_order = batch_order(counts, has_drafts, decode_query_len)
        req_ids = [plan_req_ids[i] for i in plan_order]
        idx_mapping_np = plan_slots[plan_order]
        num_scheduled_np = counts[plan_order]
        drafts = has_drafts[plan_order]
    num_reqs_padded = num_reqs if num_reqs_padded is None else num_reqs_padded
    num_tokens_padded = num_tokens if num_tokens_padded is None else num_tokens_padded
    query_start_loc_np = np.empty(num_reqs_padded + 1, dtype=np.int32)
    query_start_loc_np[0] = 0
    num_scheduled_np.cumsum(out=query_start_loc_np[1 : num_reqs + 1])
    query_start_loc_np[num_reqs + 1 :] = num_tokens
    computed = num_computed_np[idx_mapping_np]
    seq_lens_np = computed + num_scheduled_np
    prefill = prefill_len_np[idx_mapping_np]
    num_draft_rows = 0 if drafts is None else int(np.count_nonzero(drafts))
    if num_draft_rows:
        num_logits_np = np.where(drafts, num_scheduled_np, 1).astype(np.int32)
        cu_num_logits_np = np.full(num_reqs_padded + 1, num_logits_np.sum(), dtype=np.int32)
        cu_num_logits_np[0] = 0
        np.cumsum(num_logits_np, out=cu_num_logits_np[1 : num_reqs + 1])
        not_one = np.flatnonzero(num_scheduled_np != 1)
        num_decodes = int(not_one[0]) if len(not_one) else num_reqs
    else:  # one logits row a request; one-token rows lead
        num_logits_np = np.ones(num_reqs, dtype=np.int32)
        cu_num_logits_np = np.arange(num_reqs_padded + 1, dtype=np.int32)
        cu_num_logits_np[num_reqs + 1 :] = num_reqs
        num_decodes = num_scheduled_tokens.count(1)
        if decode_query_len > 1 and num_decodes and num_scheduled_np[0] != 1:
            num_decodes = 0  # prefill chunks of exactly decode_query_len tokens lead
    return InputBatch(
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
        num_decodes=num_decodes,
        has_prefill=bool((computed < prefill).any()),
        num_logits_np=num_logits_np,
        cu_num_logits_np=cu_num_logits_np,
        num_draft_rows=num_draft_rows,
    )


# ---- the input kernels (torch references) -------------------------------


def check_num_reqs(num_reqs: int, idx_mapping: torch.Tensor, query_start_loc: torch.Tensor) -> None:
    """Raise ValueError unless the host-known batch size fits the device buffers."""
    if num_reqs < 0 or num_reqs > idx_mapping.shape[0]:
        raise ValueError(
            f"num_reqs={num_reqs} outside [0, {idx_mapping.shape[0]}] (idx_mapping size)"
        )
    if query_start_loc.shape[0] < num_reqs + 1:
        raise ValueError(
            f"query_start_loc has {query_start_loc.shape[0]} entries, needs num_reqs + 1 ="
            f" {num_reqs + 1}"
        )


def token_rows(query_start_loc: torch.Tensor, num_reqs: int, num_tokens: int) -> torch.Tensor:
    """Batch row of each token 0 .. num_tokens-1 (int64, on the device of query_start_loc).

    Row i owns tokens query_start_loc[i] .. query_start_loc[i+1]-1. A token at or
    past query_start_loc[num_reqs] gets row num_reqs (no row). Fixed shape, no sync.
    """
    ends = query_start_loc[1 : num_reqs + 1].to(torch.int64)
    tokens = torch.arange(num_tokens, device=query_start_loc.device, dtype=torch.int64)
    return torch.searchsorted(ends, tokens, right=True)


def check_prepare_prefill_inputs(idx_mapping: torch.Tensor, query_start_loc: torch.Tensor,
                                 all_token_ids: torch.Tensor, num_reqs: int) -> None:
    """Raise ValueError unless the sizes fit (both versions)."""
    check_num_reqs(num_reqs, idx_mapping, query_start_loc)
    if all_token_ids.stride(1) != 1:
        raise ValueError("all_token_ids rows must be contiguous")


def prepare_prefill_inputs_ref(input_ids: torch.Tensor, idx_mapping: torch.Tensor,
                               query_start_loc: torch.Tensor, all_token_ids: torch.Tensor,
                               prefill_len: torch.Tensor, num_computed_tokens: torch.Tensor,
                               num_reqs: int) -> None:
    """Torch reference: fixed shapes over the whole input_ids buffer, no sync."""
    if num_reqs == 0:
        return
    num_tokens = input_ids.shape[0]
    rows = token_rows(query_start_loc, num_reqs, num_tokens)
    in_batch = rows < num_reqs
    rows = rows.clamp(max=num_reqs - 1)
    slots = idx_mapping[:num_reqs].to(torch.int64)[rows]
    starts = query_start_loc[:num_reqs].to(torch.int64)[rows]
    tokens = torch.arange(num_tokens, device=input_ids.device, dtype=torch.int64)
    pos = num_computed_tokens.to(torch.int64)[slots] + (tokens - starts)
    write = in_batch & (pos < prefill_len.to(torch.int64)[slots])
    pos = pos.clamp(0, all_token_ids.shape[1] - 1)
    prompt = all_token_ids[slots, pos].to(input_ids.dtype)
    input_ids.copy_(torch.where(write, prompt, input_ids))


def check_prepare_pos_seq_lens(idx_mapping: torch.Tensor, query_start_loc: torch.Tensor,
                               seq_lens: torch.Tensor, num_reqs: int) -> None:
    """Raise ValueError unless the sizes fit (both versions)."""
    check_num_reqs(num_reqs, idx_mapping, query_start_loc)
    if num_reqs > seq_lens.shape[0]:
        raise ValueError(f"num_reqs={num_reqs} exceeds seq_lens size {seq_lens.shape[0]}")


def prepare_pos_seq_lens_ref(idx_mapping: torch.Tensor, query_start_loc: torch.Tensor,
                             num_computed_tokens: torch.Tensor, positions: torch.Tensor,
                             seq_lens: torch.Tensor, num_reqs: int) -> None:
    """Torch reference: fixed shapes, no sync."""
    seq_lens[num_reqs:].zero_()
    if num_reqs == 0:
        return
    qsl = query_start_loc[: num_reqs + 1].to(torch.int64)
    computed = num_computed_tokens.to(torch.int64)[idx_mapping[:num_reqs].to(torch.int64)]
    seq_lens[:num_reqs] = (computed + qsl[1:] - qsl[:-1]).to(seq_lens.dtype)

    num_tokens = positions.shape[0]
    rows = token_rows(query_start_loc, num_reqs, num_tokens)
    in_batch = rows < num_reqs
    rows = rows.clamp(max=num_reqs - 1)
    tokens = torch.arange(num_tokens, device=positions.device, dtype=torch.int64)
    pos = computed[rows] + tokens - qsl[rows]
    positions.copy_(torch.where(in_batch, pos.to(positions.dtype), positions))


def check_combine_sampled_tokens(idx_mapping: torch.Tensor, query_start_loc: torch.Tensor,
                                 logits_indices_out: torch.Tensor, num_reqs: int) -> None:
    """Raise ValueError unless the sizes fit (both versions)."""
    check_num_reqs(num_reqs, idx_mapping, query_start_loc)
    if num_reqs > logits_indices_out.shape[0]:
        raise ValueError(
            f"num_reqs={num_reqs} exceeds logits_indices_out size {logits_indices_out.shape[0]}"
        )


def combine_sampled_tokens_ref(input_ids: torch.Tensor, idx_mapping: torch.Tensor,
                               last_sampled_tokens: torch.Tensor, query_start_loc: torch.Tensor,
                               seq_lens: torch.Tensor, prefill_len: torch.Tensor,
                               logits_indices_out: torch.Tensor, num_reqs: int) -> torch.Tensor:
    """Torch reference: fixed shapes, no sync. Per token, not per row: a row
    with no tokens (padding) shares its ``end - 1`` with the row before it,
    and must not overwrite that row's token; token t gets a value iff its row
    decodes and t is the row's last token."""
    out = logits_indices_out[:num_reqs]
    if num_reqs == 0:
        return out
    qsl = query_start_loc.to(torch.int64)
    out.copy_(qsl[1 : num_reqs + 1] - 1)
    num_tokens = input_ids.shape[0]
    rows = token_rows(query_start_loc, num_reqs, num_tokens)
    in_batch = rows < num_reqs
    rows = rows.clamp(max=num_reqs - 1)
    slots = idx_mapping.to(torch.int64)[rows]
    last = torch.arange(num_tokens, device=input_ids.device) == qsl[rows + 1] - 1
    decoding = seq_lens.to(torch.int64)[rows] > prefill_len.to(torch.int64)[slots]
    first_column = last_sampled_tokens if last_sampled_tokens.dim() == 1 else (
        last_sampled_tokens[:, 0])
    values = first_column[slots].to(input_ids.dtype)
    input_ids.copy_(torch.where(in_batch & decoding & last, values, input_ids))
    return out


def finish_step_rows_ref(idx_mapping: torch.Tensor, seq_lens: torch.Tensor,
                         positions: torch.Tensor, logits_indices: torch.Tensor,
                         prefill_len: torch.Tensor, num_computed_tokens: torch.Tensor,
                         num_reqs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The device bookkeeping of a step once its inputs are built (the runner
    queues it with the forward): every batch row's seq_len becomes its
    slot's ``num_computed_tokens`` (so the next step needs no staged write),
    and returns (int64 slots of rows ``[0, num_reqs)``, int64 position that
    each logits row samples: its token's position + 1, bool sample mask:
    the row is past its prompt). Rows map to distinct slots, padding rows to
    the padding slot with seq_len 0. Fixed shapes, no sync."""
    idx = idx_mapping[:num_reqs].to(torch.int64)
    lens = seq_lens[:num_reqs]
    num_computed_tokens.index_copy_(0, idx, lens.to(num_computed_tokens.dtype))
    next_positions = positions[logits_indices] + 1
    sample_mask = lens >= prefill_len[idx]
    return idx, next_positions, sample_mask


def check_combine_draft_tokens(idx_mapping: torch.Tensor, query_start_loc: torch.Tensor,
                               cu_num_logits: torch.Tensor, draft_tokens: torch.Tensor,
                               num_reqs: int) -> None:
    """Raise ValueError unless the sizes fit (both versions)."""
    check_num_reqs(num_reqs, idx_mapping, query_start_loc)
    if cu_num_logits.shape[0] < num_reqs + 1:
        raise ValueError(f"cu_num_logits has {cu_num_logits.shape[0]} entries, needs "
                         f"num_reqs + 1 = {num_reqs + 1}")
    if draft_tokens.dim() != 2 or draft_tokens.stride(1) != 1:
        raise ValueError("draft_tokens must be [slots, k] with contiguous rows")


def combine_draft_tokens_ref(input_ids: torch.Tensor, idx_mapping: torch.Tensor,
                             last_sampled_tokens: torch.Tensor, draft_tokens: torch.Tensor,
                             query_start_loc: torch.Tensor, cu_num_logits: torch.Tensor,
                             seq_lens: torch.Tensor, prefill_len: torch.Tensor,
                             logits_indices_out: torch.Tensor, num_reqs: int) -> None:
    """Torch reference: fixed shapes over the whole buffers, no sync."""
    if num_reqs == 0:
        return
    device = input_ids.device
    qsl = query_start_loc.to(torch.int64)
    cu = cu_num_logits.to(torch.int64)
    # logits_indices: per logits row l of row r, qsl[r+1] - (cu[r+1] - l).
    num_logits_rows = logits_indices_out.shape[0]
    lrows = torch.searchsorted(cu[1: num_reqs + 1], torch.arange(num_logits_rows, device=device),
                               right=True)
    in_logits = lrows < num_reqs
    lrows = lrows.clamp(max=num_reqs - 1)
    lidx = qsl[lrows + 1] - (cu[lrows + 1] - torch.arange(num_logits_rows, device=device))
    logits_indices_out.copy_(torch.where(in_logits, lidx, logits_indices_out))
    # input_ids of decoding rows: the last sampled token, then the drafts.
    num_tokens = input_ids.shape[0]
    rows = token_rows(query_start_loc, num_reqs, num_tokens)
    in_batch = rows < num_reqs
    rows = rows.clamp(max=num_reqs - 1)
    slots = idx_mapping.to(torch.int64)[rows]
    offset = torch.arange(num_tokens, device=device) - qsl[rows]
    count = qsl[rows + 1] - qsl[rows]
    decoding = (seq_lens.to(torch.int64)[rows] - count) >= prefill_len.to(torch.int64)[slots]
    first_column = last_sampled_tokens if last_sampled_tokens.dim() == 1 else (
        last_sampled_tokens[:, 0])
    k = draft_tokens.shape[1]
    draft = draft_tokens[slots, (offset - 1).clamp(0, k - 1)]
    values = torch.where(offset == 0, first_column[slots], draft).to(input_ids.dtype)
    input_ids.copy_(torch.where(in_batch & decoding, values, input_ids))
