"""vLLM's ``--lora-modules`` over HTTP, with the official ``openai`` client:
a completion or chat whose ``model`` names an adapter gets HF's greedy
tokens of the model with that adapter merged; the base name gets the base
model's; /v1/models lists the adapters with their parent; an unknown name
is a 404; without runtime updates asked for, the load and unload routes
are not there (404), as in vLLM."""

from __future__ import annotations

import openai
import pytest

from tests.helpers.http_utils import openai_client, serving_model
from tests.helpers.lora_adapters import model_with_adapters

PROMPTS = [[5, 17, 99, 3], list(range(1, 30))]
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("http-lora")
    model_dir, paths, expected = model_with_adapters(root, PROMPTS, MAX_TOKENS)
    with serving_model(root, model_dir, "--nproc-per-node", "1", "serve", "--model", model_dir,
                  "--served-model-name", "base", "--device", "cpu", "--disable-log-stats",
                  "--enable-lora", "--max-loras", "2", "--lora-modules",
                  f"sql={paths[1]}", f'{{"name": "mlp", "path": "{paths[3]}"}}') as server:
        with openai_client(server) as client:
            yield client, paths, expected


@pytest.mark.timeout(240)
def test_completions_run_the_adapter_their_model_names(served):
    client, _, expected = served
    for model, lora_id in (("sql", 1), ("base", None), ("mlp", 3)):
        answer = client.completions.create(model=model, prompt=PROMPTS, max_tokens=MAX_TOKENS,
                                           temperature=0, extra_body={"ignore_eos": True,
                                                                      "return_token_ids": True})
        assert [c.token_ids for c in answer.choices] == expected[lora_id]
        assert answer.model == model


@pytest.mark.timeout(240)
def test_models_lists_the_adapters_and_an_unknown_name_is_404(served):
    client, paths, _ = served
    models = client.models.list().data
    assert [m.id for m in models] == ["base", "sql", "mlp"]
    assert (models[1].root, models[1].parent) == (paths[1], "base")
    with pytest.raises(openai.NotFoundError, match="'nope' is not served here"):
        client.completions.create(model="nope", prompt="hi", max_tokens=1)


@pytest.mark.timeout(240)
def test_runtime_updates_are_no_routes_unless_asked(served):
    client, paths, _ = served
    for route, body in (("/load_lora_adapter", {"lora_name": "x", "lora_path": paths[2]}),
                        ("/unload_lora_adapter", {"lora_name": "sql"})):
        with pytest.raises(openai.NotFoundError):
            client.post(route, body=body, cast_to=str)
    assert [m.id for m in client.models.list().data] == ["base", "sql", "mlp"]


@pytest.fixture(scope="module")
def embedding_served(tmp_path_factory):
    """A pooling server of the same kind of model with one LoRA module, and
    HF's final-normed last hidden state of each prompt, normalized, for the
    base model and for the model with adapter 1 merged."""
    import pathlib

    import numpy as np
    import torch
    import transformers

    from tests.helpers.lora_adapters import merged, read_adapter_files

    root = tmp_path_factory.mktemp("http-lora-embed")
    model_dir, paths, _ = model_with_adapters(root, PROMPTS, 1)
    base = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    references = {}
    for name, model in (("base", base),
                        ("sql", merged(base, read_adapter_files(pathlib.Path(paths[1]))))):
        with torch.no_grad():
            last = [model.model(torch.tensor([p])).last_hidden_state[0, -1].double().numpy()
                    for p in PROMPTS]
        references[name] = [v / np.linalg.norm(v) for v in last]
    with serving_model(root, model_dir, "--nproc-per-node", "1", "serve", "--model", model_dir,
                       "--served-model-name", "base", "--device", "cpu", "--runner", "pooling",
                       "--disable-log-stats", "--enable-lora",
                       "--lora-modules", f"sql={paths[1]}") as server:
        with openai_client(server) as client:
            yield client, references


@pytest.mark.timeout(240)
def test_embeddings_run_the_adapter_their_model_names(embedding_served):
    import numpy as np

    client, references = embedding_served
    for model in ("sql", "base"):
        answer = client.embeddings.create(model=model, input=PROMPTS, encoding_format="float")
        assert answer.model == model
        for got, want in zip(answer.data, references[model], strict=True):
            np.testing.assert_allclose(got.embedding, want, atol=2e-5)
    assert not np.allclose(references["sql"][0], references["base"][0], atol=1e-3)
