"""``bad_words`` in the sampler against vLLM's rule written out in plain
Python (``_expected_row``: a loop over the row's sequences and its output
tokens so far), on random logits and histories: sequences of one token,
sequences longer than the outputs so far, repeated ids, several words,
rows without bad words, prefill rows whose sample is not real, a slot
reused, a request added back after a preemption (its earlier outputs in
its prefill), tables widened while other slots hold histories, and draft
positions (the drafts before them counted as outputs, through the
rejection sampler). On the CPU, and on the GPU where there is one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ipc.messages import SamplingOptions
from runner.sampler import Sampler
from runner.spec_decode.rejection import DraftLayout, RejectionSampler
from tests.helpers.sampler_writes import write_added_requests

VOCAB = 12
MAX_REQS = 6
MAX_LEN = 64
DEVICES = [pytest.param("cpu"),
           pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                          reason="no CUDA device"))]
on_devices = pytest.mark.parametrize("device", DEVICES)


def _expected_row(logits: list[float], sequences: list[list[int]],
                  outputs: list[int]) -> list[float]:
    """vLLM's rule: a sequence of length L bans its last id where L - 1 is
    at most the outputs so far and the last L - 1 outputs are its others."""
    row = list(logits)
    for seq in sequences:
        prefix = seq[:-1]
        if len(prefix) > len(outputs):
            continue
        if not prefix or outputs[len(outputs) - len(prefix):] == prefix:
            row[seq[-1]] = float("-inf")
    return row


class _Requests:
    """The sampler under test and, per slot, what the rule reads: the
    slot's sequences and its output tokens so far (kept by the test)."""

    def __init__(self, device: str, seed: int):
        self.device = torch.device(device)
        self.sampler = Sampler(MAX_REQS, VOCAB, self.device, 0)
        self.table = torch.zeros(MAX_REQS + 1, MAX_LEN, dtype=torch.int32)
        self.sequences: dict[int, list[list[int]]] = {}
        self.outputs: dict[int, list[int]] = {}
        self.gen = np.random.default_rng(seed)

    def add(self, slot: int, sequences: list[list[int]] | None, prompt: list[int],
            earlier_outputs: list[int] = (), temperature: float = 0.0) -> None:
        """Add a request whose prefill is ``prompt`` + ``earlier_outputs``
        (outputs from before a preemption)."""
        prefill = list(prompt) + list(earlier_outputs)
        self.table[slot].zero_()
        self.table[slot, :len(prefill)] = torch.tensor(prefill, dtype=torch.int32)
        options = SamplingOptions(temperature=temperature, seed=slot,
                                  bad_words_token_ids=sequences)
        self.sampler.add_request(slot, options, len(prompt), len(prefill))
        write_added_requests(self.sampler, self.table.to(self.device))
        self.sequences[slot] = sequences or []
        self.outputs[slot] = list(earlier_outputs)

    def remove(self, slot: int) -> None:
        """The slot's request leaves, as the runner frees it."""
        self.sampler.remove_request(slot)
        write_added_requests(self.sampler, self.table.to(self.device))
        del self.sequences[slot], self.outputs[slot]

    def expected(self, logits: torch.Tensor, slots: list[int]) -> list[list[float]]:
        return [_expected_row(logits[i].tolist(), self.sequences[s], self.outputs[s])
                for i, s in enumerate(slots)]

    def step(self, slots: list[int], real: list[bool]) -> int:
        """One sampling step over ``slots`` on random logits, checked
        against the rule; returns how many bans the rule made that a
        sequence of one token did not."""
        logits = torch.from_numpy(self.gen.standard_normal((len(slots), VOCAB))).float()
        want = self.expected(logits, slots)
        zeros = [0.0] * VOCAB
        bans = sum(x == float("-inf") for s in slots for x in _expected_row(
            zeros, [q for q in self.sequences[s] if len(q) > 1], self.outputs[s]))
        idx_np = np.asarray(slots, dtype=np.int32)
        idx = torch.from_numpy(idx_np).to(self.device)
        got = self.sampler.bad_words.apply(logits.to(self.device), idx.to(torch.int64))
        assert got.cpu().tolist() == want
        out = self.sampler(logits.to(self.device), idx, idx_np,
                           torch.full((len(slots),), 5, device=self.device),
                           torch.tensor(real, device=self.device))
        tokens = out.sampled_token_ids.cpu().tolist()
        for i, slot in enumerate(slots):
            if self.sampler.states.floats_np[slot, 0] == 0.0:
                assert tokens[i] == int(np.argmax(want[i]))
            assert want[i][tokens[i]] != float("-inf")
            if real[i]:
                self.outputs[slot].append(tokens[i])
        return bans


