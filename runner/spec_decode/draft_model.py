"""The draft-model proposer: a smaller model with the target's vocabulary.

Placement: the draft model is sharded like the target (same tensor-parallel
group, its heads split over the ranks): each rank holds a slice, as it does
of the target, so no rank holds a whole second model and the draft's
all-reduces ride the target's group. Its KV cache has the target's number
of blocks and block size and is addressed through the same block tables
and slot mappings (a block id means the same tokens in both caches).

Keeping its cache right: every step, after the target's forward, the draft
model runs over the same inputs (``forward_step``: the same input ids,
positions, slot mapping and attention metadata, its own cache), so wherever
the target's cache holds a token's KV, the draft's holds it too (prefix-cache
hits included). A position holds a verified token once the target has fed
it, and both caches are then written.

Proposing (``propose``), after the rejection sampler: for j = 0 .. k-1 one
eager decode step over the batch rows feeds the row's last token (j = 0:
the last emitted one, at position num_computed_tokens; then the draft's
own previous guess) and takes the argmax of the draft logits as draft j.
These writes land at unverified positions, which the next step rewrites
when it feeds them. A position past the blocks the slot holds is not
written, and attention stops at the slot's blocks: such drafts are
guesses, which the rejection sampler rejects if wrong. Drafts are point
masses (argmax), so verification stays exactly lossless for random
sampling too (``runner.spec_decode.rejection``). No host sync: the host
knows every size; per-row counts stay on the device.

Positions. The draft model's rotary tables have a row for every position
below the runner's ``max_model_len``, as the target's: ``forward_step``
runs at the target's positions, which stay below it, so a long request
keeps a draft KV at every fed position (past the draft's own positions,
values no verified draft reads). ``max_model_len`` here is the draft's
limit, ``draft_max_model_len`` (its ``max_position_embeddings``, at most
the runner's): ``propose`` runs a row whose position reaches it at
position 0, attending to that one position and writing no KV, and the guess
it makes there is never verified, because the scheduler verifies no draft
at or past the limit (``Scheduler._num_drafts``; its limit is at most this
one). So every verified draft was made at positions below the draft's
limit, from KV below it, which ``forward_step`` wrote from fed tokens and
``propose`` from its own guesses before it; and no position past the
rotary tables is ever looked up, even where a request ends at
``max_model_len`` with k - 1 proposals past its last token.
"""

from __future__ import annotations

import numpy as np
import torch

from runner.attention.metadata import AttentionMetadata
from runner.kv_cache import allocate_kv_caches


class DraftModelProposer:
    def __init__(self, model, block_size: int, dtype: torch.dtype, device: torch.device,
                 shares_host_memory: bool, transfer, max_model_len: int):
        self.model = model
        self.max_model_len = max_model_len  # the draft's limit: see "Positions" above
        self.block_size = block_size
        self.dtype = dtype
        self.device = device
        self.shares_host_memory = shares_host_memory
        self.transfer = transfer
        self.kv_caches: list[torch.Tensor] = []

    def init_kv_cache(self, num_blocks: int) -> None:
        self.kv_caches = allocate_kv_caches(self.model, num_blocks, self.block_size, self.dtype,
                                            self.device)

    def forward_step(self, input_ids: torch.Tensor, positions: torch.Tensor,
                     attn: AttentionMetadata) -> None:
        """The draft model over the target's step inputs: its KV only."""
        self.model(input_ids, positions, self.kv_caches, attn)

    @torch.no_grad()
    def propose(self, block_rows: torch.Tensor, idx_mapping: torch.Tensor,
                num_computed: torch.Tensor, last_tokens: torch.Tensor,
                draft_tokens: torch.Tensor, num_blocks_np: np.ndarray,
                max_seq_len: int) -> None:
        """Write ``draft_tokens[slot, :k]`` for the ``n`` batch rows.

        ``block_rows`` [n, W] the rows' block tables (batch order);
        ``num_computed`` the slots' device counts (already corrected);
        ``last_tokens`` [n] the last emitted tokens; ``num_blocks_np`` [n]
        (host) blocks each row holds; ``max_seq_len`` a host bound of the
        rows' lengths before proposing. A row at or past ``max_model_len``
        runs at position 0 (seq_len 1, no KV write): its draft is a
        placeholder the scheduler never verifies."""
        n, k = idx_mapping.shape[0], draft_tokens.shape[1]
        if n == 0:
            return
        device, bs = self.device, self.block_size
        slots = idx_mapping.to(torch.int64)
        (held,) = self.transfer.upload(num_blocks_np.astype(np.int64) * bs)
        position = num_computed[slots].to(torch.int64)
        token = last_tokens.to(torch.int64)
        qsl = torch.arange(n + 1, dtype=torch.int32, device=device)
        qsl_cpu = torch.arange(n + 1, dtype=torch.int32)
        width = block_rows.shape[1]
        rows = torch.arange(n, device=device)
        for j in range(k):
            usable = position < self.max_model_len
            at = torch.where(usable, position, 0)
            inside = usable & (position < held)
            block = block_rows[rows, (at // bs).clamp(max=width - 1)].to(torch.int64)
            slot_mapping = torch.where(inside, block * bs + at % bs, -1)
            seq_lens = torch.where(usable, torch.minimum(position + 1, held), 1).to(torch.int32)
            bound = max_seq_len + j + 1
            attn = AttentionMetadata(
                num_reqs=n, num_tokens=n, num_decodes=n, max_query_len=1, max_seq_len=bound,
                query_start_loc=qsl, seq_lens=seq_lens, block_tables=block_rows,
                slot_mapping=slot_mapping, query_start_loc_cpu=qsl_cpu,
                seq_lens_cpu=seq_lens if self.shares_host_memory
                else torch.full((n,), bound, dtype=torch.int32))
            hidden = self.model(token.to(torch.int32), at, self.kv_caches, attn)
            token = self.model.compute_logits(hidden).argmax(dim=-1)
            draft_tokens[slots, j] = token.to(draft_tokens.dtype)
            position = position + 1
