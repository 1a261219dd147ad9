"""LoRA serving end to end: LLM(enable_lora=True).generate(..., lora_request=...)
gives each request the greedy tokens of HF transformers running the same model
with that request's adapter merged into its weights (W + scale * B @ A)."""

import json
import shutil

import pytest

from engine import LLM, LoRARequest, SamplingParams
from engine.lora_checks import LoRAChecks
from ipc.errors import InvalidRequestError
from tests.helpers.devices import DEVICES
from tests.helpers.lora_adapters import model_with_adapter_requests

PROMPTS = [
    [5, 17, 99, 3],
    [(7 * i) % 200 + 1 for i in range(37)],  # two full blocks of 16: prefix-cached
    list(range(1, 30)),  # longer than the token budget: chunked prefill
]
MAX_TOKENS = 8
PARAMS = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def lora_setup(tmp_path_factory):
    """The model, its three adapters (``ADAPTERS``) and HF's references."""
    root = tmp_path_factory.mktemp("lora")
    model_dir, loras, expected = model_with_adapter_requests(root, PROMPTS, MAX_TOKENS)
    return model_dir, root, loras, expected


def _llm(path: str, **kwargs) -> LLM:
    kwargs = {"device": "cpu", "max_num_batched_tokens": 24, "block_size": 16,
              "max_num_seqs": 8, "enable_lora": True, "max_lora_rank": 16, **kwargs}
    return LLM(model=path, **kwargs)


def _check_mixed_batch(llm: LLM, loras: dict, expected: dict) -> None:
    """Every prompt under adapters 1, 2, 3 and none, all in one call."""
    cases = [(lora_id, i) for lora_id in (1, None, 2, 3) for i in range(len(PROMPTS))]
    outs = llm.generate([{"prompt_token_ids": PROMPTS[i]} for _, i in cases], PARAMS,
                        lora_request=[loras.get(lora_id) for lora_id, _ in cases])
    got = {(lora_id, i): out.outputs[0].token_ids for (lora_id, i), out in zip(cases, outs)}
    assert got == {(lora_id, i): expected[lora_id][i] for lora_id, i in cases}


def _count_graph_replays(llm: LLM) -> dict[str, int]:
    """Replays of the in-process runner's decode and mixed-batch graphs from
    now on, by kind, counted as they happen (none on CPU: no CUDA graphs)."""
    runner = llm.engine.executor.worker.runner
    replays = {"decode": 0, "prefill": 0}
    for name, graphs in (("decode", runner.graphs), ("prefill", runner.prefill_graphs)):
        if graphs is None:
            continue

        def counted(key, replay=graphs.replay, name=name):
            replays[name] += 1
            return replay(key)

        graphs.replay = counted
    return replays


@pytest.fixture(scope="module")
def lora_llm(lora_setup):
    path, _, _, _ = lora_setup
    with _llm(path, max_loras=3) as llm:
        yield llm


@pytest.mark.timeout(180)
@pytest.mark.parametrize("device", DEVICES)
def test_mixed_batch_matches_merged_references(lora_setup, device):
    # On CUDA the decode batches and the small mixed ones replay captured
    # graphs, which build each token's adapter mask inside the graph.
    path, _, loras, expected = lora_setup
    with _llm(path, device=device, max_loras=3) as llm:
        replays = _count_graph_replays(llm)
        _check_mixed_batch(llm, loras, expected)
    on_graphs = device == "cuda"
    assert (replays["decode"] > 0, replays["prefill"] > 0) == (on_graphs, on_graphs)


@pytest.mark.timeout(240)
def test_tensor_parallel_mixed_batch(lora_setup):
    # Two ranks over gloo: B sharded by output rows for q/k/v (the one kv head
    # replicated) and gate/up, A by input columns for o and down.
    path, _, loras, expected = lora_setup
    with _llm(path, max_loras=3, tensor_parallel_size=2) as llm:
        _check_mixed_batch(llm, loras, expected)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("device", DEVICES)
