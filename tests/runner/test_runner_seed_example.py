"""The seed's worked example, through the runner's own state and functions."""

import numpy as np
import torch

from ipc.messages import NewRequestData, SamplingOptions
from runner.block_table import BlockTables
from runner.input_batch import make_input_batch, sort_batch_req_ids
from runner.ops import device_ops
from runner.request_state import RequestState
from runner.staged_write_group import StagedWriteGroup

MAX_REQS, MAX_LEN, BLOCK = 1024, 128, 16


def _new(req_id: str, prompt: list[int], computed: int = 0) -> NewRequestData:
    return NewRequestData(req_id=req_id, prompt_token_ids=prompt, prefill_token_ids=prompt,
                          sampling=SamplingOptions(temperature=0.0), block_ids=[[]],
                          num_computed_tokens=computed, max_tokens=8)


def test_free_indices_pop_last_and_reuse_last_freed():
    states = RequestState(MAX_REQS, MAX_LEN, torch.device("cpu"))
    assert states.free_indices == list(range(MAX_REQS))
    slots = [states.add_request(_new(r, [1, 2])) for r in ("R1", "R2", "R3")]
    assert slots == [1023, 1022, 1021]
    states.remove_request("R2")
    assert states.add_request(_new("R4", [5])) == 1022


def test_sort_order_decode_then_short_then_long():
    order = sort_batch_req_ids({"long": 300, "dec": 1, "short": 12}, {}, decode_query_len=1)
    assert order == ["dec", "short", "long"]
    # Requests with drafts lead; equal keys keep dict order.
    order = sort_batch_req_ids({"a": 1, "b": 3, "c": 1}, {"b": [7, 8]}, decode_query_len=1)
    assert order == ["b", "a", "c"]


def test_worked_example():
    device = torch.device("cpu")
    states = RequestState(MAX_REQS, MAX_LEN, device)
    tables = BlockTables(BLOCK, MAX_REQS, MAX_LEN // BLOCK, 64, device)
    # R1 and R2 decode (40 and 17 computed); R3 is a new 6-token prompt.
    r1 = states.add_request(_new("R1", list(range(100, 140)), computed=40))
    r2 = states.add_request(_new("R2", list(range(200, 217)), computed=17))
    r3 = states.add_request(_new("R3", [7, 8, 9, 10, 11, 12]))
    assert (r1, r2, r3) == (1023, 1022, 1021)
    tables.add_request(r1, [5, 9, 13])
    tables.add_request(r2, [2, 3])
    tables.add_request(r3, [21])
    StagedWriteGroup([*states.staged_tensors, *tables.staged_tensors]).apply_writes()
    states.last_sampled_tokens[r1] = 4242
    states.last_sampled_tokens[r2] = 4343

    batch = make_input_batch(["R3", "R1", "R2"], [6, 1, 1], states.req_id_to_index,
                             states.num_computed_tokens_np, states.prefill_len_np, num_reqs_padded=4)
    assert batch.req_ids == ["R1", "R2", "R3"]
    assert batch.idx_mapping_np.tolist() == [1023, 1022, 1021]
    assert batch.query_start_loc_np.tolist() == [0, 1, 2, 8, 8]  # padding repeats 8

    idx = torch.from_numpy(batch.idx_mapping_np)
    qsl = torch.from_numpy(batch.query_start_loc_np)
    positions = torch.full((64,), -1, dtype=torch.int64)
    seq_lens = torch.full((8,), -1, dtype=torch.int32)
    ops = device_ops(device)
    ops.prepare_pos_seq_lens(idx, qsl, states.num_computed_tokens.gpu, positions, seq_lens, 3)
    assert positions[:8].tolist() == [40, 17, 0, 1, 2, 3, 4, 5]
    assert seq_lens[:3].tolist() == [41, 18, 6]
    assert seq_lens[3:].tolist() == [0] * 5  # padded rows

    input_ids = torch.full((64,), -1, dtype=torch.int32)
    input_ids[2:8] = torch.tensor([7, 8, 9, 10, 11, 12], dtype=torch.int32)
    logits_out = torch.full((64,), -1, dtype=torch.int64)
    logits_indices = ops.combine_sampled_tokens(
        input_ids, idx, states.last_sampled_tokens, qsl, seq_lens, states.prefill_len.gpu,
        logits_out, 3)
    assert logits_indices.tolist() == [0, 1, 7]
    assert input_ids[:2].tolist() == [4242, 4343]

    slots = tables.compute_slot_mapping(idx, qsl, positions, 3, 8, 10)
    assert slots[0].item() == 13 * 16 + 8  # table[1023][2] * 16 + 8
    assert slots[2:8].tolist() == [21 * 16 + k for k in range(6)]
    assert slots[8:10].tolist() == [-1, -1]
    rows = tables.gather(idx, 3, 4)
    assert rows[0, :3].tolist() == [5, 9, 13] and rows[3].abs().sum().item() == 0
    assert np.array_equal(batch.sample_mask_np, [True, True, True])


def test_input_batch_orders_decodes_first_and_maps_back_to_the_plan():
    rng = np.random.default_rng(5)
    for _ in range(200):
        n = int(rng.integers(0, 12))
        counts = {f"r{i}": int(c) for i, c in enumerate(rng.choice([1, 1, 1, 2, 3, 7, 16], n))}
        slots = {r: i for i, r in enumerate(counts)}
        zeros = np.zeros(n + 1, dtype=np.int32)
        batch = make_input_batch(list(counts), list(counts.values()), slots, zeros, zeros)
        # The seed's key, with Python's stable sort as the oracle.
        assert batch.req_ids == sorted(counts, key=lambda r: (counts[r] != 1, counts[r]))
        assert [list(counts)[i] for i in batch.plan_order] == batch.req_ids
