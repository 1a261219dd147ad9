"""FULL CUDA graphs for uniform decode batches and for small batches with prefills.

At start-up, after the KV cache exists, one graph is captured per capture
size (a ladder 1, 2, 4, 8, 16, 24, ... up to ``max_num_seqs``). Each holds
the input kernels and the model, reading only persistent buffers, so a
replay takes no arguments: the host copies ``idx_mapping`` and
``query_start_loc`` and replays. A decode batch of ``n`` requests runs as the
graph of the smallest capture size ``>= n``; its padded rows map to the
padding slot, so they get seq_len 0 and their tokens slot -1.

Batches with prefills (mixed) are keyed by tokens instead: one graph per
rung of ``prefill_capture_sizes``, each of a fixed number of rows (padded
rows own no token, padded tokens belong to no row), so a small prompt's
forward pass costs one launch rather than hundreds. Only an attention
backend whose launches depend on nothing but the padded sizes can be
captured that way (``captures_mixed_batches``). Larger batches run eagerly:
there the device, not the host, sets the pace, and padding would only add
work.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch
from tqdm import tqdm

logger = logging.getLogger(__name__)


def capture_sizes(max_num_seqs: int, max_num_batched_tokens: int,
                  max_capture_size: int | None = None) -> list[int]:
    """The ladder of batch sizes to capture, ascending, capped by every
    limit given (the largest capped size is captured too)."""
    ladder = [1, 2, 4, 8] + list(range(16, 257, 8)) + list(range(272, 1025, 16))
    limit = min(max_num_seqs, max_num_batched_tokens, max_capture_size or max_num_seqs)
    sizes = [s for s in ladder if s <= limit]
    if limit not in sizes and limit <= ladder[-1]:
        sizes.append(limit)
    return sizes


PREFILL_GRAPH_ROWS = 32  # rows of every mixed-batch graph; batches with more run eagerly
PREFILL_LADDER = (64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)


def prefill_capture_sizes(max_tokens: int, max_num_batched_tokens: int) -> list[int]:
    """Token counts of the mixed-batch graphs, ascending: the ladder's rungs
    up to ``min(max_tokens, max_num_batched_tokens)``, and that limit itself
    (0 captures none). A batch pads to the next rung, so padding stays
    under half of its tokens."""
    limit = min(max_tokens, max_num_batched_tokens)
    sizes = [s for s in PREFILL_LADDER if s <= limit]
    if limit > 0 and limit not in sizes and limit <= PREFILL_LADDER[-1]:
        sizes.append(limit)
    return sizes


class CudaGraphManager:
    """Captured decode graphs by padded batch size; their outputs are views
    into memory of the graphs' shared pool, valid until the next replay."""

    def __init__(self, sizes: list[int], emulate: bool = False):
        """``emulate=True`` captures nothing and "replays" by running the
        forward pass eagerly: the same padded decode path, on any device, so
        CPU tests can check it against eager steps."""
        self.sizes = sorted(sizes)
        self.emulate = emulate
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph | None, torch.Tensor | None]] = {}
        self.forward: Callable[[int], torch.Tensor] | None = None
        self.pool = None

    def padded_size(self, num_reqs: int) -> int | None:
        """The smallest captured size that holds ``num_reqs``, or None."""
        for size in self.sizes:
            if size >= num_reqs and size in self.graphs:
                return size
        return None

    def capture(self, fill_inputs: Callable[[int], None],
                forward: Callable[[int], torch.Tensor], show_progress: bool) -> None:
        """Capture ``forward(size)`` for every size, largest first (so the
        smaller graphs reuse the largest one's memory pool), in place of any
        graphs captured before.

        ``fill_inputs(size)`` puts harmless values in the input buffers first;
        it runs outside the capture, so replays never reset the inputs that a
        step prepared. ``forward`` must only read the input buffers.
        """
        if self.emulate:
            self.forward = forward
            self.graphs = dict.fromkeys(self.sizes, (None, None))
            return
        start = time.perf_counter()
        self.graphs = {}  # the old graphs' memory goes back with them
        self.pool = torch.cuda.graph_pool_handle()
        for size in tqdm(sorted(self.sizes, reverse=True), desc="capturing CUDA graphs",
                         disable=not show_progress):
            fill_inputs(size)
            forward(size)  # warm-up: compiles kernels, settles allocations
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                output = forward(size)
            self.graphs[size] = (graph, output)
        torch.cuda.synchronize()
        logger.info("captured %d CUDA graphs in %.2f s", len(self.graphs),
                    time.perf_counter() - start)

    def drop(self) -> None:
        """Forget every graph and its memory pool (sleep mode: the tensors
        they read move); ``capture`` makes them again. A step finds no graph
        meanwhile and runs eagerly."""
        self.graphs = {}
        self.forward = None
        self.pool = None

    def replay(self, size: int) -> torch.Tensor:
        if self.emulate:
            return self.forward(size)
        graph, output = self.graphs[size]
        graph.replay()
        return output
