"""vLLM's runtime LoRA updates (``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``)
with the official ``openai`` client: an adapter loaded over HTTP is listed
and runs as HF's model with it merged (greedy tokens); a bad one is
refused with vLLM's statuses; an unloaded one is gone from /v1/models and
a request naming it is a 404, while a request already running with it
finishes with it."""

from __future__ import annotations

import os
import shutil

import openai
import pytest

from tests.helpers.http_utils import openai_client, serving_model
from tests.helpers.lora_adapters import model_with_adapters

PROMPTS = [[5, 17, 99, 3], list(range(1, 30))]
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A server started with runtime updates on (vLLM's variable), one
    ``--lora-modules`` adapter, and rank 8 at most (adapter 3 has 16)."""
    root = tmp_path_factory.mktemp("http-lora-updates")
    model_dir, paths, expected = model_with_adapters(root, PROMPTS, MAX_TOKENS)
    with serving_model(root, model_dir, "--nproc-per-node", "1", "serve", "--model", model_dir,
                       "--served-model-name", "base", "--device", "cpu",
                       "--disable-log-stats", "--enable-lora", "--max-loras", "1",
                       "--max-lora-rank", "8", "--lora-modules", f"mlp={paths[2]}",
                       env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}) as server:
        with openai_client(server) as client:
            yield client, paths, expected


def _load(client, name: str, path: str) -> str:
    return client.post("/load_lora_adapter", body={"lora_name": name, "lora_path": path},
                       cast_to=str)


def _unload(client, name: str) -> str:
    return client.post("/unload_lora_adapter", body={"lora_name": name}, cast_to=str)


def _tokens(client, model: str) -> list[list[int]]:
    answer = client.completions.create(model=model, prompt=PROMPTS, max_tokens=MAX_TOKENS,
                                       temperature=0, extra_body={"ignore_eos": True,
                                                                  "return_token_ids": True})
    assert answer.model == model
    return [c.token_ids for c in answer.choices]


@pytest.mark.timeout(300)
def test_a_loaded_adapter_runs_as_hf_merged_and_an_unloaded_one_is_gone(served):
    client, paths, expected = served
    assert _load(client, "sql", paths[1]) == "Success: LoRA adapter 'sql' added successfully."
    models = client.models.list().data
    assert [m.id for m in models] == ["base", "mlp", "sql"]
    assert (models[2].root, models[2].parent) == (paths[1], "base")
    assert _tokens(client, "sql") == expected[1]
    assert _tokens(client, "mlp") == expected[2]  # one slot: the adapters take turns
    assert _tokens(client, "base") == expected[None]

    assert _unload(client, "sql") == "Success: LoRA adapter 'sql' removed successfully."
    assert [m.id for m in client.models.list().data] == ["base", "mlp"]
    with pytest.raises(openai.NotFoundError, match="'sql' is not served here") as e:
        _tokens(client, "sql")
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError, match="'sql' is not loaded"):
        _unload(client, "sql")

    # Loaded again from the same path, it serves again.
    _load(client, "sql", paths[1])
    assert _tokens(client, "sql") == expected[1]
    # A --lora-modules adapter may be unloaded too.
    _unload(client, "mlp")
    assert [m.id for m in client.models.list().data] == ["base", "sql"]
    with pytest.raises(openai.NotFoundError):
        _tokens(client, "mlp")


@pytest.mark.timeout(300)
def test_loads_the_server_cannot_take_are_refused(served):
    client, paths, expected = served
    _load(client, "rsl", paths[2])
    with pytest.raises(openai.BadRequestError, match="'rsl' is loaded already"):
        _load(client, "rsl", paths[1])
    for missing in (paths[1] + "-missing", paths[1] + "\0"):
        with pytest.raises(openai.NotFoundError, match="no such directory"):
            _load(client, "gone", missing)
    with pytest.raises(openai.BadRequestError, match="LoRA rank 16 is greater than max_lora_rank 8"):
        _load(client, "big", paths[3])
    with pytest.raises(openai.BadRequestError, match="name of the base model"):
        _load(client, "base", paths[1])
    with pytest.raises(openai.BadRequestError, match="lora_path"):
        client.post("/load_lora_adapter", body={"lora_name": "x"}, cast_to=str)
    # An unloaded name keeps its adapter: another path under it is refused.
    _unload(client, "rsl")
    with pytest.raises(openai.BadRequestError, match="give this adapter a name of its own"):
        _load(client, "rsl", paths[1])
    names = [m.id for m in client.models.list().data]
    assert not {"rsl", "gone", "big"} & set(names)
    assert _tokens(client, "base") == expected[None]


@pytest.mark.timeout(300)
def test_a_request_running_with_an_adapter_finishes_after_its_unload(served):
    client, paths, expected = served
    _load(client, "run", paths[1])
    stream = client.completions.create(model="run", prompt=PROMPTS[1], max_tokens=MAX_TOKENS,
                                       temperature=0, stream=True,
                                       extra_body={"ignore_eos": True, "return_token_ids": True})
    chunks = iter(stream)
    tokens = list(next(chunks).choices[0].token_ids or [])
    assert tokens  # the request is in the engine
    _unload(client, "run")
    for chunk in chunks:
        for choice in chunk.choices:
            tokens += choice.token_ids or []
    assert tokens == expected[1][1]
    with pytest.raises(openai.NotFoundError):
        _tokens(client, "run")


@pytest.mark.timeout(300)
def test_a_name_loaded_again_from_files_changed_since_is_refused(served, tmp_path):
    """A name loaded again from its path keeps its id, and the engine binds
    an id to the adapter it first read: new files there (an adapter trained
    again into its folder) would run as the old weights, so they are
    refused under that name and served under a new one."""
    client, paths, expected = served
    folder = tmp_path / "retrained"
    shutil.copytree(paths[1], folder)
    _load(client, "tuned", str(folder))
    assert _tokens(client, "tuned") == expected[1]
    _unload(client, "tuned")
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copyfile(os.path.join(paths[2], name), folder / name)
    with pytest.raises(openai.BadRequestError, match="changed since 'tuned' was loaded"):
        _load(client, "tuned", str(folder))
    assert "tuned" not in [m.id for m in client.models.list().data]
    _load(client, "tuned-again", str(folder))
    assert _tokens(client, "tuned-again") == expected[2]


def test_a_request_checked_before_an_unload_is_refused_after_it():
    """A route checks its model first and asks for the adapter after its
    awaits (tokenizing): an unload in between is a 404, never the base
    model under the adapter's name."""
    from ipc.lora_request import LoRARequest
    from serving.http.state import ServerState, UnknownModelError

    state = ServerState(link=None, tokenizer=None, served_names=("base",), max_model_len=64,
                        metrics=None, logprobs=None,
                        lora_modules={"sql": LoRARequest("sql", 1, "/adapters/sql")})
    state.check_model("sql")
    assert state.lora_request("sql") == LoRARequest("sql", 1, "/adapters/sql")
    del state.lora_modules["sql"]  # what an unload does
    with pytest.raises(UnknownModelError, match="'sql' is not served here"):
        state.lora_request("sql")
    assert state.lora_request("base") is None and state.lora_request(None) is None
