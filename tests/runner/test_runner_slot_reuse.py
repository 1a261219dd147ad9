"""Slot reuse: a new request in a freed slot sees none of the old request's state."""

import pytest

from ipc.messages import CachedRequestData, NewRequestData, SamplingOptions, SchedulerOutput
from tests.helpers.runner_steps import make_runner

BLOCK = 4


def _runner(model_dir: str):
    return make_runner(model_dir, num_blocks=64, block_size=BLOCK, max_num_seqs=4,
                       max_num_batched_tokens=64, max_model_len=64)


GREEDY = SamplingOptions(temperature=0.0)


def _new(req_id, prompt, blocks, sampling=GREEDY):
    return NewRequestData(req_id=req_id, prompt_token_ids=prompt, prefill_token_ids=prompt,
                          sampling=sampling, block_ids=[blocks],
                          num_computed_tokens=0, max_tokens=16)


def _step(runner, step_id, new=(), cached=None, scheduled=None, finished=()):
    """``scheduled``: tokens per request id, the cached requests' first."""
    cached = cached or CachedRequestData()
    plan = SchedulerOutput(
        step_id=step_id, scheduled_new_reqs=list(new), scheduled_cached_reqs=cached,
        num_scheduled_tokens=[scheduled[r] for r in cached.req_ids + [n.req_id for n in new]],
        finished_req_ids=list(finished))
    runner.execute_model(plan)
    return runner.sample_tokens().get_output()


def _decode(runner, step_id, req_id, new_blocks=()):
    """One token for ``req_id`` (the runner knows how many it has computed)."""
    cached = CachedRequestData(req_ids=[req_id], new_block_ids=[[list(new_blocks)]])
    out = _step(runner, step_id, cached=cached, scheduled={req_id: 1})
    return out.rows()[0]


def _generate_alone(runner, prompt, blocks, n, start_step=0):
    out = _step(runner, start_step, new=[_new("B", prompt, blocks)], scheduled={"B": len(prompt)})
    tokens = out.rows()[0]
    for i in range(1, n):
        tokens += _decode(runner, start_step + i, "B")
    return tokens


@pytest.mark.timeout(120)
def test_freed_slot_is_reused_without_leaks(tiny_dir):
    prompt_b = [10, 20, 30, 40, 50]
    expected = _generate_alone(_runner(tiny_dir), prompt_b, [7, 8, 9], 5)

    runner = _runner(tiny_dir)
    prompt_a = list(range(100, 140))  # 40 tokens over 10 blocks
    out = _step(runner, 0, new=[_new("A", prompt_a, list(range(10, 20)))], scheduled={"A": 40})
    assert len(out.sampled_token_ids) == 1 and out.num_sampled is None
    slot_a = runner.req_states.req_id_to_index["A"]
    for i in range(3):
        _decode(runner, 1 + i, "A", new_blocks=[20] if i == 0 else [])
    # A finishes in the same step that B arrives: B must get A's slot.
    out = _step(runner, 4, new=[_new("B", prompt_b, [7, 8, 9])], scheduled={"B": 5},
                finished=["A"])
    assert runner.req_states.req_id_to_index["B"] == slot_a
    tokens = out.rows()[0]
    for i in range(1, 5):
        tokens += _decode(runner, 4 + i, "B")
    assert tokens == expected


@pytest.mark.timeout(120)
def test_a_finished_request_gives_back_its_token_list_rows(tiny_dir):
    """A request with many long bad words and a long logit_bias finishes
    as B arrives: the sampler's tables no longer count it and are back to
    their first size, and B decodes as it does alone."""
    prompt_b = [10, 20, 30, 40, 50]
    expected = _generate_alone(_runner(tiny_dir), prompt_b, [7, 8, 9], 4)

    runner = _runner(tiny_dir)
    sampler = runner.sampler
    first_sizes = (tuple(sampler.bad_words.words.shape), sampler.logit_bias.allowed.shape[1])
    lists = SamplingOptions(temperature=0.0, logit_bias={t: 0.0 for t in range(200)},
                            bad_words_token_ids=[[t, t + 1, t + 2, 300] * 4 for t in range(40)])
    _step(runner, 0, new=[_new("A", list(range(100, 108)), [10, 11, 12], lists)], scheduled={"A": 8})
    _decode(runner, 1, "A")
    assert sampler.bad_words.users.num_users == sampler.logit_bias.users.num_users == 1
    assert sampler.bad_words.words.shape[1:] == (40, 16)
    out = _step(runner, 2, new=[_new("B", prompt_b, [7, 8, 9])], scheduled={"B": 5},
                finished=["A"])
    assert sampler.bad_words.users.num_users == sampler.logit_bias.users.num_users == 0
    assert (tuple(sampler.bad_words.words.shape),
            sampler.logit_bias.allowed.shape[1]) == first_sizes
    tokens = out.rows()[0]
    for i in range(1, 4):
        tokens += _decode(runner, 2 + i, "B")
    assert tokens == expected


@pytest.mark.timeout(120)
def test_reply_rows_follow_the_plan_not_the_batch_order(tiny_dir):
    # The plan lists a new prefill before a decode; the runner's batch puts the
    # decode first. The reply must still answer in the plan's order.
    prompt_a, prompt_b = [3, 1, 4, 1, 5, 9], [2, 7, 1, 8, 2]
    alone_a = _generate_alone(_runner(tiny_dir), prompt_a, [1, 2, 3], 2)
    alone_b = _generate_alone(_runner(tiny_dir), prompt_b, [4, 5], 1)
    assert alone_b != alone_a[1:2]  # else the order would not show

    runner = _runner(tiny_dir)
    first = _step(runner, 0, new=[_new("A", prompt_a, [1, 2, 3])], scheduled={"A": 6})
    cached = CachedRequestData(req_ids=["A"], new_block_ids=[None])
    out = _step(runner, 1, new=[_new("B", prompt_b, [4, 5])], cached=cached,
                scheduled={"B": 5, "A": 1})
    assert first.rows() == [alone_a[:1]]
    assert out.rows() == [alone_a[1:2], alone_b]  # the plan's order: cached, then new