def _random_sequences(gen: np.random.Generator, count: int, max_len: int) -> list[list[int]]:
    """Sequences over few ids (so outputs complete their prefixes), one of
    them a repeated id."""
    out = [[int(t) for t in gen.integers(0, 4, size=gen.integers(1, max_len + 1))]
           for _ in range(count)]
    out.append([int(gen.integers(0, 4))] * max(2, max_len))
    return out


@on_devices
def test_random_rows_follow_the_rule(device):
    """Random histories and sequences, several steps; slots with and
    without bad words in one batch; some prefix bans must happen."""
    reqs = _Requests(device, seed=1)
    gen = reqs.gen
    reqs.add(5, _random_sequences(gen, 3, 3), [1, 2, 3])
    reqs.add(4, None, [3, 3])  # no bad words, in the same batches
    reqs.add(3, [[7], [1, 1], [2, 3, 1], [0, 1, 2, 3]], [0, 1], earlier_outputs=[2, 3])
    reqs.add(2, _random_sequences(gen, 2, 2), [2], temperature=1.0)
    bans = 0
    for step in range(40):
        slots = [5, 4, 3, 2]
        real = [True, True, step % 5 != 0, True]  # a prefill row now and then
        bans += reqs.step(slots, real)
    assert bans > 10


@on_devices
def test_prompt_tokens_never_count(device):
    """A prompt that ends with a sequence's other ids bans nothing; the
    outputs do."""
    reqs = _Requests(device, seed=2)
    reqs.add(0, [[1, 2], [1, 1, 5]], [1, 1])
    zeros = torch.zeros(1, VOCAB)
    apply = reqs.sampler.bad_words.apply
    idx = torch.tensor([0], device=reqs.device)
    assert not torch.isinf(apply(zeros.to(reqs.device), idx)).any()
    reqs.add(0, [[1, 2], [1, 1, 5]], [1, 1], earlier_outputs=[1])
    row = apply(zeros.to(reqs.device), idx)[0].cpu()
    assert row.tolist() == _expected_row([0.0] * VOCAB, [[1, 2], [1, 1, 5]], [1])
    assert torch.isinf(row[2]) and not torch.isinf(row[5])


@on_devices
def test_slot_reuse_and_readding_after_preemption(device):
    """A slot taken by a request without bad words bans nothing (the last
    request's sequences are gone); a request added back after a preemption
    has its own history, rebuilt from its prefill, not the slot's last."""
    reqs = _Requests(device, seed=3)
    sequences = [[2, 4], [3, 3, 3, 6], [9]]
    reqs.add(1, sequences, [5, 5], earlier_outputs=[3, 3, 3])
    reqs.add(0, [[8]], [1])
    assert reqs.step([1, 0], [False, True]) > 0  # 6 after 3, 3, 3
    reqs.add(1, sequences, [3, 3], earlier_outputs=[3])  # another, with fewer outputs
    for _ in range(5):
        reqs.step([0, 1], [True, True])
    reqs.add(1, None, [4])  # reused by a request without bad words
    assert not reqs.sampler.bad_words.any_active(np.array([1]))
    for _ in range(4):
        reqs.step([1, 0], [True, True])
    reqs.add(1, [[2, 4], [3, 3, 3, 6]], [7, 8], earlier_outputs=[2, 3, 3, 3])  # re-added
    assert reqs.step([0, 1], [True, True]) > 0


@on_devices
def test_tables_widen_while_other_slots_hold_histories(device):
    """Slot 2's history, written before the tables widen, still bans after."""
    reqs = _Requests(device, seed=4)
    gen = reqs.gen
    reqs.add(2, [[1, 2, 3], [2, 5]] + _random_sequences(gen, 2, 3), [1],
             earlier_outputs=[0, 1, 2])
    for _ in range(3):
        reqs.step([2], [False])  # prefill rows: nothing recorded
    wide = _random_sequences(gen, 9, 7)  # more and longer than the first tables hold
    reqs.add(3, wide, [0], earlier_outputs=[int(t) for t in gen.integers(0, 4, size=10)])
    words = reqs.sampler.bad_words.words
    assert words.shape[1] >= len(wide) and words.shape[2] >= 7
    assert reqs.step([2], [True]) >= 2  # 3 and 5
    for _ in range(20):
        reqs.step([3, 2], [True, True])


