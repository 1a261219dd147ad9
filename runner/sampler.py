"""The sampler: every batch row sampled on the device, without a host sync.

One call, for logits [N, V] of a batch whose row i belongs to slot
``idx_mapping[i]``:

1. ``allowed_token_ids`` and ``logit_bias`` (``runner.sampling.logit_bias``),
   ``bad_words`` (sequences whose last token is banned where the outputs so
   far end with the rest; ``runner.sampling.bad_words``), ``min_tokens``
   (stop ids at -inf for rows not yet past it; ``runner.sampling.min_tokens``),
   custom logits processors that may change an argmax
   (``runner.sampling.custom_processors``), penalties (repetition over
   prompt + output, presence and frequency over output;
   ``runner.sampling.penalties``), then the step's forced tokens (a spent
   thinking budget's end of the reasoning: the row keeps that token alone
   whatever step 1's masks left; ``runner.sampling.forced_tokens``), on the
   sampler's copy, never on the raw logits that step 4 reads. vLLM's order:
   its built-in min-tokens and logit-bias processors run before the custom
   ones, so those see the masks (the masks and the biases commute with each
   other and with the penalties, which keep -inf);
2. greedy rows (temperature 0) take the argmax of the penalised logits;
3. the other rows divide by their temperature, then min-p, top-k, top-p
   (``runner.sampling.filters``) and draw with stateless Gumbel noise, a hash
   of (seed, position, token id) (``runner.sampling.noise``); argmax-invariant
   custom processors run, in a batch that samples at a temperature only,
   on the divided rows after min-p and before top-k (vLLM's order, min-p
   being its first such processor; ``_draw_with_invariant``);
4. logprobs of the raw logits, if any row asked (``runner.sampling.logprobs``),
   a row's ``logprob_token_ids`` in place of its top ones
   (``runner.sampling.logprob_token_ids``): a forced token reports the
   model's own logprob, as any token that step 1 favoured does;
5. each real sample adds to its slot's output-token counts (penalties) and
   to its slot's recent outputs (bad words).

Steps 2-3 are one kernel launch, two with filters: the filters become one
threshold a row on the raw logits (``filter_thresholds``, found without a
sort), and the draw reads each row's temperature and seed at its slot (the
per-slot tables themselves, no gather), masks the logits below the
threshold, divides, adds the noise, and stores the token at the slot for
the next step's input. A batch that samples at a temperature, and nothing
else, thus costs one launch, as a greedy batch does.

Rows never influence each other: a seeded request draws the same tokens
alone or in any batch, and every tensor-parallel rank draws the same token.
Flags such as "any row uses top-k" come from host mirrors of the per-slot
parameters (``runner.sampling.states``), never from the device; a filter no
row needs is skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ipc.messages import SamplingOptions
from runner.ops import device_ops
from runner.sampling.bad_words import BadWordsState
from runner.sampling.custom_processors import CustomLogitsProcessors
from runner.sampling.filters import apply_min_p, scale_by_temperature
from runner.sampling.forced_tokens import ForcedTokens
from runner.sampling.logit_bias import LogitBiasState
from runner.sampling.logprob_token_ids import LogprobTokenIdsState
from runner.sampling.logprobs import LogprobsTensors
from runner.sampling.min_tokens import MinTokensState
from runner.sampling.noise import token_keys
from runner.sampling.penalties import PenaltyState
from runner.sampling.states import NO_LOGPROBS, BatchFlags, SamplingStates
from runner.staged_write import StagedWriteTensor


@dataclass(frozen=True)
class SamplerOutput:
    """Device tensors of one batch, and what the host needs to read them.

    ``num_logprobs[i]`` (host) is how many top logprobs row i's request
    asked for, ``NO_LOGPROBS`` (-1) for none; ``logprobs`` is None when no
    row asked.
    """

    sampled_token_ids: torch.Tensor  # [N] int64
    logprobs: LogprobsTensors | None
    num_logprobs: np.ndarray  # [N] int32

    @staticmethod
    def empty(device: torch.device) -> SamplerOutput:
        tokens = torch.zeros(0, dtype=torch.int64, device=device)
        return SamplerOutput(tokens, None, np.zeros(0, dtype=np.int32))


@dataclass(frozen=True)
class TargetDraw:
    """``Sampler.draw``'s result: the drawn tokens [N] (int64), the raw
    logits for logprobs (the model's, in its dtype; None unless some row
    asked), the rows' slots (int64), the batch's flags, whether a row
    has bad words (then the caller records the real samples:
    ``BadWordsState.record_sampled``) and whether a row asks for
    ``logprob_token_ids``."""

    sampled: torch.Tensor
    raw: torch.Tensor | None
    idx: torch.Tensor
    flags: BatchFlags
    any_bad_words: bool = False
    any_logprob_token_ids: bool = False


class Sampler:
    def __init__(self, max_num_reqs: int, vocab_size: int, device: torch.device, seed: int,
                 custom: CustomLogitsProcessors | None = None):
        self.vocab_size = vocab_size
        self.ops = device_ops(device)
        self.states = SamplingStates(max_num_reqs, device, seed)
        self.penalties = PenaltyState(max_num_reqs, vocab_size, device)
        self.min_tokens = MinTokensState(max_num_reqs, device)
        self.logit_bias = LogitBiasState(max_num_reqs, device)
        self.bad_words = BadWordsState(max_num_reqs, device)
        self.logprob_token_ids = LogprobTokenIdsState(max_num_reqs, device)
        self.token_keys = token_keys(vocab_size, device)
        # None without custom processors: then the one check a step costs.
        self.custom = custom
        self.custom_may_change_argmax = custom is not None and custom.may_change_argmax

    def add_request(
        self, slot: int, options: SamplingOptions, prompt_len: int, prefill_len: int,
        min_tokens_stop_ids: Sequence[int] = (),
    ) -> None:
        """Stage a new request's parameters; its prefill tokens past ``prompt_len``
        (outputs before a preemption) count as output tokens for penalties
        and bad words; ``min_tokens_stop_ids`` are held back until
        ``options.min_tokens``. Ids past the vocabulary are dropped: such a
        stop id or bad-word sequence can never be drawn or completed."""
        self.states.add_request(slot, options)
        if self.states.uses_penalty(slot):
            self.penalties.add_request(slot, prompt_len, prefill_len)
        stop_ids = [t for t in min_tokens_stop_ids if t < self.vocab_size]
        self.min_tokens.add_request(slot, options.min_tokens, prompt_len, stop_ids)
        self.logit_bias.add_request(slot, options)
        sequences = [s for s in options.bad_words_token_ids or ()
                     if max(s) < self.vocab_size]
        self.bad_words.add_request(slot, sequences, prompt_len, prefill_len)
        self.logprob_token_ids.add_request(slot, options.logprob_token_ids)

    def remove_request(self, slot: int) -> None:
        """The slot's request left (finished or preempted). Its min-tokens,
        token-list and bad-word rows are cleared, and those tables shrink
        when their remaining users need much less, by the next
        ``write_added_rows``; the other per-slot state is rewritten when the
        slot is taken again."""
        self.min_tokens.remove_request(slot)
        self.logit_bias.remove_request(slot)
        self.bad_words.remove_request(slot)

    @property
    def staged_tensors(self) -> tuple[StagedWriteTensor, ...]:
        """The tensors whose writes are staged on the host (penalty rows are
        rebuilt on the device instead)."""
        return (*self.states.staged_tensors, *self.min_tokens.staged_tensors,
                *self.logprob_token_ids.staged_tensors)

    def write_added_rows(self, all_token_ids: torch.Tensor) -> None:
        """The device rows of the requests added (or, for token lists and bad
        words, removed) since the last call that are not staged writes:
        penalty rows built from ``all_token_ids`` (the runner's device table
        of prefill tokens, already written), min-tokens stop ids, allowed ids
        and biases, bad-word sequences and histories (from ``all_token_ids``
        too). The sampler's own staged writes
        (``staged_tensors``) are applied apart; they touch other tensors, so
        either may come first."""
        self.penalties.rebuild_added_rows(all_token_ids)
        self.min_tokens.write_added_stop_ids()
        self.logit_bias.write_added_rows()
        self.bad_words.write_added_rows(all_token_ids)

    def __call__(
        self,
        logits: torch.Tensor,
        idx_mapping: torch.Tensor,
        idx_mapping_np: np.ndarray,
        positions: torch.Tensor,
        sample_mask: torch.Tensor,
        last_tokens: torch.Tensor | None = None,
        greedy: torch.Tensor | None = None,
        forced: ForcedTokens | None = None,
    ) -> SamplerOutput:
        """Sample one token per row.

        ``logits`` [N, V], any float dtype (the model's: it is cast to
        float32 where the sampler computes on it; the greedy fast path's
        argmax reads it as it is); ``idx_mapping`` [N] slots (device) and
        ``idx_mapping_np`` (host, same values); ``positions`` [N] position
        of the token being sampled; ``sample_mask`` [N] bool (device), False
        for a prefill chunk that stops short of its prompt (its token is
        discarded and must not count as output); ``last_tokens``: where each
        row's token is also stored, at its slot; ``greedy``: the argmax of
        each row of these logits, already stored there (``Sampler.draw``);
        ``forced``: rows whose token is decided (``Sampler.draw``).
        """
        draw = self.draw(logits, idx_mapping, idx_mapping_np, positions,
                         last_tokens=last_tokens, greedy=greedy, forced=forced)
        if draw.flags.any_penalty:
            self.penalties.record_sampled(draw.idx, draw.sampled, sample_mask)
        if draw.any_bad_words:
            self.bad_words.record_sampled(draw.idx, draw.sampled[:, None], sample_mask)
        return SamplerOutput(draw.sampled, self.logprobs(draw),
                             self.states.num_logprobs_np[idx_mapping_np])

    def draw(
        self,
        logits: torch.Tensor,
        idx_mapping: torch.Tensor,
        idx_mapping_np: np.ndarray,
        positions: torch.Tensor,
        prior_tokens: torch.Tensor | None = None,
        last_tokens: torch.Tensor | None = None,
        greedy: torch.Tensor | None = None,
        forced: ForcedTokens | None = None,
    ) -> TargetDraw:
        """Steps 1-3 for every row: the token each row's request draws at
        ``positions``, exactly as a one-token step would. ``prior_tokens``
        [N, m] (-1: none) are tokens that precede the row's position in its
        request without being counted yet (the drafts before it, nearest
        first, when the rows are the draft positions of speculative
        decoding): penalties and bad words count them as output tokens. With ``last_tokens`` (the runner's
        last sampled token of each slot) row i's token is also stored at
        ``last_tokens[idx_mapping[i]]`` by the draw's own launch.
        ``greedy``: each row's argmax of ``logits``, already stored at its
        slot in ``last_tokens`` (drawn inside the decode graph); the fast
        path then takes it and launches nothing, and any other draw ignores
        it and stores its own tokens over it. ``forced``: rows whose token
        is decided (a spent thinking budget; their grammar-mask rows allow
        every token): each keeps that token alone after the rows' own
        masks, on the sampler's copy of the logits, so the raw ones keep
        the model's values for logprobs."""
        idx = idx_mapping.to(torch.int64)
        flags = self.states.flags(idx_mapping_np)
        any_min_tokens = self.min_tokens.any_active(idx_mapping_np)
        any_bias = self.logit_bias.any_active(idx_mapping_np)
        any_bad_words = self.bad_words.any_active(idx_mapping_np)
        if (flags.all_greedy and not flags.any_penalty and flags.max_logprobs == NO_LOGPROBS
                and not any_min_tokens and not any_bias and not any_bad_words
                and forced is None and not self.custom_may_change_argmax):
            # The common case needs no per-slot parameter: one argmax.
            if greedy is not None:
                return TargetDraw(greedy, None, idx, flags)
            return TargetDraw(self.ops.greedy_argmax(logits, idx, last_tokens), None, idx, flags)
        # The kernels read each row's sampling parameters at its slot
        # themselves. Logprobs are of the raw logits as they are (their
        # kernel reads the model's dtype, the reference converts).
        raw = logits if flags.max_logprobs != NO_LOGPROBS else None
        processed = logits
        if any_bias:
            processed = self.logit_bias.apply(processed, idx, idx_mapping_np)
        if any_bad_words:
            processed = self.bad_words.apply(processed, idx, prior_tokens)
        if any_min_tokens:
            processed = self.min_tokens.apply(processed, idx, positions)
        custom = self.custom
        if custom is not None:
            processed = custom.apply_changing(processed, idx)
        if flags.any_penalty:
            processed = self.penalties.apply(processed, idx, self.states.slot_penalties,
                                             prior_tokens)
        if forced is not None:
            # On a copy where the raw logits are read for logprobs and no
            # own mask made one; in place where nothing reads them after.
            if processed is raw:
                processed = processed.to(torch.float32, copy=True)
            processed = forced.apply(processed)
        if custom is not None and custom.invariant and not flags.all_greedy:
            sampled = self._draw_with_invariant(custom, processed, idx, positions, flags,
                                                last_tokens)
        else:
            sampled = self._draw(processed, idx, positions, flags, last_tokens)
        return TargetDraw(sampled, raw, idx, flags, any_bad_words,
                          raw is not None and self.logprob_token_ids.any_active(idx_mapping_np))

    def logprobs(self, draw: TargetDraw) -> LogprobsTensors | None:
        """Step 4: logprobs of the raw logits for ``draw.sampled``, if any row asked."""
        if draw.flags.max_logprobs == NO_LOGPROBS:
            return None
        token_ids = (self.logprob_token_ids.rows(draw.idx, draw.flags.max_logprobs)
                     if draw.any_logprob_token_ids else None)
        return self.ops.compute_logprobs(draw.raw, draw.sampled, draw.flags.max_logprobs,
                                         token_ids)

    def _draw_with_invariant(
        self,
        custom: CustomLogitsProcessors,
        logits: torch.Tensor,
        idx: torch.Tensor,
        positions: torch.Tensor,
        flags: BatchFlags,
        last_tokens: torch.Tensor | None,
    ) -> torch.Tensor:
        """Step 3 in vLLM's order where argmax-invariant custom processors
        run: the rows divided by their temperature (greedy rows by 1),
        min-p, the processors, then top-k, top-p and the draw at
        temperature 1 (``states.unit_temperature``: 0 stays greedy). Greedy
        rows take the argmax of ``logits`` as they came, before the
        processors, as vLLM's greedy rows do."""
        states = self.states
        scaled = scale_by_temperature(logits, idx, states.slot_temperature)
        if flags.any_min_p:
            scaled = apply_min_p(scaled, states.slot_min_p[idx])
        scaled = custom.apply_invariant(scaled, idx)
        greedy = (states.slot_temperature[idx] == 0.0)[:, None]
        scaled = torch.where(greedy, logits.to(torch.float32), scaled)
        return self._draw(scaled, idx, positions, flags, last_tokens, divided=True)

    def _draw(
        self,
        logits: torch.Tensor,
        idx: torch.Tensor,
        positions: torch.Tensor,
        flags: BatchFlags,
        last_tokens: torch.Tensor | None,
        divided: bool = False,
    ) -> torch.Tensor:
        """Greedy argmax where temperature == 0, filtered Gumbel-max
        elsewhere: one launch, two where a filter runs (its thresholds).
        ``divided``: the rows are divided by their temperature and cut by
        min-p already (``_draw_with_invariant``, never an all-greedy batch);
        the kernels then read ``states.unit_temperature()``'s tables and
        filter by top-k and top-p alone."""
        if flags.all_greedy:
            return self.ops.greedy_argmax(logits, idx, last_tokens)
        states = self.states
        if divided:
            temperature, top_p, min_p = states.unit_temperature()
            any_min_p = False
        else:
            temperature, top_p, min_p = (states.slot_temperature, states.slot_top_p,
                                         states.slot_min_p)
            any_min_p = flags.any_min_p
        threshold = None
        if any_min_p or flags.max_top_k > 0 or flags.any_top_p:
            threshold = self.ops.filter_thresholds(
                logits, idx, temperature, states.top_k.gpu, top_p, min_p, any_min_p,
                flags.max_top_k, flags.any_top_p)
        return self.ops.gumbel_argmax(logits, idx, temperature, states.seeds.gpu, positions,
                                      self.token_keys, threshold, last_tokens)
