"""The slot-based model runner (Model Runner V2 design).

Per step: ``execute_model`` applies the plan to the persistent state
(finish and free in sorted order, add, update, staged writes), sorts the
batch, copies ``idx_mapping`` and ``query_start_loc`` to the device, builds
every other input there, and queues the forward pass. ``sample_tokens``
queues logits, sampling and the copy to the host and returns an
``AsyncOutput``. Neither call waits for the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ipc.config import RunnerConfig
from ipc.messages import SchedulerOutput
from runner.async_output import AsyncOutput
from runner.attention.metadata import AttentionMetadata
from runner.block_table import BlockTables
from runner.cuda_graphs import CudaGraphManager, capture_sizes
from runner.distributed import TensorParallelGroup
from runner.input_batch import InputBatch, InputBuffers, make_input_batch
from runner.kv_cache import (
    allocate_kv_caches,
    kv_cache_bytes_per_block,
    profile_peak_memory,
)
from runner.models import build_model, build_model_from_config
from runner.ops import device_ops
from runner.plan_check import check_plan
from runner.request_state import RequestState
from runner.sampler import Sampler, SamplerOutput
from runner.sampling.prompt_logprobs import PromptLogprobsOutput, PromptLogprobsState


@dataclass(frozen=True)
class StepTensors:
    """Device tensors of one forward pass that sampling reads, one row per
    batch row: all computed on the device (inside the graph on decode)."""

    idx_mapping: torch.Tensor  # int64 slots of the batch rows
    logits: torch.Tensor  # float32 [rows, vocab]
    positions: torch.Tensor  # position of the token each row samples
    sample_mask: torch.Tensor  # bool: the row is past its prompt and samples

    def head(self, n: int) -> StepTensors:
        """The first ``n`` rows (a padded graph step's real rows)."""
        return StepTensors(self.idx_mapping[:n], self.logits[:n], self.positions[:n],
                           self.sample_mask[:n])


@dataclass
class _PendingStep:
    """What ``execute_model`` leaves for ``sample_tokens``."""

    step_id: int
    batch: InputBatch
    tensors: StepTensors | None
    prompt_logprobs: PromptLogprobsOutput | None = None


def _load_model(config: RunnerConfig, device: torch.device, tp: TensorParallelGroup):
    """The model ``config.model_config`` describes: random weights for
    ``load_format="dummy"``, else ``config.model``'s."""
    dtype = getattr(torch, config.dtype)
    if config.load_format == "dummy":
        return build_model_from_config(config.model_config, dtype, device, tp,
                                       config.attention_backend, init="random", seed=config.seed,
                                       max_positions=config.max_model_len)
    return build_model(config.model_config, config.model, dtype, device, tp,
                       config.attention_backend, max_positions=config.max_model_len)


class ModelRunner:
    def __init__(self, config: RunnerConfig, device: torch.device, tp: TensorParallelGroup):
        self.config = config
        self.device = device
        self.ops = device_ops(device)
        self.tp = tp.with_peer_buffers(device) if not config.disable_custom_all_reduce else tp
        self.model = _load_model(config, device, self.tp)
        self.dtype = next(self.model.parameters()).dtype
        n = config.max_num_seqs
        self.req_states = RequestState(n, config.max_model_len, device)
        self.sampler = Sampler(n, self.model.config.vocab_size, device, config.seed)
        self.prompt_logprobs = PromptLogprobsState(n, device)
        self.block_tables = BlockTables(
            config.block_size,
            n,
            config.max_num_blocks_per_req,
            config.max_num_batched_tokens,
            device,
        )
        self.buffers = InputBuffers(n, config.max_num_batched_tokens, device)
        self.output_transfer = self.ops.new_transfer()
        self.kv_caches: list[torch.Tensor] = []
        self.num_blocks = 0
        self.pending: _PendingStep | None = None
        use_graphs = self.ops.cuda_graphs and not config.enforce_eager
        sizes = (capture_sizes(n, config.max_num_batched_tokens, config.max_cudagraph_capture_size)
                 if use_graphs else [])
        self.graphs = CudaGraphManager(sizes)

    # ---- KV cache -------------------------------------------------------
    def bytes_per_block(self) -> int:
        return kv_cache_bytes_per_block(self.model, self.config.block_size, self.dtype)

    def determine_num_blocks(self) -> int:
        """Blocks that fit this rank's budget (the executor takes the minimum).

        CPU: ``kv_cache_memory_bytes``. CUDA: ``gpu_memory_utilization`` of the
        device, minus memory others hold, minus this process's peak during a
        profile run of a full token budget (weights included).
        """
        per_block = self.bytes_per_block()
        if not self.ops.kv_budget_from_free_memory:
            return self.config.kv_cache_memory_bytes // per_block
        peak = profile_peak_memory(self.model, self.config, self.dtype, self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        held_by_others = (total - free) - torch.cuda.memory_reserved(self.device)
        # Graphs hold their largest batch's activations and float32 logits.
        graph_logits = 6 * max(self.graphs.sizes, default=0) * self.model.config.vocab_size
        graph_reserve = (256 << 20) + graph_logits if self.graphs.sizes else 0
        # Filters, penalties and logprobs hold about ten float32 copies of the
        # batch's logits at their peak; the profile run does not sample.
        sampler_reserve = 10 * 4 * self.config.max_num_seqs * self.model.config.vocab_size
        budget = int(total * self.config.gpu_memory_utilization)
        budget -= held_by_others + peak + graph_reserve + sampler_reserve
        return max(0, budget // per_block)

    def init_kv_cache(self, num_blocks: int) -> None:
        """Allocate the cache, then capture the decode graphs (they read it)."""
        self.kv_caches = allocate_kv_caches(
            self.model, num_blocks, self.config.block_size, self.dtype, self.device
        )
        self.num_blocks = num_blocks
        if self.graphs.sizes:
            self.graphs.capture(self._fill_graph_inputs, self._graph_forward,
                                show_progress=self.tp.rank == 0)

    def _fill_graph_inputs(self, size: int) -> None:
        """Harmless step inputs for warming up and capturing a graph: every
        row maps to the padding slot and has no token, so nothing is written
        to the KV cache. Runs before capture, never inside a graph."""
        buf = self.buffers
        buf.idx_mapping[:size].fill_(self.req_states.pad_slot)
        buf.query_start_loc[: size + 1].zero_()

    @torch.no_grad()
    def _graph_forward(self, size: int) -> StepTensors:
        """One step of ``size`` padded one-token rows, from the step's only
        copied inputs (``idx_mapping``, ``query_start_loc``) to the sampler's
        inputs: the input kernels, the model and the logits, all in the graph.
        Rows past the batch map to the padding slot (seq_len 0, no KV write;
        their seq_len 0 is what the padding slot's count already is)."""
        buf = self.buffers
        self.block_tables.slot_mapping[:size].fill_(-1)  # tokens of no row
        block_tables, slot_mapping = self._build_inputs(
            num_reqs=size, num_tokens=size, num_reqs_padded=size, num_tokens_padded=size,
            has_prefill=True)
        # Host copies are read only by the CPU reference backend (emulated
        # graphs): there the buffers themselves are host memory.
        host_buffers = self.ops.shares_host_memory
        attn = AttentionMetadata(
            num_reqs=size, num_tokens=size, num_decodes=size, max_query_len=1,
            max_seq_len=self.config.max_model_len,
            query_start_loc=buf.query_start_loc[: size + 1], seq_lens=buf.seq_lens[:size],
            block_tables=block_tables, slot_mapping=slot_mapping,
            query_start_loc_cpu=buf.query_start_loc[: size + 1] if host_buffers
            else torch.arange(size + 1, dtype=torch.int32),
            seq_lens_cpu=buf.seq_lens[:size] if host_buffers
            else torch.ones(size, dtype=torch.int32),
        )
        hidden = self.model(buf.input_ids[:size], buf.positions[:size], self.kv_caches, attn)
        return self._after_forward(hidden, size, one_token_rows=True)

    # ---- applying the plan ---------------------------------------------
    def _update_states(self, plan: SchedulerOutput) -> None:
        # Finished and preempted requests leave alike, in sorted order, so
        # every rank frees (and later reuses) the same slots.
        for req_id in sorted(set(plan.finished_req_ids) | set(plan.preempted_req_ids)):
            if req_id in self.req_states.req_id_to_index:
                self.req_states.remove_request(req_id)
        for new in plan.scheduled_new_reqs:
            slot = self.req_states.add_request(new)
            self.sampler.add_request(
                slot, new.sampling, len(new.prompt_token_ids), len(new.prefill_token_ids),
                new.min_tokens_stop_ids,
            )
            self.block_tables.add_request(slot, new.block_ids[0])
            self.prompt_logprobs.add_request(slot, new.sampling.prompt_logprobs)
        cached = plan.scheduled_cached_reqs
        index = self.req_states.req_id_to_index
        for req_id, blocks in zip(cached.req_ids, cached.new_block_ids):
            if blocks:  # the runner counts computed tokens itself
                self.block_tables.append_blocks(index[req_id], blocks[0])
        self.req_states.apply_staged_writes()
        self.sampler.apply_staged_writes(self.req_states.all_token_ids.gpu)
        self.block_tables.apply_staged_writes()

    # ---- the step -------------------------------------------------------
    @torch.no_grad()
    def execute_model(self, plan: SchedulerOutput) -> None:
        """Apply the plan and queue the forward pass; never waits."""
        check_plan(plan, self.req_states, self.block_tables, self.num_blocks,
                   self.config.max_num_batched_tokens, self.model.config.vocab_size)
        self._update_states(plan)
        graph_size = self._graph_size(plan)
        batch = make_input_batch(
            plan.scheduled_req_ids(),
            plan.num_scheduled_tokens,
            self.req_states.req_id_to_index,
            self.req_states.num_computed_tokens_np,
            self.req_states.prefill_len_np,
            num_reqs_padded=graph_size,
            num_tokens_padded=graph_size,
        )
        if batch.num_tokens == 0:
            self.pending = _PendingStep(plan.step_id, batch, None)
            return
        self.buffers.copy_step_meta(batch.idx_mapping_np, batch.query_start_loc_np,
                                    self.req_states.pad_slot)
        prompt_logprobs = None
        if graph_size is not None:
            tensors = self.graphs.replay(graph_size).head(batch.num_reqs)
        else:
            input_ids, positions, attn = self._prepare_inputs(batch)
            hidden = self.model(input_ids, positions, self.kv_caches, attn)
            tensors = self._after_forward(hidden, batch.num_reqs, one_token_rows=False)
            prompt_logprobs = self._prompt_logprobs(hidden, batch)
        self.req_states.num_computed_tokens_np[batch.idx_mapping_np] = batch.seq_lens_np
        self.pending = _PendingStep(plan.step_id, batch, tensors, prompt_logprobs)

    def _prompt_logprobs(self, hidden: torch.Tensor,
                         batch: InputBatch) -> PromptLogprobsOutput | None:
        """Score the prompt tokens of this step's chunks for the requests that
        ask (``runner.sampling.prompt_logprobs``); None when none does."""
        states = self.req_states
        return self.prompt_logprobs.compute(
            hidden, batch.req_ids, batch.idx_mapping_np, batch.query_start_loc_np,
            batch.seq_lens_np - batch.num_scheduled_np, batch.num_scheduled_np,
            states.prompt_len_np, states.all_token_ids.gpu, self.model.compute_logits,
            self.model.config.vocab_size)

    def _after_forward(self, hidden: torch.Tensor, n: int, one_token_rows: bool) -> StepTensors:
        """Device work between the model and the sampler for batch rows
        ``[0, n)``: logits of each row's last token, and the step's tokens
        counted as computed on the device (seq_lens copied into the slots, so
        no staged write is needed next step). With ``one_token_rows`` (decode
        graphs) row i's token is token i and no gather is needed."""
        buf = self.buffers
        idx = buf.idx_mapping[:n].long()
        self.req_states.num_computed_tokens.gpu.index_copy_(0, idx, buf.seq_lens[:n])
        if one_token_rows:
            last_hidden, positions = hidden[:n], buf.positions[:n] + 1
        else:
            rows = buf.logits_indices[:n]
            last_hidden, positions = hidden[rows], buf.positions[rows] + 1
        sample_mask = buf.seq_lens[:n] >= self.req_states.prefill_len.gpu[idx]
        return StepTensors(idx, self.model.compute_logits(last_hidden), positions, sample_mask)

    def _graph_size(self, plan: SchedulerOutput) -> int | None:
        """The captured size to pad a one-token-per-request batch to, or None
        (eager) for mixed batches and batches larger than every graph."""
        counts = plan.num_scheduled_tokens
        if not counts or not self.graphs.graphs or any(n != 1 for n in counts):
            return None
        if self.prompt_logprobs.needs_eager(plan.scheduled_req_ids(),
                                            self.req_states.req_id_to_index,
                                            self.req_states.num_computed_tokens_np,
                                            self.req_states.prompt_len_np):
            return None  # the graphs keep no hidden states to score prompt tokens with
        return self.graphs.padded_size(len(counts))

    def _build_inputs(self, *, num_reqs: int, num_tokens: int, num_reqs_padded: int,
                      num_tokens_padded: int,
                      has_prefill: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The input kernels over batch rows ``[0, num_reqs)`` and tokens
        ``[0, num_tokens)``: input_ids, positions, seq_lens (0 for rows
        ``>= num_reqs``), logits_indices, the batch's block-table rows
        (``num_reqs_padded``) and slot mapping (-1 for tokens
        ``[num_tokens, num_tokens_padded)``). Reads only persistent buffers."""
        n, t, n_padded, t_padded = num_reqs, num_tokens, num_reqs_padded, num_tokens_padded
        buf, states = self.buffers, self.req_states
        idx_mapping = buf.idx_mapping[:n]
        qsl = buf.query_start_loc[: n_padded + 1]
        computed = states.num_computed_tokens.gpu
        prefill_len = states.prefill_len.gpu
        if has_prefill:
            self.ops.prepare_prefill_inputs(
                buf.input_ids, idx_mapping, qsl, states.all_token_ids.gpu, prefill_len, computed, n
            )
        self.ops.prepare_pos_seq_lens(idx_mapping, qsl, computed, buf.positions, buf.seq_lens, n)
        self.ops.combine_sampled_tokens(buf.input_ids, idx_mapping, states.last_sampled_tokens,
                                        qsl, buf.seq_lens, prefill_len, buf.logits_indices, n)
        block_tables = self.block_tables.gather(idx_mapping, n, n_padded)
        slot_mapping = self.block_tables.compute_slot_mapping(
            idx_mapping, qsl, buf.positions, n, t, t_padded
        )
        return block_tables, slot_mapping

    def _prepare_inputs(self, batch: InputBatch):
        """Eager step inputs: the input kernels and the attention metadata."""
        buf = self.buffers
        n, t = batch.num_reqs, batch.num_tokens
        block_tables, slot_mapping = self._build_inputs(
            num_reqs=n, num_tokens=t, num_reqs_padded=batch.num_reqs_padded,
            num_tokens_padded=batch.num_tokens_padded, has_prefill=batch.has_prefill)
        attn = AttentionMetadata(
            num_reqs=n,
            num_tokens=t,
            num_decodes=batch.num_decodes,
            max_query_len=int(batch.num_scheduled_np.max()),
            max_seq_len=int(batch.seq_lens_np.max()),
            query_start_loc=buf.query_start_loc[: batch.num_reqs_padded + 1],
            seq_lens=buf.seq_lens[: batch.num_reqs_padded],
            block_tables=block_tables,
            slot_mapping=slot_mapping,
            query_start_loc_cpu=torch.from_numpy(batch.query_start_loc_np),
            seq_lens_cpu=torch.from_numpy(batch.seq_lens_np),
        )
        t_pad = batch.num_tokens_padded
        return buf.input_ids[:t_pad], buf.positions[:t_pad], attn

    @torch.no_grad()
    def sample_tokens(self) -> AsyncOutput:
        """Queue logits, sampling and the copy to the host; never waits."""
        step, self.pending = self.pending, None
        if step is None:
            raise RuntimeError("sample_tokens called without execute_model")
        batch = step.batch
        if step.tensors is None:
            empty = SamplerOutput.empty(self.device)
            return AsyncOutput(step.step_id, batch.plan_order, batch.sample_mask_np, empty,
                               self.output_transfer)
        t = step.tensors
        idx_mapping = t.idx_mapping
        out = self.sampler(t.logits, idx_mapping, batch.idx_mapping_np, t.positions, t.sample_mask)
        output = AsyncOutput(
            step.step_id, batch.plan_order, batch.sample_mask_np, out, self.output_transfer,
            step.prompt_logprobs,
        )
        self.req_states.last_sampled_tokens.index_copy_(0, idx_mapping, out.sampled_token_ids)
        return output
