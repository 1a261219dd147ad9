"""``use_beam_search`` (vLLM's) through the official ``openai`` client
against ``tprun serve --http-port`` (tiny, float32, CPU): with
end-of-sequence ids ignored, every choice is one of transformers' own beams
of the same weights, best first (the prompt tokenized by the server's
/tokenize), its token ids the beam's with vLLM's ``return_token_ids``; fields beam search does not take are 400s naming them, and a
request asking more logprobs than the server allows says why."""

from __future__ import annotations

import httpx
import pytest
import torch
import transformers

from tests.helpers.http_utils import serving_tiny

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_tiny(tmp_path_factory.mktemp("http_beams"), "serve", "--model", "tiny",
                      "--device", "cpu", "--dtype", "float32", "--disable-log-stats",
                      "--max-logprobs", "8", "--max-model-len", "128") as served:
        yield served


@pytest.fixture(scope="module")
def hf(server):
    model = transformers.AutoModelForCausalLM.from_pretrained(server.model_dir,
                                                              dtype=torch.float32).eval()
    return model, transformers.AutoTokenizer.from_pretrained(server.model_dir)


def _beams(hf, prompt: list[int], width: int, steps: int) -> list[tuple[str, list[int]]]:
    """transformers' beams: each one's text and token ids, best first."""
    model, tokenizer = hf
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), num_beams=width,
                             num_return_sequences=width, do_sample=False, max_new_tokens=steps,
                             eos_token_id=None, pad_token_id=0)
    return [(tokenizer.decode(s[len(prompt):], skip_special_tokens=True),
             s[len(prompt):].tolist()) for s in out]


def _tokens(server, **body) -> list[int]:
    return httpx.post(f"{server.url}/tokenize", json={"model": "tiny", **body},
                      timeout=60).json()["tokens"]


def test_completion_choices_are_transformers_beams(server, client, hf):
    prompts = ["The quick brown fox", "Once upon"]
    resp = client.completions.create(model="tiny", prompt=prompts, n=3, max_tokens=6,
                                     extra_body={"use_beam_search": True, "ignore_eos": True,
                                                 "return_token_ids": True})
    ids = [_tokens(server, prompt=p) for p in prompts]
    want = [beam for p in ids for beam in _beams(hf, p, 3, 6)]
    assert [c.index for c in resp.choices] == list(range(6))
    assert [(c.text, c.model_extra["token_ids"]) for c in resp.choices] == want
    assert [c.model_extra["prompt_token_ids"] for c in resp.choices] == [ids[0]] * 3 + \
        [ids[1]] * 3
    assert all(c.finish_reason == "length" for c in resp.choices)
    assert resp.usage.prompt_tokens == sum(map(len, ids))
    assert resp.usage.completion_tokens == 6 * 6


def test_chat_choices_are_transformers_beams(server, client, hf):
    messages = [{"role": "user", "content": "Name a color."}]
    resp = client.chat.completions.create(model="tiny", messages=messages, n=2, max_tokens=5,
                                          extra_body={"use_beam_search": True,
                                                      "ignore_eos": True,
                                                      "return_token_ids": True})
    prompt = _tokens(server, messages=messages)
    want = _beams(hf, prompt, 2, 5)
    assert [(c.message.content, c.model_extra["token_ids"]) for c in resp.choices] == want
    assert resp.model_extra["prompt_token_ids"] == prompt
    assert resp.object == "chat.completion"


@pytest.mark.parametrize("fields, message, param", [
    ({"stream": True}, "use_beam_search does not take stream", None),
    ({"stop": ["x"], "seed": 3}, "use_beam_search does not take seed, stop", None),
    # The engine refuses the logprobs beam search asks; the 400 blames n.
    ({"n": 5}, "use_beam_search with n 5 asks 10 logprobs a token", "n"),
    ({"prompt": [7] * 128}, "a prompt of 128 tokens leaves no room under max_model_len 128",
     None),
])
def test_what_beam_search_does_not_take_is_refused(server, client, fields, message, param):
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 3, "use_beam_search": True, **fields}
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 400 and message in response.json()["error"]["message"]
    assert response.json()["error"]["param"] == param
    served = client.completions.create(model="tiny", prompt="hi", max_tokens=3,
                                       extra_body={"use_beam_search": True})
    assert len(served.choices) == 1


@pytest.mark.parametrize("penalty", [1e30, -1e308])
def test_an_extreme_length_penalty_is_answered(server, penalty):
    """Scores are ranked through logarithms: no overflow, no division by 0."""
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 3, "n": 2, "use_beam_search": True,
            "length_penalty": penalty}
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200 and len(response.json()["choices"]) == 2


def test_an_infinite_length_penalty_is_refused(server):
    body = (b'{"model": "tiny", "prompt": "hi", "max_tokens": 2, "use_beam_search": true, '
            b'"length_penalty": 1e999}')  # JSON's number past the float range: inf
    response = httpx.post(f"{server.url}/v1/completions", content=body, timeout=60,
                          headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert "length_penalty must be a finite number" in response.json()["error"]["message"]


def test_fields_at_their_defaults_are_not_refused(client):
    """A client that sends every field (at its default) is answered."""
    served = client.completions.create(
        model="tiny", prompt="hi", max_tokens=3, n=2, frequency_penalty=0, presence_penalty=0,
        stop=None, extra_body={"use_beam_search": True, "min_tokens": 0, "top_k": None})
    assert len(served.choices) == 2
