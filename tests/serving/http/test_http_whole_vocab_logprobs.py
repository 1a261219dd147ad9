"""-1 as "the whole vocabulary" over HTTP (vLLM's): with ``--max-logprobs -1``
``prompt_logprobs: -1`` (completions and chat), the completions'
``logprobs: -1`` and the chat's and Responses' ``top_logprobs: -1`` give
an entry for every vocabulary token (completions' and Responses':
transformers' log-softmax of the same sequence); under the default limit
(20, below the tiny model's 320 tokens) they are a 400 naming the field."""

from __future__ import annotations

import math

import openai
import pytest
import torch

from engine import LLM, SamplingParams
from tests.helpers.http_utils import openai_client, serving_tiny

pytestmark = pytest.mark.timeout(240)

PROMPT = "The quick brown fox"
VOCAB = 320  # checkpoint/tiny_model.py
MESSAGES = [{"role": "user", "content": PROMPT}]
LOGPROBS = "message.output_text.logprobs"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_tiny(tmp_path_factory.mktemp("http_whole_vocab"), "serve", "--model", "tiny",
                      "--device", "cpu", "--disable-log-stats", "--served-model-name", "tiny",
                      "--max-logprobs", "-1") as served:
        yield served


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    """A server with the default --max-logprobs (20)."""
    with serving_tiny(tmp_path_factory.mktemp("http_whole_vocab_capped"), "serve", "--model",
                      "tiny", "--device", "cpu", "--disable-log-stats",
                      "--served-model-name", "tiny") as served, openai_client(served) as client:
        yield client


def _logsumexp(values) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def test_prompt_logprobs_minus_one_is_every_token(server, client):
    """Every prompt position after the first holds all 320 tokens with the
    offline engine's logprobs and ranks, a whole distribution (they sum to 1)."""
    with LLM(model=server.model_dir, device="cpu", max_logprobs=-1) as llm:
        want = llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=1,
                                                   prompt_logprobs=-1))[0].prompt_logprobs
    resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=1, temperature=0,
                                     extra_body={"prompt_logprobs": -1})
    got = resp.choices[0].model_extra["prompt_logprobs"]
    assert len(got) == len(want) and got[0] is None
    for j in range(1, len(want)):
        assert set(got[j]) == {str(t) for t in range(VOCAB)}
        for token_id, entry in want[j].items():
            assert got[j][str(token_id)]["logprob"] == pytest.approx(entry.logprob, abs=1e-5)
            assert got[j][str(token_id)]["rank"] == entry.rank
        assert _logsumexp([e["logprob"] for e in got[j].values()]) == pytest.approx(0, abs=1e-3)
    chat = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1,
                                          temperature=0, extra_body={"prompt_logprobs": -1})
    plp = chat.model_extra["prompt_logprobs"]
    assert plp[0] is None and len(plp) == chat.usage.prompt_tokens
    assert all(len(entry) == VOCAB for entry in plp[1:])


def test_chat_top_logprobs_minus_one_is_every_token(client):
    """Each output token lists all 320 tokens, most likely first (the
    greedy token itself), and they make a whole distribution."""
    chat = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3,
                                          temperature=0, logprobs=True, top_logprobs=-1)
    content = chat.choices[0].logprobs.content
    assert len(content) == 3
    for token in content:
        values = [t.logprob for t in token.top_logprobs]
        assert len(values) == VOCAB
        assert values == sorted(values, reverse=True)
        assert values[0] == pytest.approx(token.logprob, abs=1e-6)
        assert _logsumexp(values) == pytest.approx(0, abs=1e-3)