def test_more_adapters_than_slots(lora_setup, device):
    # One adapter slot: requests of other adapters wait until the running
    # ones finish, and the slot is reloaded, adapter 1 twice (on CUDA
    # between replays of graphs that read the slot's factors in place).
    path, _, loras, expected = lora_setup
    with _llm(path, device=device, max_loras=1) as llm:
        scheduler = llm.engine.scheduler
        running_adapters, loads = [], []
        schedule = scheduler.schedule

        def spy():
            plan = schedule()
            running_adapters.append({r.lora_request.lora_int_id for r in scheduler.running
                                     if r.lora_request is not None})
            loads.extend(load.lora_int_id for load in plan.lora_loads)
            return plan

        scheduler.schedule = spy
        replays = _count_graph_replays(llm)
        for cases in ([(1, 0), (2, 0), (None, 1), (3, 2), (2, 2), (1, 2)], [(1, 1)]):
            outs = llm.generate([{"prompt_token_ids": PROMPTS[i]} for _, i in cases], PARAMS,
                                lora_request=[loras.get(lora_id) for lora_id, _ in cases])
            assert [o.outputs[0].token_ids for o in outs] == [expected[lora_id][i]
                                                              for lora_id, i in cases]
    assert max(len(adapters) for adapters in running_adapters) == 1
    assert (replays["decode"] > 0) == (device == "cuda")
    # Arrival order, a request skipped while its adapter finds no slot: the
    # second of adapter 2 (and of 1) joins its first; 1 comes back last.
    assert loads == [1, 2, 3, 1]


@pytest.mark.timeout(180)
def test_prefix_cache_keys_blocks_by_adapter(lora_setup, lora_llm):
    # One prompt of two full blocks, run alone under each adapter in turn:
    # no adapter's blocks serve another; the same adapter's do.
    _, _, loras, expected = lora_setup
    kv = lora_llm.engine.scheduler.kv
    prompt = {"prompt_token_ids": PROMPTS[1]}
    for lora_id in (None, 1, 2):
        hits = kv.prefix_hits
        out = lora_llm.generate(prompt, PARAMS, lora_request=loras.get(lora_id))
        assert out[0].outputs[0].token_ids == expected[lora_id][1]
    hits = kv.prefix_hits
    out = lora_llm.generate(prompt, PARAMS, lora_request=loras[2])
    assert out[0].outputs[0].token_ids == expected[2][1]
    assert kv.prefix_hits - hits == 32  # both full blocks, computed under adapter 2


def _adapter(source, root, name: str, **config) -> str:
    """A copy of the adapter in ``source`` under ``root / name``, its config
    changed (a key given None is left out)."""
    path = root / name
    shutil.copytree(source, path)
    data = {**json.loads((path / "adapter_config.json").read_text()), **config}
    data = {key: value for key, value in data.items() if value is not None}
    (path / "adapter_config.json").write_text(json.dumps(data))
    return str(path)


@pytest.mark.timeout(180)
def test_adapters_that_cannot_be_served_are_refused(lora_setup, lora_llm, tmp_path):
    _, root, loras, expected = lora_setup
    source = root / "adapter2"
    # Adapter 1 known to the engine, whatever ran before in this module.
    lora_llm.generate({"prompt_token_ids": PROMPTS[0]}, PARAMS, lora_request=loras[1])
    cases = {
        "no such directory": str(tmp_path / "missing"),
        "LoRA rank 32 is greater than max_lora_rank 16": _adapter(source, tmp_path, "rank",
                                                                 r=32),
        "not embeddings or the LM head": _adapter(source, tmp_path, "embed",
                                                  target_modules=["q_proj", "embed_tokens"]),
        "bias 'all' is not supported": _adapter(source, tmp_path, "bias", bias="all"),
        "has shape": _adapter(source, tmp_path, "shape", r=2),
        # vLLM requires it too (PEFT's default of 8 is not assumed).
        "needs 'lora_alpha'": _adapter(source, tmp_path, "alpha", lora_alpha=None),
    }
    for i, (message, path) in enumerate(cases.items()):
        with pytest.raises(InvalidRequestError, match=message):
            lora_llm.generate("hello", PARAMS, lora_request=LoRARequest(f"bad{i}", 50 + i, path))
    with pytest.raises(InvalidRequestError, match="names adapter 'adapter1'"):
        lora_llm.generate("hello", PARAMS, lora_request=LoRARequest("other", 1, loras[2].lora_path))
    # The engine goes on serving.
    out = lora_llm.generate({"prompt_token_ids": PROMPTS[0]}, PARAMS, lora_request=loras[1])
    assert out[0].outputs[0].token_ids == expected[1][0]


