"""The slot-based model runner (Model Runner V2 design).

Per step: ``execute_model`` applies the plan to the persistent state
(finish and free in sorted order, add, update; device writes staged),
sorts the batch, applies the staged writes with ``idx_mapping`` and
``query_start_loc`` among them (one upload and one launch; those two alone
take one copy when nothing was staged), builds every other input on the
device, and queues the forward pass. ``sample_tokens``
masks the logits of constrained requests with the step's grammar bitmask
(when the plan has any), queues sampling and the copy to the host and
returns an ``AsyncOutput``. Neither call waits for the device.

Speculative decoding (``RunnerConfig.speculative``, k drafts): a decoding
request scheduled for n > 1 tokens verifies n - 1 drafts that the runner
holds on the device (``RequestState.draft_tokens``). Its row feeds the last
sampled token and the drafts, gets n logits rows, and ``sample_tokens``
runs the rejection sampler, then corrects the slot's device count of
computed tokens by the rejected drafts, writes the emitted tokens into
``all_token_ids`` and proposes the next drafts (n-gram, on the device).
The host's counts of decoding rows are then upper bounds; positions, slot
mappings and attention read the device's. Uniform decode batches of 1 + k
tokens a row replay CUDA graphs captured per row count; without drafts,
small batches with prefills replay graphs captured per token count
(``runner.cuda_graphs``).

LoRA (``RunnerConfig.lora``): the plan's ``lora_loads`` are read into
their adapter slots before its requests are added, each new request's
adapter slot is staged with its other state, and the input kernels' step
builds the tokens' adapter mask (``runner.lora``), in the graphs too.
Without it none of this exists and no step does any LoRA work.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ipc import trace
from ipc.config import RunnerConfig
from ipc.errors import InvalidPlanError
from ipc.messages import GrammarBitmask, SchedulerOutput
from runner.async_output import AsyncOutput, NextDrafts
from runner.attention.metadata import AttentionMetadata
from runner.block_table import BlockTables
from runner.cuda_graphs import (
    PREFILL_GRAPH_ROWS,
    CudaGraphManager,
    capture_sizes,
    prefill_capture_sizes,
)
from runner.distributed import TensorParallelGroup
from runner.input_batch import InputBatch, InputBuffers, make_input_batch
from runner.kv_cache import (
    allocate_kv_caches,
    kv_cache_bytes_per_block,
    profile_peak_memory,
)
from runner.loader import fill_random_weights, load_weights
from runner.lora import LoRAAdapters
from runner.models import build_model, build_model_from_config
from runner.ops import device_ops
from runner.plan_check import check_plan
from runner.pooler import PooledOutput, Pooler
from runner.request_state import RequestState
from runner.sampler import Sampler, SamplerOutput
from runner.sampling.custom_processors import CustomLogitsProcessors, build_processors
from runner.sampling.forced_tokens import ForcedTokens
from runner.sampling.prompt_logprobs import PromptLogprobsOutput, PromptLogprobsState
from runner.sleep_mode import SleepingMemory
from runner.spec_decode.draft_model import DraftModelProposer
from runner.spec_decode.drafted_budgets import DraftedBudgets
from runner.spec_decode.rejection import DraftLayout, RejectionSampler
from runner.staged_write_group import StagedWriteGroup
from runner.structured_outputs import GrammarMask, check_grammar_bitmask

# Room for the packed header of a step that adds or extends a few dozen
# requests (runner/staged_write_group.py), beside their tokens.
STAGED_HEADER_BYTES = 16 << 10
# One-token decode graphs of at most this many rows end with the greedy argmax
# of their logits (``_after_forward``); larger ones, and 0 for A/B runs, leave
# it to the sampler after the replay. At one row the step gained on both
# shapes measured; at 8-16 rows it lost on the 8B
# (``benchmarks/results/README.md``).
GREEDY_IN_GRAPH_MAX_ROWS = 1


@dataclass(frozen=True)
class StepTensors:
    """Device tensors of one forward pass that sampling reads: all computed
    on the device (inside the graph on decode). Per batch row:
    ``idx_mapping`` and ``sample_mask``; per logits row (one per batch row
    without drafts): ``logits``, ``positions`` and ``logits_indices`` (the
    token each logits row belongs to)."""

    idx_mapping: torch.Tensor  # int64 slots of the batch rows
    logits: torch.Tensor  # [logits rows, vocab], the model's dtype
    positions: torch.Tensor  # position of the token each logits row samples
    sample_mask: torch.Tensor  # bool: the row is past its prompt and samples
    logits_indices: torch.Tensor  # int64 token of each logits row
    # int64 argmax of each logits row, drawn inside a one-token decode graph
    # and stored at the rows' slots in ``last_sampled_tokens`` (None elsewhere)
    greedy: torch.Tensor | None = None

    def head(self, n: int, num_logits: int) -> StepTensors:
        """The first ``n`` rows and ``num_logits`` logits rows (a padded
        graph step's real ones)."""
        return StepTensors(self.idx_mapping[:n], self.logits[:num_logits],
                           self.positions[:num_logits], self.sample_mask[:n],
                           self.logits_indices[:num_logits],
                           None if self.greedy is None else self.greedy[:num_logits])


@dataclass(frozen=True)
class _GraphChoice:
    """A step replayed from ``graphs[key]``, padded to ``rows`` rows and
    ``tokens`` tokens."""

    graphs: CudaGraphManager
    key: int
    rows: int
    tokens: int


@dataclass
class _PendingStep:
    """What ``execute_model`` leaves for ``sample_tokens``."""

    step_id: int
    batch: InputBatch
    tensors: StepTensors | None
    structured_output_req_ids: list[str] = field(default_factory=list)
    prompt_logprobs: PromptLogprobsOutput | None = None
    pooled: PooledOutput | None = None  # a pooling runner's step

    @property
    def last_logits_row(self) -> np.ndarray:
        """Host [num_reqs]: the last logits row of each batch row (the row a
        one-token grammar mask applies to); the identity without drafts."""
        return self.batch.cu_num_logits_np[1 : self.batch.num_reqs + 1] - 1


def _load_model(config: RunnerConfig, device: torch.device, tp: TensorParallelGroup):
    """The model ``config.model_config`` describes: random weights for
    ``load_format="dummy"``, else ``config.model``'s; with LoRA, its norms
    unfolded."""
    dtype = getattr(torch, config.dtype)
    fold = config.lora is None  # LoRA's A reads the normed input (build_model_from_config)
    classify = config.pooling_task == "classify"
    if config.load_format == "dummy":
        return build_model_from_config(config.model_config, dtype, device, tp,
                                       config.attention_backend, init="random", seed=config.seed,
                                       max_positions=config.max_model_len, fold_norms=fold,
                                       classify=classify)
    return build_model(config.model_config, config.model, dtype, device, tp,
                       config.attention_backend, max_positions=config.max_model_len,
                       fold_norms=fold, classify=classify)


class ModelRunner:
    def __init__(self, config: RunnerConfig, device: torch.device, tp: TensorParallelGroup):
        self.config = config
        self.device = device
        self.ops = device_ops(device)
        self.tp = tp.with_peer_buffers(device) if not config.disable_custom_all_reduce else tp
        # Built before the weights load: a processor that fails fails fast.
        processors = build_processors(config, device, not self.ops.shares_host_memory)
        self.model = _load_model(config, device, self.tp)
        self.dtype = next(self.model.parameters()).dtype
        n = config.max_num_seqs
        self.num_spec = k = config.num_speculative_tokens
        self.req_states = RequestState(n, config.max_model_len, device, k)
        vocab = self.model.config.vocab_size
        # None without custom logits processors (``EngineConfig`` refuses them
        # with speculative decoding): then a step checks this and no more.
        self.custom_logits = (CustomLogitsProcessors(processors, n, vocab, device)
                              if processors else None)
        self.sampler = Sampler(n, vocab, device, config.seed, self.custom_logits)
        self.rejection = RejectionSampler(self.sampler, k) if k else None
        self.draft = None
        if k and config.speculative.method == "draft_model":
            spec = config.speculative
            # Rotary tables for every position the target's steps feed
            # (DraftModelProposer: where the draft model runs).
            draft_model = build_model(spec.draft_model_config, spec.model, self.dtype, device,
                                      self.tp, config.attention_backend,
                                      max_positions=config.max_model_len)
            self.draft = DraftModelProposer(draft_model, config.block_size, self.dtype, device,
                                            self.ops.shares_host_memory,
                                            self.ops.new_transfer(), spec.draft_max_model_len)
        self.prompt_logprobs = PromptLogprobsState(n, device)
        # None without LoRA serving: then no step does any LoRA work.
        self.lora = (LoRAAdapters(config.lora, config.model_config, self.model, n,
                                  config.max_num_batched_tokens, device)
                     if config.lora is not None else None)
        self.block_tables = BlockTables(
            config.block_size,
            n,
            config.max_num_blocks_per_req,
            config.max_num_batched_tokens,
            device,
        )
        # One upload and one launch apply the step's staged writes to all of
        # them; room for a full token budget of prompts is pinned up front.
        self.staged_writes = StagedWriteGroup([*self.req_states.staged_tensors,
                                               *self.sampler.staged_tensors,
                                               *self.block_tables.staged_tensors,
                                               *(self.lora.staged_tensors if self.lora else ())],
                                              reserve_bytes=STAGED_HEADER_BYTES
                                              + 4 * config.max_num_batched_tokens)
        self.buffers = InputBuffers(n, config.max_num_batched_tokens, device)
        self.grammar_mask = GrammarMask(n, self.model.config.vocab_size, device, self.ops,
                                        width=1 + self.num_spec)
        self.output_transfer = self.ops.new_transfer()
        self.kv_caches: list[torch.Tensor] = []
        self.num_blocks = 0
        self.pending: _PendingStep | None = None
        # Sleep mode (``runner.sleep_mode``): what the last sleep freed and
        # which of it is still asleep; None: never slept.
        self.sleeping: SleepingMemory | None = None
        # A pooling runner (None: a generating one) runs prompts only, eagerly.
        self.pooler = (None if config.pooling_type is None
                       else Pooler(config.pooling_type, self.model.score))
        use_graphs = (self.ops.cuda_graphs and not config.enforce_eager
                      and self.pooler is None)
        # Graph sizes count rows; a row of a speculative decode has 1 + k
        # tokens. Where the scheduler turns drafting off above a batch size,
        # one-token decode graphs are captured too (``plain_graphs``).
        max_rows = config.max_num_batched_tokens // (1 + k)
        cap = config.max_cudagraph_capture_size
        sizes = capture_sizes(n, max_rows, cap) if use_graphs and max_rows else []
        self.graphs = CudaGraphManager(sizes)
        plain = use_graphs and k and config.speculative.disable_by_batch_size is not None
        self.plain_graphs = CudaGraphManager(
            capture_sizes(n, config.max_num_batched_tokens, cap) if plain else [])
        # Mixed batches of at most ``prefill_rows`` rows, by token count; not
        # with drafts (their rows' logits layout varies).
        backend = self.model.layers[0].self_attn.backend
        prefill = (use_graphs and not k
                   and getattr(backend, "captures_mixed_batches", False))
        self.prefill_rows = min(n, PREFILL_GRAPH_ROWS)
        sizes = prefill_capture_sizes(config.max_prefill_cudagraph_tokens,
                                      config.max_num_batched_tokens) if prefill else []
        self.prefill_graphs = CudaGraphManager(sizes) if sizes else None

    # ---- KV cache -------------------------------------------------------
    def bytes_per_block(self) -> int:
        """KV bytes of one block on this rank (the draft model's included)."""
        size = kv_cache_bytes_per_block(self.model, self.config.block_size, self.dtype)
        if self.draft is not None:
            size += kv_cache_bytes_per_block(self.draft.model, self.config.block_size,
                                             self.dtype)
        return size

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
        # Graphs hold their largest batch's activations and float32 logits
        # (1 + k logits rows a request with k drafts).
        q = 1 + self.num_spec
        graph_logits = 6 * q * max(self.graphs.sizes, default=0) * self.model.config.vocab_size
        graph_reserve = (256 << 20) + graph_logits if self.graphs.sizes else 0
        graph_reserve += self._prefill_graph_bytes()
        # Filters, penalties and logprobs hold about ten float32 copies of the
        # batch's logits at their peak; the profile run does not sample.
        sampler_reserve = 10 * 4 * q * self.config.max_num_seqs * self.model.config.vocab_size
        budget = int(total * self.config.gpu_memory_utilization)
        budget -= held_by_others + peak + graph_reserve + sampler_reserve
        return max(0, budget // per_block)

    def _prefill_graph_bytes(self) -> int:
        """About what the mixed-batch graphs' pool holds: the activations of
        their largest token count (the MLP's gate_up output and a few hidden
        and qkv rows, twice over) and float32 logits of their rows."""
        if self.prefill_graphs is None:
            return 0
        c, tokens = self.model.config, max(self.prefill_graphs.sizes)
        width = 2 * c.intermediate_size + 4 * c.hidden_size + 3 * c.num_attention_heads * c.head_dim
        elem = torch.finfo(self.dtype).bits // 8
        return 2 * tokens * width * elem + 2 * 4 * self.prefill_rows * c.vocab_size

    def init_kv_cache(self, num_blocks: int) -> None:
        """Allocate the cache, then capture the decode graphs (they read it)."""
        self.kv_caches = allocate_kv_caches(
            self.model, num_blocks, self.config.block_size, self.dtype, self.device
        )
        self.num_blocks = num_blocks
        if self.draft is not None:
            self.draft.init_kv_cache(num_blocks)
        self.capture_graphs()

    def capture_graphs(self) -> None:
        """Capture the decode and mixed-batch graphs, in place of any captured
        before: once the cache exists, and again where the kernels a forward
        launches have been switched (``bench_decode.py --variants``). Between
        steps only: no step may be in flight."""
        for graphs, q in ((self.graphs, 1 + self.num_spec), (self.plain_graphs, 1)):
            if graphs.sizes:
                graphs.capture(self._fill_graph_inputs,
                               lambda size, q=q: self._graph_forward(size, q),
                               show_progress=self.tp.rank == 0)
        if self.prefill_graphs is not None:
            self.prefill_graphs.capture(lambda _: self._fill_graph_inputs(self.prefill_rows),
                                        self._prefill_graph_forward,
                                        show_progress=self.tp.rank == 0)

    # ---- sleep mode -----------------------------------------------------
    @property
    def is_sleeping(self) -> bool:
        """Some memory freed by ``sleep`` is not back yet."""
        return self.sleeping is not None and bool(self.sleeping.asleep)

    def sleep(self, level: int = 1) -> None:
        """Free the weights (level 1: kept on the host; level 2: discarded,
        read again from the checkpoint on waking) and the KV cache, after
        dropping the graphs that read them. Between steps only; the engine
        holds no request whose cache it needs (``LLMEngine.sleep``)."""
        if self.is_sleeping:
            raise RuntimeError("the runner is asleep already (wake_up first)")
        if self.pending is not None:
            raise RuntimeError("sleep called with a step not sampled")
        graphs = [self.graphs, self.plain_graphs, self.prefill_graphs]
        for manager in graphs:
            if manager is not None:
                manager.drop()
        models = [self.model] + ([self.draft.model] if self.draft is not None else [])
        caches = self.kv_caches + (self.draft.kv_caches if self.draft is not None else [])
        self.sleeping = SleepingMemory(level, models, caches, not self.ops.shares_host_memory,
                                       self._reload_weights)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Restore what ``sleep`` freed, the parts ``tags`` name (None: all);
        once all is back, capture the graphs again (the tensors moved)."""
        if self.sleeping is None:
            return
        was_asleep = self.is_sleeping
        self.sleeping.wake(tags)
        if was_asleep and not self.is_sleeping:
            self.capture_graphs()

    def memory_bytes(self) -> dict[str, int]:
        """Device bytes held now by the weights (parameters and buffers, the
        draft model's too; a shared storage once) and by the KV cache: 0
        for what sleep freed."""
        models = [self.model] + ([self.draft.model] if self.draft is not None else [])
        caches = self.kv_caches + (self.draft.kv_caches if self.draft is not None else [])
        weights = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                   for m in models for t in (*m.parameters(), *m.buffers())}
        return {"weights": sum(weights.values()),
                "kv_cache": sum(t.untyped_storage().nbytes() for t in caches)}

    def _reload_weights(self) -> None:
        """Level 2's waking: the parameters (restored, uninitialized) read
        from the checkpoint as at start (random ones for
        ``load_format="dummy"``, from the same seed), their norms folded
        as then. Zeroed first: the restored memory is the allocator's, and
        the rows that pad the vocabulary are in no checkpoint (zero at start)."""
        pairs = [(self.model, self.config.model, self.config.lora is None)]
        if self.draft is not None:
            pairs.append((self.draft.model, self.config.speculative.model, True))
        for model, model_dir, fold in pairs:
            for param in model.parameters():
                param.zero_()
            if self.config.load_format == "dummy" and model is self.model:
                fill_random_weights(model, self.config.seed)
            else:
                load_weights(model, model_dir)
            if fold:
                model.norms_folded = False  # the loaded weights are the checkpoint's
                model.fold_norm_weights()

    def _fill_graph_inputs(self, size: int) -> None:
        """Harmless step inputs for warming up and capturing a graph: every
        row maps to the padding slot and has no token, so nothing is written
        to the KV cache. Runs before capture, never inside a graph."""
        self.buffers.fill_for_capture(size, self.req_states.pad_slot)

    @torch.no_grad()
    def _graph_forward(self, size: int, q: int = 1) -> StepTensors:
        """One step of ``size`` padded rows of ``q`` tokens each (1 + k with
        k drafts, else 1), from the step's only
        copied inputs (``idx_mapping``, ``query_start_loc``, and
        ``cu_num_logits`` with drafts) to the sampler's inputs: the input
        kernels, the model and the logits of every token, all in the graph.
        Rows past the batch map to the padding slot (seq_len 0, no KV write;
        their seq_len 0 is what the padding slot's count already is)."""
        tokens = size * q
        hidden, attn = self._captured_model(
            size, tokens, max_query_len=q, num_decodes=size if q == 1 else 0,
            num_draft_rows=size if q > 1 else 0,
            query_start_loc_cpu=torch.arange(0, tokens + 1, q, dtype=torch.int32),
            seq_lens_cpu=torch.full((size,), q, dtype=torch.int32))
        if self.draft is not None:
            ids, positions = self.buffers.input_ids[:tokens], self.buffers.positions[:tokens]
            self.draft.forward_step(ids, positions, attn)
        greedy = (not self.num_spec and size <= GREEDY_IN_GRAPH_MAX_ROWS
                  and not self.sampler.custom_may_change_argmax)
        return self._after_forward(hidden, size, tokens, every_token=True, greedy=greedy)

    @torch.no_grad()
    def _prefill_graph_forward(self, tokens: int) -> StepTensors:
        """One mixed step of ``prefill_rows`` padded rows and ``tokens``
        padded tokens: the input kernels (prefill included), the model and
        one logits row a row. Captured with prefill tiles and no KV split
        (``max_query_len`` above any decode's), which serve every batch
        that fits: rows past the batch own no token (seq_len 0), tokens past
        the batch's belong to no row (slot -1, attention output zero)."""
        rows = self.prefill_rows
        hidden, _ = self._captured_model(
            rows, tokens, max_query_len=tokens, num_decodes=0, num_draft_rows=0,
            query_start_loc_cpu=torch.zeros(rows + 1, dtype=torch.int32),
            seq_lens_cpu=torch.zeros(rows, dtype=torch.int32))
        return self._after_forward(hidden, rows, rows, every_token=False)

    def _captured_model(self, rows: int, tokens: int, *, max_query_len: int, num_decodes: int,
                        num_draft_rows: int, query_start_loc_cpu: torch.Tensor,
                        seq_lens_cpu: torch.Tensor) -> tuple[torch.Tensor, AttentionMetadata]:
        """What both kinds of graph hold before their logits: the input
        kernels over ``rows`` rows and ``tokens`` tokens (tokens of no row
        get slot -1) and the model. The host copies given are placeholders
        that fix the attention's launch shape; only the CPU reference
        backend (emulated graphs) reads host copies, and there the buffers
        themselves are host memory, so those are used instead."""
        buf = self.buffers
        block_tables, slot_mapping = self._build_inputs(
            num_reqs=rows, num_tokens=tokens, num_reqs_padded=rows, num_tokens_padded=tokens,
            has_prefill=True)
        if self.ops.shares_host_memory:
            query_start_loc_cpu, seq_lens_cpu = buf.query_start_loc[: rows + 1], buf.seq_lens[:rows]
        attn = AttentionMetadata(
            num_reqs=rows, num_tokens=tokens, num_decodes=num_decodes,
            max_query_len=max_query_len, max_seq_len=self.config.max_model_len,
            query_start_loc=buf.query_start_loc[: rows + 1], seq_lens=buf.seq_lens[:rows],
            block_tables=block_tables, slot_mapping=slot_mapping,
            query_start_loc_cpu=query_start_loc_cpu, seq_lens_cpu=seq_lens_cpu,
            num_draft_rows=num_draft_rows,
        )
        return self.model(buf.input_ids[:tokens], buf.positions[:tokens], self.kv_caches, attn), attn

    # ---- applying the plan ---------------------------------------------
    def _update_states(self, plan: SchedulerOutput,
                       prefill_ids: list[np.ndarray] | None = None) -> None:
        """Apply the checked plan to the host state and stage its device
        writes (``_write_step`` applies them); ``prefill_ids``: the new
        requests' prefill tokens as ``check_plan`` converted them."""
        # Finished and preempted requests leave alike, in sorted order, so
        # every rank frees (and later reuses) the same slots.
        custom = self.custom_logits
        for req_id in sorted(set(plan.finished_req_ids) | set(plan.preempted_req_ids)):
            if req_id in self.req_states.req_id_to_index:
                slot = self.req_states.remove_request(req_id)
                self.sampler.remove_request(slot)
                if custom is not None:
                    custom.remove_request(slot)
        for new, ids in zip(plan.scheduled_new_reqs,
                            prefill_ids or [None] * len(plan.scheduled_new_reqs)):
            slot = self.req_states.add_request(new, ids)
            if custom is not None:
                custom.add_request(slot, new)
            self.sampler.add_request(
                slot, new.sampling, len(new.prompt_token_ids), len(new.prefill_token_ids),
                new.min_tokens_stop_ids,
            )
            self.block_tables.add_request(slot, new.block_ids[0])
            self.prompt_logprobs.add_request(slot, new.sampling.prompt_logprobs)
            if self.lora is not None:
                self.lora.add_request(slot, new.lora_slot)
        cached = plan.scheduled_cached_reqs
        index = self.req_states.req_id_to_index
        # With speculative decoding the plan carries the scheduler's counts:
        # upper bounds, kept on the host (the device counts are the truth,
        # corrected on the device when drafts are rejected).
        counts = cached.num_computed_tokens if self.num_spec else None
        if counts is not None:
            slots = np.fromiter(map(index.__getitem__, cached.req_ids), dtype=np.int64,
                                count=len(cached.req_ids))
            self.req_states.num_computed_tokens_np[slots] = counts
        if any(cached.new_block_ids):  # the runner counts computed tokens itself
            for req_id, blocks in zip(cached.req_ids, cached.new_block_ids):
                if blocks:
                    self.block_tables.append_blocks(index[req_id], blocks[0])

    def _write_step(self, batch: InputBatch | None) -> None:
        """What reaches the device before the forward pass: the staged
        writes and, for a batch with tokens, the step's input meta
        (``InputBuffers.stage_step_meta``), in one upload and one launch;
        the meta alone where nothing was staged takes its one copy, and
        none where the device holds it already (a decode batch whose rows
        did not change). Then what is left: the penalty rows, rebuilt from
        the written prompts, and the min-tokens stop ids."""
        buf = self.buffers
        meta = None
        if batch is not None and batch.num_tokens:
            meta = buf.stage_step_meta(
                batch.idx_mapping_np, batch.query_start_loc_np, self.req_states.pad_slot,
                batch.cu_num_logits_np if self.num_spec else None)
            if buf.holds_step_meta(meta):
                meta = None
        extra = None if meta is None else (buf.step_meta_target, meta)
        if self.staged_writes.apply_writes(extra):
            if meta is not None:
                buf.step_meta_written(meta)
        elif meta is not None:
            buf.copy_staged_meta(meta)
        self.sampler.write_added_rows(self.req_states.all_token_ids.gpu)

    # ---- the step -------------------------------------------------------
    @torch.no_grad()
    def execute_model(self, plan: SchedulerOutput) -> None:
        """Apply the plan and queue the forward pass; never waits."""
        if self.is_sleeping:
            raise InvalidPlanError(f"step {plan.step_id}: the runner is asleep "
                                   f"({sorted(self.sleeping.asleep)} not woken up)")
        prefill_ids = check_plan(plan, self.req_states, self.block_tables, self.num_blocks,
                                 self.config.max_num_batched_tokens,
                                 self.model.config.vocab_size, self.num_spec,
                                 self.config.lora)
        for load in plan.lora_loads:  # before the requests that use them are added
            self.lora.load(load.slot, load.lora_path)
        self._update_states(plan, prefill_ids)
        if self.custom_logits is not None:
            self.custom_logits.update_state()
        graph = self._graph_for(plan)
        batch = make_input_batch(
            plan.scheduled_req_ids(),
            plan.num_scheduled_tokens,
            self.req_states.req_id_to_index,
            self.req_states.num_computed_tokens_np,
            self.req_states.prefill_len_np,
            num_reqs_padded=None if graph is None else graph.rows,
            num_tokens_padded=None if graph is None else graph.tokens,
            decode_query_len=1 + self.num_spec,
        )
        self._write_step(batch)
        constrained = list(plan.structured_output_req_ids)
        if batch.num_tokens == 0:
            self.pending = _PendingStep(plan.step_id, batch, None, constrained)
            return
        prompt_logprobs = None
        if trace.enabled:
            trace.mark("worker_forward_start", plan.step_id)
        if graph is not None:
            tensors = graph.graphs.replay(graph.key).head(batch.num_reqs, batch.num_logits)
        else:
            input_ids, positions, attn = self._prepare_inputs(batch)
            hidden = self.model(input_ids, positions, self.kv_caches, attn)
            if self.pooler is not None:
                self.pending = self._pool(plan.step_id, batch, hidden)
                return
            if self.draft is not None:
                self.draft.forward_step(input_ids, positions, attn)
            tensors = self._after_forward(hidden, batch.num_reqs, batch.num_logits,
                                          every_token=False)
            prompt_logprobs = self._prompt_logprobs(hidden, batch)
        if trace.enabled:
            trace.mark("worker_forward_queued", plan.step_id)
        self.req_states.num_computed_tokens_np[batch.idx_mapping_np] = batch.seq_lens_np
        self.pending = _PendingStep(plan.step_id, batch, tensors, constrained,
                                    prompt_logprobs=prompt_logprobs)

    def _pool(self, step_id: int, batch: InputBatch, hidden: torch.Tensor) -> _PendingStep:
        """A pooling runner's step after the model: the step's tokens
        counted as computed (on the device, as ``_after_forward`` counts
        them; no logits), the rows whose prompt ends here pooled, a
        token-level request's tokens of this step taken, and their copy to
        the host started (``runner.pooler``)."""
        buf, states = self.buffers, self.req_states
        self.ops.finish_step_rows(buf.idx_mapping, buf.seq_lens, buf.positions,
                                  buf.logits_indices[:batch.num_logits], states.prefill_len.gpu,
                                  states.num_computed_tokens.gpu, batch.num_reqs)
        states.num_computed_tokens_np[batch.idx_mapping_np] = batch.seq_lens_np
        spans, rows = self.pooler(hidden, batch, states.prefill_len_np, states.pools_tokens_np,
                                  buf.query_start_loc)
        output = PooledOutput(step_id, batch.num_reqs, spans, rows, self.output_transfer)
        return _PendingStep(step_id, batch, None, pooled=output)

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

    def _after_forward(self, hidden: torch.Tensor, n: int, num_logits: int,
                       every_token: bool, greedy: bool = False) -> StepTensors:
        """Device work between the model and the sampler for batch rows
        ``[0, n)``: logits of each logits row's token (``logits_indices``:
        each row's last token, every token of a row with drafts), and the
        step's tokens counted as computed on the device (seq_lens copied
        into the slots, so no staged write is needed next step; rejected
        drafts are taken off in ``sample_tokens``). With ``every_token``
        (decode graphs, ``num_logits`` their tokens) logits row l is token l
        and no gather is needed. The bookkeeping is one ``finish_step_rows``
        (one launch on CUDA).

        With ``greedy`` (small one-token decode graphs without drafting)
        the argmax of every logits row is drawn here too and stored at the rows'
        slots in ``last_sampled_tokens``, so a greedy step's draw is inside
        the graph: no launch after the replay and no boundary between the
        LM head and the argmax. A step that draws otherwise (sampling
        parameters, a grammar mask applied after the replay) ignores these
        tokens, and its own draw stores its tokens at the same slots after
        them."""
        buf, states = self.buffers, self.req_states
        if every_token:
            rows = buf.every_token[:num_logits]
            selected = hidden[:num_logits]
        else:
            rows = buf.logits_indices[:num_logits]
            selected = hidden[rows]
        idx, positions, sample_mask = self.ops.finish_step_rows(
            buf.idx_mapping, buf.seq_lens, buf.positions, rows, states.prefill_len.gpu,
            states.num_computed_tokens.gpu, n)
        # Logits in the model's dtype: the sampler casts where it computes
        # (penalties, filters, logprobs); an argmax needs no float32 copy.
        logits = self.model.compute_logits(selected, dtype=None)
        tokens = (self.ops.greedy_argmax(logits, idx, states.last_sampled_tokens)
                  if greedy else None)
        return StepTensors(idx, logits, positions, sample_mask, rows, tokens)

    def _graph_for(self, plan: SchedulerOutput) -> _GraphChoice | None:
        """The captured graph that runs this plan, or None: eager.

        A uniform decode batch (every row 1 + k tokens, k drafts; or one
        token where drafting is off) pads its rows to a decode graph; any
        other batch of at most ``prefill_rows`` rows pads its tokens to a
        mixed-batch graph. Steps that score prompt tokens run eagerly (the
        graphs keep no hidden states)."""
        counts = plan.num_scheduled_tokens
        if not counts:
            return None
        states = self.req_states
        if self.prompt_logprobs.needs_eager(plan.scheduled_req_ids(), states.req_id_to_index,
                                            states.num_computed_tokens_np,
                                            states.prompt_len_np):
            return None
        q = counts[0]
        graphs = self.graphs if q == 1 + self.num_spec else (
            self.plain_graphs if q == 1 else None)
        uniform = graphs is not None and graphs.graphs and counts.count(q) == len(counts)
        if uniform and self.num_spec:
            slots = [states.req_id_to_index[r] for r in plan.scheduled_req_ids()]
            # prefill chunks of exactly q tokens are no decode
            uniform = not np.any(states.num_computed_tokens_np[slots]
                                 < states.prefill_len_np[slots])
        if uniform:
            size = graphs.padded_size(len(counts))
            if size is not None:
                return _GraphChoice(graphs, size, size, size * q)
        if (self.prefill_graphs is not None and self.prefill_graphs.graphs
                and len(counts) <= self.prefill_rows):
            tokens = self.prefill_graphs.padded_size(sum(counts))
            if tokens is not None:
                return _GraphChoice(self.prefill_graphs, tokens, self.prefill_rows, tokens)
        return None

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
        if self.num_spec:
            self.ops.combine_draft_tokens(
                buf.input_ids, idx_mapping, states.last_sampled_tokens, states.draft_tokens, qsl,
                buf.cu_num_logits[: n_padded + 1], buf.seq_lens, prefill_len,
                buf.logits_indices, n)
        else:
            self.ops.combine_sampled_tokens(buf.input_ids, idx_mapping,
                                            states.last_sampled_tokens, qsl, buf.seq_lens,
                                            prefill_len, buf.logits_indices, n)
        if self.lora is not None:
            self.lora.prepare_tokens(idx_mapping, qsl, n, t_padded)
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
        seq_lens_cpu = torch.from_numpy(batch.seq_lens_np)
        if self.num_spec and self.ops.shares_host_memory:
            # Decoding rows' host counts are upper bounds; where the device
            # is host memory its exact seq_lens cost nothing to read.
            seq_lens_cpu = buf.seq_lens[:n]
        attn = AttentionMetadata(
            num_reqs=n,
            num_tokens=t,
            num_decodes=batch.num_decodes,
            max_query_len=int(batch.num_scheduled_np.max()),
            max_seq_len=int(seq_lens_cpu.max()),
            query_start_loc=buf.query_start_loc[: batch.num_reqs_padded + 1],
            seq_lens=buf.seq_lens[: batch.num_reqs_padded],
            block_tables=block_tables,
            slot_mapping=slot_mapping,
            query_start_loc_cpu=torch.from_numpy(batch.query_start_loc_np),
            seq_lens_cpu=seq_lens_cpu,
            num_draft_rows=batch.num_draft_rows,
        )
        t_pad = batch.num_tokens_padded
        return buf.input_ids[:t_pad], buf.positions[:t_pad], attn

    @torch.no_grad()
    def sample_tokens(self, grammar: GrammarBitmask | None = None) -> AsyncOutput:
        """Mask the constrained rows' logits with ``grammar`` (the step's
        bitmask; None for a step without constrained requests), queue
        sampling and the copy to the host; never waits. A bitmask that does
        not fit the step raises ``InvalidPlanError`` and drops the step
        (its forward pass ran; nothing is sampled)."""
        step, self.pending = self.pending, None
        if step is None:
            raise RuntimeError("sample_tokens called without execute_model")
        check_grammar_bitmask(grammar, step.step_id, step.structured_output_req_ids,
                              self.model.config.vocab_size)
        if step.pooled is not None:
            return step.pooled
        batch = step.batch
        if step.tensors is None:
            empty = SamplerOutput.empty(self.device)
            return AsyncOutput(step.step_id, batch.plan_order, batch.sample_mask_np, empty,
                               self.output_transfer)
        t = step.tensors
        forced = budgets = None
        if grammar is not None:
            num_logits = batch.num_logits_np if self.num_spec else None
            forced, budgets = self.grammar_mask.apply(t.logits, grammar, batch.req_ids,
                                                      step.last_logits_row, num_logits)
        if self.num_spec:
            return self._sample_with_drafts(step, forced, budgets,
                                            grammar.draft_req_ids if grammar else [])
        # The graph's argmax is of the logits before the grammar mask.
        greedy = t.greedy if grammar is None else None
        out = self.sampler(t.logits, t.idx_mapping, batch.idx_mapping_np, t.positions,
                           t.sample_mask, last_tokens=self.req_states.last_sampled_tokens,
                           greedy=greedy, forced=forced)
        return AsyncOutput(
            step.step_id, batch.plan_order, batch.sample_mask_np, out, self.output_transfer,
            prompt_logprobs=step.prompt_logprobs,
        )

    def _sample_with_drafts(self, step: _PendingStep, forced: ForcedTokens | None = None,
                            budgets: DraftedBudgets | None = None,
                            draft_req_ids: list[str] | None = None) -> AsyncOutput:
        """The rejection sampler, then the device state it changes: the last
        emitted token, the computed count less the rejected drafts, the
        emitted tokens in ``all_token_ids``; then the next drafts, those of
        ``draft_req_ids`` (requests with a grammar) copied to the host with
        the step's tokens."""
        batch, t, buf, states = step.batch, step.tensors, self.buffers, self.req_states
        n, num_logits = batch.num_reqs, batch.num_logits
        layout = DraftLayout.build(buf.cu_num_logits, n, num_logits, 1 + self.num_spec)
        last_token = buf.input_ids.shape[0] - 1
        drafts = buf.input_ids[(t.logits_indices + 1).clamp(max=last_token)].to(torch.int64)
        out = self.rejection(t.logits, drafts, layout, t.idx_mapping, batch.idx_mapping_np,
                             batch.num_logits_np, t.positions, t.sample_mask, forced,
                             budgets)
        idx = t.idx_mapping
        cu = buf.cu_num_logits[: n + 1].to(torch.int64)
        rejected = (cu[1:] - cu[:-1] - 1 - out.num_accepted).to(torch.int32)
        computed = states.num_computed_tokens.gpu
        computed.index_copy_(0, idx, computed[idx] - rejected)
        states.last_sampled_tokens.index_copy_(0, idx, out.last)
        self._write_emitted(t, layout, out.num_accepted, out.targets)
        if self.draft is not None:
            self.draft.propose(self.block_tables.batch_block_table[:n], idx, computed, out.last,
                               states.draft_tokens,
                               self.block_tables.num_blocks_np[batch.idx_mapping_np],
                               int(batch.seq_lens_np.max()))
        else:
            spec = self.config.speculative
            self.ops.ngram_propose(states.all_token_ids.gpu, buf.idx_mapping, computed,
                                   states.draft_tokens, n, spec.prompt_lookup_min,
                                   spec.prompt_lookup_max)
        next_drafts = None
        if draft_req_ids:
            rows = {req_id: i for i, req_id in enumerate(batch.req_ids)}
            # The whole batch's rows, gathered on the device (no upload).
            next_drafts = NextDrafts(list(draft_req_ids),
                                     np.array([rows[r] for r in draft_req_ids]),
                                     states.draft_tokens.index_select(0, idx))
        return AsyncOutput(step.step_id, batch.plan_order, batch.sample_mask_np,
                           out.sampler_output, self.output_transfer,
                           tokens=out.tokens, num_accepted=out.num_accepted,
                           cu_num_logits=batch.cu_num_logits_np[: n + 1],
                           prompt_logprobs=step.prompt_logprobs, next_drafts=next_drafts)

    def _write_emitted(self, t: StepTensors, layout: DraftLayout, num_accepted: torch.Tensor,
                       targets: torch.Tensor) -> None:
        """all_token_ids[slot, position] = each emitted token (the proposer's
        history); tokens not emitted, or past the table, go to the padding
        slot's row, which no request reads."""
        table = self.req_states.all_token_ids.gpu
        emitted = layout.offset <= num_accepted[layout.row_of]
        emitted &= t.sample_mask[layout.row_of] & (t.positions < table.shape[1])
        slots = torch.where(emitted, t.idx_mapping[layout.row_of], self.req_states.pad_slot)
        cols = torch.where(emitted, t.positions, 0)
        table.index_put_((slots, cols), targets.to(table.dtype))