@on_devices
def test_tables_shrink_to_their_users_once_a_wide_request_leaves(device):
    """A request with many long sequences leaves: the tables shrink to what
    slot 2 needs (the initial size here) and slot 2's history, carried
    across both resizes, still bans; the freed slot, taken by a request
    without bad words, meets an empty row beside slot 2."""
    reqs = _Requests(device, seed=6)
    gen = reqs.gen
    reqs.add(2, [[1, 2, 3], [2, 5], [0, 0, 1, 2]], [1], earlier_outputs=[0, 1, 2])
    wide = _random_sequences(gen, 30, 9)
    reqs.add(3, wide, [0], earlier_outputs=[int(t) for t in gen.integers(0, 4, size=12)])
    state = reqs.sampler.bad_words
    assert tuple(state.words.shape[1:]) == (31, 9) and state.users.num_users == 2
    for _ in range(6):
        reqs.step([3, 2], [True, True])
    reqs.remove(3)
    assert tuple(state.words.shape[1:]) == (4, 4) and tuple(state.history.shape) == (MAX_REQS, 3)
    assert state.users.num_users == 1 and not state.any_active(np.array([3]))
    reqs.add(3, None, [2, 2])
    bans = sum(reqs.step([2, 3], [True, True]) for _ in range(30))
    assert bans >= 3
    reqs.remove(2)
    reqs.remove(3)  # never used bad words: nothing to do
    assert state.users.num_users == 0 and not state.words.ge(0).any()


@on_devices
def test_a_slot_freed_and_taken_in_one_plan_starts_clean(device):
    """The runner frees a slot and gives it to a request without bad words
    in one plan (no write between): the old request's bans are gone."""
    reqs = _Requests(device, seed=7)
    reqs.add(2, [[3]], [1])
    reqs.add(1, [[5], [4]], [2])
    reqs.sampler.remove_request(1)
    del reqs.sequences[1], reqs.outputs[1]
    reqs.add(1, None, [2])  # writes the rows once, for both
    for _ in range(5):
        reqs.step([2, 1], [True, True])


@on_devices
def test_draft_positions_count_the_drafts_before_them(device):
    """The rejection sampler's rows: each logits row follows the rule with
    the row's earlier drafts as outputs; after it, the slot's outputs are
    what it emitted, and the next plain step follows the rule from there."""
    reqs = _Requests(device, seed=5)
    gen = reqs.gen
    sequences = {0: [[1, 2], [2, 2, 3], [0, 1, 0, 1]], 1: [[3, 3], [1]], 2: []}
    for slot, seqs in sequences.items():
        reqs.add(slot, seqs or None, [0], earlier_outputs=[int(t) for t in
                                                            gen.integers(0, 4, size=3)])
    k = 3
    rejection = RejectionSampler(reqs.sampler, k)
    slots = [0, 1, 2]
    num_accepted = 0
    for _ in range(15):
        cu = torch.arange(0, (k + 1) * len(slots) + 1, k + 1, dtype=torch.int32)
        layout = DraftLayout.build(cu.to(reqs.device), len(slots), int(cu[-1]), k + 1)
        logits = torch.from_numpy(gen.standard_normal((int(cu[-1]), VOCAB))).float()
        # Each row's k drafts: mostly the rule's greedy choice given the
        # drafts before (so several are accepted), now and then another.
        drafts_by_row, want = [], []
        for i, slot in enumerate(slots):
            row_drafts = []
            for j in range(k + 1):
                want.append(_expected_row(logits[i * (k + 1) + j].tolist(), sequences[slot],
                                          reqs.outputs[slot] + row_drafts))
                if j < k:
                    best = int(np.argmax(want[-1]))
                    row_drafts.append(best if gen.random() < 0.8 else int(gen.integers(0, 4)))
            drafts_by_row.append(row_drafts)
        drafts = torch.tensor([d for row in drafts_by_row for d in row + [0]],
                              device=reqs.device)
        row_slots = torch.tensor(np.repeat(slots, k + 1), device=reqs.device)
        prior = layout.prior_drafts(drafts, k + 1)
        got = reqs.sampler.bad_words.apply(logits.to(reqs.device), row_slots, prior)
        assert got.cpu().tolist() == want
        idx_np = np.asarray(slots, dtype=np.int32)
        out = rejection(logits.to(reqs.device), drafts, layout,
                        torch.from_numpy(idx_np).to(reqs.device), idx_np,
                        np.full(len(slots), k + 1), torch.full((int(cu[-1]),), 5,
                                                               device=reqs.device),
                        torch.ones(len(slots), dtype=torch.bool, device=reqs.device))
        tokens, accepted = out.tokens.cpu().tolist(), out.num_accepted.cpu().tolist()
        for i, slot in enumerate(slots):
            emitted = tokens[i][:accepted[i] + 1]
            # Greedy: each emitted token is its position's argmax by the rule.
            assert emitted == [int(np.argmax(want[i * (k + 1) + j]))
                               for j in range(len(emitted))]
            reqs.outputs[slot] += emitted
            num_accepted += accepted[i]
        reqs.step(slots, [True] * len(slots))
    assert num_accepted > 20