def test_completions_logprobs_minus_one_is_every_token(server, client):
    """vLLM's completions ``logprobs: -1``: each output token's
    ``top_logprobs`` holds all 320 tokens (named by id, so no two share a
    name), transformers' log-softmax row of that position, the greedy
    token's own logprob its largest."""
    prompt, rows, text = _hf_greedy_rows(server.model_dir, 3, prompt=PROMPT)
    resp = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=3, temperature=0, logprobs=-1,
        extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True})
    assert resp.usage.prompt_tokens == len(prompt) and resp.choices[0].text == text
    lp = resp.choices[0].logprobs
    assert len(lp.top_logprobs) == len(rows) == 3
    for token, logprob, top, row in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, rows):
        assert set(top) == {f"token_id:{t}" for t in range(VOCAB)}
        assert token == f"token_id:{int(row.argmax())}"
        assert logprob == pytest.approx(float(row.max()), abs=1e-4)
        want = torch.tensor([float(row[t]) for t in range(VOCAB)], dtype=torch.float64)
        got = torch.tensor([top[f"token_id:{t}"] for t in range(VOCAB)], dtype=torch.float64)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def _hf_greedy_rows(model_dir: str, steps: int,
                    prompt: str | None = None) -> tuple[list[int], list[torch.Tensor], str]:
    """transformers' greedy answer to MESSAGES (its chat template), or to
    the text ``prompt`` (its tokenizer's ids): the prompt's token ids, each
    answer token's log-softmax row and the text."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir,
                                                              dtype=torch.float32).eval()
    if prompt is not None:
        ids = tokenizer(prompt).input_ids
    else:
        ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    prompt = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    sequence, rows = list(prompt), []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([sequence])).logits[0, -1]
            rows.append(torch.log_softmax(logits.double(), dim=-1))
            sequence.append(int(rows[-1].argmax()))
    text = tokenizer.decode(sequence[len(prompt):], skip_special_tokens=True)
    return prompt, rows, text


def test_responses_top_logprobs_minus_one_is_every_token(server, client):
    """Responses' ``top_logprobs: -1`` (with ``include`` logprobs) lists,
    for each greedy output token, all 320 tokens, most likely first: the
    values are transformers' log-softmax row of that position, the token's
    own logprob its largest, and the text is transformers' greedy text."""
    prompt, rows, text = _hf_greedy_rows(server.model_dir, 3)
    response = client.responses.create(model="tiny", input=PROMPT, max_output_tokens=3,
                                       temperature=0, include=[LOGPROBS], top_logprobs=-1,
                                       extra_body={"ignore_eos": True})
    assert response.usage.input_tokens == len(prompt)
    assert response.output_text == text and response.top_logprobs == -1
    entries = response.output[0].content[0].logprobs
    assert len(entries) == len(rows) == 3
    for entry, row in zip(entries, rows):
        values = [t.logprob for t in entry.top_logprobs]
        assert len(values) == VOCAB and values == sorted(values, reverse=True)
        want = sorted(row.tolist(), reverse=True)
        torch.testing.assert_close(torch.tensor(values, dtype=torch.float64),
                                   torch.tensor(want, dtype=torch.float64), atol=1e-4, rtol=0)
        assert entry.logprob == pytest.approx(want[0], abs=1e-4)
        assert entry.top_logprobs[0].token == entry.token


def test_minus_one_is_refused_under_the_default_limit(capped):
    asks = [
        ("prompt_logprobs", lambda: capped.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=1, extra_body={"prompt_logprobs": -1})),
        ("logprobs", lambda: capped.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=1, logprobs=-1)),
        ("top_logprobs", lambda: capped.chat.completions.create(
            model="tiny", max_tokens=1, logprobs=True, top_logprobs=-1, messages=MESSAGES)),
        ("prompt_logprobs", lambda: capped.chat.completions.create(
            model="tiny", max_tokens=1, messages=MESSAGES, extra_body={"prompt_logprobs": -1})),
        ("top_logprobs", lambda: capped.responses.create(
            model="tiny", input=PROMPT, max_output_tokens=1, include=[LOGPROBS],
            top_logprobs=-1)),
    ]
    for field, ask in asks:
        with pytest.raises(openai.BadRequestError) as raised:
            ask()
        assert raised.value.param == field
        assert (f"{field} -1 (the whole vocabulary, {VOCAB} tokens) is more than "
                "max_logprobs 20") in raised.value.message
    # The server keeps serving.
    ok = capped.chat.completions.create(model="tiny", max_tokens=1, logprobs=True,
                                        top_logprobs=20, messages=MESSAGES)
    assert len(ok.choices[0].logprobs.content[0].top_logprobs) == 20
