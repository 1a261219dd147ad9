"""Sleep mode on CPU (vLLM's ``enable_sleep_mode``, ``LLM.sleep`` / ``wake_up``
/ ``is_sleeping``): every level and tag frees the runner's storage and gives
back, after waking, greedy tokens equal to HF transformers' greedy tokens
(the same as before the sleep); in process and over worker daemons (TP=2, gloo)."""

import pytest
import torch

from engine import LLM, SamplingParams
from tests.helpers.hf_models import save_with_greedy_reference, small_llama

PROMPTS = [[3, 14, 15, 92, 65], list(range(40, 70))]
MAX_TOKENS = 6
PARAMS = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
OPTIONS = dict(device="cpu", max_num_seqs=4, max_num_batched_tokens=64,
               kv_cache_memory_bytes=4 << 20)


@pytest.fixture(scope="module")
def model_and_expected(tmp_path_factory):
    model = small_llama(3, 128, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=256)
    path = tmp_path_factory.mktemp("sleepy")
    return str(path), save_with_greedy_reference(model, path, PROMPTS, MAX_TOKENS)


def _greedy(llm: LLM) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS)
    return [o.outputs[0].token_ids for o in outputs]


def _runner(llm: LLM):
    return llm.engine.executor.worker.runner


def _storage_bytes(llm: LLM) -> tuple[int, int]:
    """The bytes the runner's weight (parameters and buffers) and KV cache
    storages hold, counted here from the tensors themselves."""
    runner = _runner(llm)
    tensors = [*runner.model.parameters(), *runner.model.buffers()]
    weights = sum(t.untyped_storage().nbytes() for t in tensors)
    return weights, sum(t.untyped_storage().nbytes() for t in runner.kv_caches)


@pytest.mark.timeout(180)
def test_level_1_frees_and_restores_in_process(model_and_expected):
    path, expected = model_and_expected
    with LLM(model=path, enable_sleep_mode=True, **OPTIONS) as llm:
        assert _greedy(llm) == expected
        awake_weights, awake_kv = _storage_bytes(llm)
        assert awake_weights > 0 and awake_kv > 0
        assert not llm.is_sleeping()
        llm.sleep(level=1)
        assert llm.is_sleeping()
        assert _storage_bytes(llm) == (0, 0)
        assert llm.engine.scheduler.kv.pool.num_cached_blocks == 0  # prefix cache reset
        with pytest.raises(RuntimeError, match="sleeping.*wake_up"):
            llm.generate([{"prompt_token_ids": PROMPTS[0]}], PARAMS)
        llm.wake_up()
        assert not llm.is_sleeping()
        assert _storage_bytes(llm) == (awake_weights, awake_kv)
        assert _greedy(llm) == expected


@pytest.mark.timeout(180)
def test_wake_up_by_tags_then_level_2_reloads_the_checkpoint(model_and_expected):
    path, expected = model_and_expected
    with LLM(model=path, enable_sleep_mode=True, **OPTIONS) as llm:
        assert _greedy(llm) == expected
        awake_weights, awake_kv = _storage_bytes(llm)
        llm.sleep(level=1)
        llm.wake_up(tags=["weights"])
        assert llm.is_sleeping()  # the cache still is
        assert _storage_bytes(llm) == (awake_weights, 0)
        with pytest.raises(RuntimeError, match=r"\['kv_cache'\] not woken up"):
            llm.generate([{"prompt_token_ids": PROMPTS[0]}], PARAMS)
        llm.wake_up(tags=["kv_cache"])
        assert not llm.is_sleeping()
        assert _storage_bytes(llm) == (awake_weights, awake_kv)
        assert _greedy(llm) == expected

        runner = _runner(llm)
        llm.sleep(level=2)
        assert _storage_bytes(llm) == (0, 0)
        # Level 2 keeps no copy of the parameters, only of the buffers.
        assert runner.sleeping.params.host is None
        assert runner.sleeping.buffers.host is not None
        llm.wake_up(tags=["weights"])
        llm.wake_up(tags=["kv_cache"])
        assert _greedy(llm) == expected
        with pytest.raises(ValueError, match="unknown wake_up tags"):
            llm.wake_up(tags=["scheduling"])
        with pytest.raises(ValueError, match="sleep level"):
            llm.sleep(level=3)


@pytest.mark.timeout(180)
def test_sleep_aborts_unfinished_requests(model_and_expected):
    """vLLM's default mode ("abort"): a request still running when the
    engine falls asleep ends as "abort", and the engine runs again once woken."""
    path, expected = model_and_expected
    with LLM(model=path, enable_sleep_mode=True, **OPTIONS) as llm:
        engine = llm.engine
        request = engine.add_request({"prompt_token_ids": PROMPTS[1]}, PARAMS)
        engine.step()
        deltas = engine.sleep(level=1)
        assert [(d.req_id, d.finished, d.finish_reason) for d in deltas] == [
            (request.req_id, True, "abort")]
        assert not engine.has_unfinished_requests()
        llm.wake_up()
        assert _greedy(llm) == expected


