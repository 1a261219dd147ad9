"""Per-step attention metadata, built by the runner, read by every layer."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionMetadata:
    """One step's view of the batch, in batch order (decodes first).

    Device tensors (persistent buffers, sliced):
      query_start_loc [num_reqs + 1] int32: token offsets; non-decreasing.
      seq_lens [num_reqs] int32: computed tokens + this step's tokens.
      block_tables [num_reqs, max_num_blocks] int32: KV blocks of each row.
      slot_mapping [num_tokens] int64: cache slot of each token, -1 = skip.
    Host copies (exact, known without a device sync):
      query_start_loc_cpu, seq_lens_cpu, and the maxima.
    ``num_decodes`` leading rows have exactly one query token.
    ``num_draft_rows`` leading rows verify drafts (speculative decoding):
    where the device is not host memory, the host seq_lens of decoding rows
    (these and one-token decodes) are upper bounds, so only the maxima may
    be read from them; the device ``seq_lens`` are exact.
    """

    num_reqs: int
    num_tokens: int
    num_decodes: int
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    num_draft_rows: int = 0

    @property
    def uniform_decode(self) -> bool:
        """Every row has exactly one query token: token r is row r's."""
        return self.max_query_len == 1 and self.num_decodes == self.num_reqs


def leading_rows(attn: AttentionMetadata, rows: int) -> AttentionMetadata:
    """The metadata of the batch's first ``rows`` rows alone."""
    starts, seq_lens = attn.query_start_loc_cpu[: rows + 1], attn.seq_lens_cpu[:rows]
    num_tokens = int(starts[-1])
    return AttentionMetadata(
        num_reqs=rows, num_tokens=num_tokens, num_decodes=min(attn.num_decodes, rows),
        max_query_len=int((starts[1:] - starts[:-1]).max()), max_seq_len=int(seq_lens.max()),
        query_start_loc=attn.query_start_loc[: rows + 1], seq_lens=attn.seq_lens[:rows],
        block_tables=attn.block_tables[:rows], slot_mapping=attn.slot_mapping[:num_tokens],
        query_start_loc_cpu=starts, seq_lens_cpu=seq_lens,
        num_draft_rows=min(attn.num_draft_rows, rows))