def test_lora_request_without_lora_enabled_is_refused(lora_setup):
    _, _, loras, _ = lora_setup
    from checkpoint.description import describe

    checks = LoRAChecks(None, describe(lora_setup[0]))
    with pytest.raises(InvalidRequestError, match="LoRA is not enabled"):
        checks.check(loras[1])
    with pytest.raises(InvalidRequestError, match="lora_int_id must be an int >= 1"):
        LoRARequest("x", 0, "/tmp")


@pytest.mark.timeout(180)
def test_chat_runs_its_adapter(lora_setup, lora_llm):
    # The chat's rendered prompt under adapter 3 gives what generate gives
    # that prompt under adapter 3 (checked against HF above), not the base's.
    _, _, loras, _ = lora_setup
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    chat = lora_llm.chat([{"role": "user", "content": "the adapter's turn"}], PARAMS,
                         chat_template=template, lora_request=loras[3])[0]
    ids = {"prompt_token_ids": chat.prompt_token_ids}
    under = {lora_id: lora_llm.generate(ids, PARAMS, lora_request=loras.get(lora_id))[0]
             for lora_id in (3, None)}
    assert chat.outputs[0].token_ids == under[3].outputs[0].token_ids
    assert under[3].outputs[0].token_ids != under[None].outputs[0].token_ids


@pytest.mark.timeout(180)
def test_beam_search_runs_its_adapter(lora_setup, lora_llm):
    # One beam is the greedy sequence: HF's with each prompt's adapter merged.
    from engine import BeamSearchParams

    _, _, loras, expected = lora_setup
    params = BeamSearchParams(beam_width=1, max_tokens=MAX_TOKENS, ignore_eos=True)
    cases = [(3, 0), (None, 1), (1, 0)]
    outs = lora_llm.beam_search([{"prompt_token_ids": PROMPTS[i]} for _, i in cases], params,
                                lora_request=[loras.get(lora_id) for lora_id, _ in cases])
    assert [o.sequences[0].tokens[len(PROMPTS[i]):] for o, (_, i) in zip(outs, cases)] == [
        expected[lora_id][i] for lora_id, i in cases]


@pytest.mark.timeout(180)
def test_an_adapter_whose_folder_is_gone_ends_its_request_not_the_engine(lora_setup, tmp_path):
    """The workers read an adapter again each time it takes a slot: one
    whose folder was removed after its check ends its request with finish
    reason "error", and the engine serves the others on."""
    path, _, loras, expected = lora_setup
    folder = tmp_path / "adapter-copy"
    shutil.copytree(loras[1].lora_path, folder)
    gone = LoRARequest("gone", 7, str(folder))
    prompt = [{"prompt_token_ids": PROMPTS[0]}]

    def run(lora):
        return llm.generate(prompt, PARAMS, lora_request=lora)[0].outputs[0]

    with _llm(path, max_loras=1) as llm:
        assert run(gone).token_ids == expected[1][0]
        assert run(loras[2]).token_ids == expected[2][0]  # takes the one slot
        shutil.rmtree(folder)
        out = run(gone)
        assert (out.finish_reason, list(out.token_ids)) == ("error", [])
        assert run(loras[2]).token_ids == expected[2][0]
        assert run(None).token_ids == expected[None][0]
