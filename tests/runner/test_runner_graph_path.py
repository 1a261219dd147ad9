"""The padded decode path that CUDA graphs replay, emulated on CPU: it must
give the tokens of eager steps, and a replay must read (never reset) the
inputs each step prepares."""

import pytest
import torch

from checkpoint.tiny_model import ensure_tiny_model
from ipc.messages import SamplingOptions
from tests.helpers.grammar_masks import mask_message
from tests.helpers.runner_steps import decode_step, make_runner, run_mixed_steps
from tests.helpers.runner_steps import run_prefill_then_decode as _run


def _runner(model_dir, graphs: bool):
    return make_runner(model_dir, emulate_graphs=graphs)


@pytest.mark.timeout(120)
def test_padded_graph_path_equals_eager(tmp_path):
    model_dir = ensure_tiny_model(str(tmp_path))
    prompts = [list(range(1, 41)), list(range(50, 120)), [7, 8, 9, 10, 11]]
    graphs = _runner(model_dir, graphs=True)
    got, seq_lens = _run(graphs, prompts, steps=8)  # 3 requests padded to 4
    want, _ = _run(_runner(model_dir, graphs=False), prompts, steps=8)
    assert got == want
    for step, lens in enumerate(seq_lens, start=1):
        assert sorted(lens) == sorted(len(p) + step for p in prompts)


@pytest.mark.timeout(60)
def test_graph_forward_reads_the_copied_inputs_and_never_resets_them(tmp_path):
    runner = _runner(ensure_tiny_model(str(tmp_path)), graphs=True)
    prompts = [list(range(1, 20)), [5, 6, 7]]
    _run(runner, prompts, steps=1)  # two decoding requests, padded to 2 rows
    buf, states = runner.buffers, runner.req_states
    slots = [states.req_id_to_index[r] for r in ("r0", "r1")]
    buf.idx_mapping[:4] = torch.tensor(slots + [states.pad_slot] * 2, dtype=torch.int32)
    buf.query_start_loc[:5] = torch.tensor([0, 1, 2, 2, 2], dtype=torch.int32)
    copied = [buf.idx_mapping[:4].clone(), buf.query_start_loc[:5].clone()]
    buf.seq_lens.fill_(-5)  # derived buffers: the graph must rebuild them
    runner.block_tables.slot_mapping.fill_(-7)
    computed = states.num_computed_tokens.gpu[slots].clone()
    runner._graph_forward(4)
    assert torch.equal(buf.idx_mapping[:4], copied[0])
    assert torch.equal(buf.query_start_loc[:5], copied[1])
    assert buf.seq_lens[:4].tolist() == (computed + 1).tolist() + [0, 0]
    # The graph also counts the step's token as computed, in the slots only.
    assert states.num_computed_tokens.gpu[slots].tolist() == (computed + 1).tolist()
    assert states.num_computed_tokens.gpu[states.pad_slot].item() == 0
    assert runner.block_tables.slot_mapping[2:4].tolist() == [-1, -1]


def _argmax_in_graphs_up_to(monkeypatch, rows: int) -> None:
    import runner.model_runner as model_runner

    monkeypatch.setattr(model_runner, "GREEDY_IN_GRAPH_MAX_ROWS", rows)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("max_rows, in_graph", [(4, True), (1, False), (0, False)])
def test_decode_graph_draws_each_rows_argmax(tmp_path, monkeypatch, max_rows, in_graph):
    """A one-token decode graph of at most GREEDY_IN_GRAPH_MAX_ROWS rows ends
    with the argmax of every logits row, stored at the rows' slots as their
    last tokens; a greedy batch's step samples exactly those tokens (in a
    larger graph the sampler draws them after the replay)."""
    _argmax_in_graphs_up_to(monkeypatch, max_rows)
    runner = _runner(ensure_tiny_model(str(tmp_path)), graphs=True)
    _run(runner, [list(range(1, 30)), list(range(40, 52)), [3, 4, 5]], steps=1)
    decode_step(runner, 2, ["r0", "r1", "r2"])  # padded to 4 rows
    t = runner.pending.tensors
    want = t.logits.float().argmax(-1)
    slots = t.idx_mapping
    if in_graph:
        assert torch.equal(t.greedy, want)
        assert torch.equal(runner.req_states.last_sampled_tokens[slots], want)
    else:
        assert t.greedy is None
    out = runner.sample_tokens().get_output()
    assert [row[0] for row in out.rows()] == want.tolist()
    assert torch.equal(runner.req_states.last_sampled_tokens[slots], want)