@pytest.mark.timeout(120)
def test_sleep_without_sleep_mode_is_vllms_assertion(model_and_expected):
    path, _ = model_and_expected
    with LLM(model=path, **OPTIONS) as llm:
        with pytest.raises(AssertionError, match="Sleep mode is not enabled in the model config"):
            llm.sleep()
        with pytest.raises(AssertionError, match="Sleep mode is not enabled"):
            llm.wake_up()
        assert not llm.is_sleeping()


@pytest.mark.timeout(240)
def test_tp2_worker_daemons_round_trip(model_and_expected):
    path, expected = model_and_expected
    with LLM(model=path, tensor_parallel_size=2, enable_sleep_mode=True, **OPTIONS) as llm:
        assert _greedy(llm) == expected
        awake = llm.engine.executor.collective_rpc("memory_bytes")
        assert len(awake) == 2 and all(m["weights"] > 0 and m["kv_cache"] > 0 for m in awake)
        llm.sleep(level=1)
        assert llm.engine.executor.collective_rpc("memory_bytes") == [
            {"weights": 0, "kv_cache": 0}] * 2
        llm.wake_up()
        assert llm.engine.executor.collective_rpc("memory_bytes") == awake
        assert _greedy(llm) == expected
        llm.sleep(level=2)
        llm.wake_up()
        assert _greedy(llm) == expected


@pytest.mark.timeout(180)
def test_async_llm_sleeps_and_wakes(model_and_expected):
    """``AsyncLLM``'s face (the serving loop's): a request sent while the
    engine sleeps waits, then runs once it is woken, to the same tokens."""
    import asyncio

    from serving.async_llm import AsyncLLM

    path, expected = model_and_expected

    async def tokens(llm, request_id):
        async for out in llm.generate({"prompt_token_ids": PROMPTS[0]}, PARAMS, request_id):
            last = out
        return last.outputs[0].token_ids

    async def main():
        async with AsyncLLM(model=path, enable_sleep_mode=True, **OPTIONS) as llm:
            assert await tokens(llm, "a") == expected[0]
            await llm.sleep(level=1)
            assert await llm.is_sleeping()
            waiting = asyncio.ensure_future(tokens(llm, "b"))
            done, _ = await asyncio.wait([waiting], timeout=1.0)
            assert not done  # queued while asleep
            await llm.wake_up()
            assert not await llm.is_sleeping()
            assert await asyncio.wait_for(waiting, 60) == expected[0]
            # True once the engine has absorbed the request's last step.
            for _ in range(200):
                if await llm.reset_prefix_cache():
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("the prefix cache was never reset")
            with pytest.raises(RuntimeError, match="unknown wake_up tags"):
                await llm.wake_up(tags=["scheduling"])

    asyncio.run(main())


@pytest.mark.timeout(180)
def test_level_2_wakes_every_parameter_to_its_value_at_start(tmp_path, monkeypatch):
    """Level 2's restored storages hold whatever memory the allocator hands
    back (here NaN bytes, as freed memory may hold); the reload must leave
    none of it: every parameter equals its value at start, the rows that
    pad the vocabulary (100 ids in 128 rows: zero at start, and in no
    checkpoint) included, and the greedy tokens equal HF's."""
    from runner.sleep_mode import Storages

    restore = Storages.restore

    def restore_over_junk(self):
        discarded = self.host is None
        restore(self)
        if discarded:  # no bytes kept: the memory is the allocator's
            for storage in self.storages:
                storage.fill_(255)

    monkeypatch.setattr(Storages, "restore", restore_over_junk)
    model = small_llama(3, 100, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=256)
    expected = save_with_greedy_reference(model, tmp_path, PROMPTS, MAX_TOKENS)
    with LLM(model=str(tmp_path), enable_sleep_mode=True, **OPTIONS) as llm:
        runner = _runner(llm)
        assert runner.model.embed_tokens.weight.shape[0] == 128  # 28 padding rows
        at_start = {name: p.clone() for name, p in runner.model.named_parameters()}
        llm.sleep(level=2)
        llm.wake_up()
        changed = [name for name, p in runner.model.named_parameters()
                   if not torch.equal(p, at_start[name])]
        assert changed == []
        assert _greedy(llm) == expected


@pytest.mark.timeout(180)
def test_wake_up_without_tags_wakes_what_is_still_asleep(model_and_expected):
    """vLLM's: ``wake_up()`` (no tags) wakes every tag still asleep, after a
    wake_up of some tags too; only tags named that are awake already are a
    warning that changes nothing."""
    path, expected = model_and_expected
    with LLM(model=path, enable_sleep_mode=True, **OPTIONS) as llm:
        llm.sleep(level=1)
        llm.wake_up(tags=["weights"])
        llm.wake_up(tags=["weights"])  # awake already: nothing done
        assert llm.is_sleeping()
        llm.wake_up()
        assert not llm.is_sleeping()
        assert _greedy(llm) == expected