@pytest.mark.timeout(120)
def test_sampled_tokens_replace_the_graphs_argmax(tmp_path, monkeypatch):
    """In a batch that samples, the draw after the replay stores its tokens
    over the graph's argmax, so the next step feeds the sampled token, as
    eager steps do: r1 samples at a high temperature and leaves the greedy
    path, r0 stays on it."""
    _argmax_in_graphs_up_to(monkeypatch, 8)
    model_dir = ensure_tiny_model(str(tmp_path))
    prompts = [list(range(1, 30)), list(range(40, 52))]
    sampling = [SamplingOptions(temperature=0.0), SamplingOptions(temperature=3.0, seed=11)]
    got, _ = _run(_runner(model_dir, graphs=True), prompts, steps=6, sampling=sampling)
    want, _ = _run(_runner(model_dir, graphs=False), prompts, steps=6, sampling=sampling)
    assert got == want
    greedy, _ = _run(_runner(model_dir, graphs=False), prompts, steps=6)
    assert got["r0"] == greedy["r0"]
    assert got["r1"] != greedy["r1"]


@pytest.mark.timeout(120)
def test_grammar_mask_overrides_the_graphs_argmax(tmp_path):
    """A constrained row's mask comes after the replay, so its draw ignores
    the graph's argmax: allowed only a token that is not the argmax, the
    row samples that token and feeds it to the next step (a one-row graph:
    the default draws its argmax inside)."""
    runner = _runner(ensure_tiny_model(str(tmp_path)), graphs=True)
    _run(runner, [list(range(1, 30))], steps=1)
    decode_step(runner, 2, ["r0"], constrained=["r0"])
    argmax = int(runner.pending.tensors.greedy[0])
    vocab = runner.model.config.vocab_size
    allowed = (argmax + 1) % vocab
    mask = mask_message(2, {"r0": [allowed]}, vocab)
    assert runner.sample_tokens(mask).get_output().rows() == [[allowed]]
    slot = runner.req_states.req_id_to_index["r0"]
    assert int(runner.req_states.last_sampled_tokens[slot]) == allowed
    decode_step(runner, 3, ["r0"])
    assert int(runner.buffers.input_ids[0]) == allowed


@pytest.mark.timeout(120)
def test_mixed_batch_graph_path_equals_eager(tmp_path):
    """Steps with prefills padded to the mixed-batch graphs' token counts
    (42 tokens to 64, 92 to 128, padded rows owning no token) sample what
    eager steps sample, and leave the device counts right for the decode
    after them."""
    model_dir = ensure_tiny_model(str(tmp_path))
    runner = make_runner(model_dir, emulate_graphs=True, emulate_prefill_graphs=True)
    chosen = []
    replay = runner.prefill_graphs.replay
    runner.prefill_graphs.replay = lambda key: chosen.append(key) or replay(key)
    got = run_mixed_steps(runner)
    assert chosen == [64, 128]  # both steps with prefills took the padded path
    want = run_mixed_steps(make_runner(model_dir))
    assert got == want
    slots = [runner.req_states.req_id_to_index[r] for r in ("r0", "r1", "r2")]
    assert runner.req_states.num_computed_tokens.gpu[slots].tolist() == [37 + 2, 5 + 2, 90 + 1]


def test_prefill_capture_sizes_stop_at_every_limit():
    from runner.cuda_graphs import prefill_capture_sizes

    assert prefill_capture_sizes(2048, 8192) == [64, 128, 256, 384, 512, 768, 1024, 1536, 2048]
    assert prefill_capture_sizes(2048, 600) == [64, 128, 256, 384, 512, 600]
    assert prefill_capture_sizes(0, 8192) == []
    assert prefill_capture_sizes(100000, 100000)[-1] == 4096
