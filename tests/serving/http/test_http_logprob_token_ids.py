"""vLLM's ``logprob_token_ids`` over HTTP (the official client's
``extra_body``): each generated token's ``top_logprobs`` are the token
itself, then every asked id in the list's order, whatever count
``logprobs`` gives (0 too: the list replaces the top ones, and
``logprobs`` only turns them on, as vLLM's completions show them), with
transformers' log-softmax of the same sequence; the list is held to 128
ids, not to the server's ``--max-logprobs`` (20 here), as vLLM holds it; a
list without logprobs on, too long or outside the vocabulary is a 400
naming the field."""

from __future__ import annotations

import openai
import pytest

from tests.helpers.http_utils import serving_tiny
from tests.serving.http.test_http_whole_vocab_logprobs import MESSAGES, PROMPT, _hf_greedy_rows

pytestmark = pytest.mark.timeout(240)

IDS = [65, 300, 7, 319, 0, 65]  # a repeated id; the tiny vocabulary is 320 tokens
AS_IDS = {"ignore_eos": True, "return_tokens_as_token_ids": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_tiny(tmp_path_factory.mktemp("http_logprob_ids"), "serve", "--model", "tiny",
                      "--device", "cpu", "--disable-log-stats",
                      "--served-model-name", "tiny") as served:
        yield served


def _listed(token: int) -> list[int]:
    """The ids shown after ``token``: the list's, once each, without it."""
    return [t for t in dict.fromkeys(IDS) if t != token]


@pytest.mark.parametrize("logprobs", [len(IDS), 2, 0])
def test_completion_shows_the_asked_ids(server, client, logprobs):
    prompt, rows, text = _hf_greedy_rows(server.model_dir, 3, prompt=PROMPT)
    resp = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=3, temperature=0, logprobs=logprobs,
        extra_body={**AS_IDS, "logprob_token_ids": IDS})
    assert resp.choices[0].text == text
    lp = resp.choices[0].logprobs
    assert len(lp.top_logprobs) == 3
    for token, logprob, top, row in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, rows):
        sampled = int(row.argmax())
        assert token == f"token_id:{sampled}"
        assert logprob == pytest.approx(float(row[sampled]), abs=1e-4)
        shown = [sampled, *_listed(sampled)]
        assert list(top) == [f"token_id:{t}" for t in shown]
        for t in shown:
            assert top[f"token_id:{t}"] == pytest.approx(float(row[t]), abs=1e-4)


def test_chat_shows_the_token_then_every_asked_id(server, client):
    _, rows, _ = _hf_greedy_rows(server.model_dir, 3)
    chat = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=3, temperature=0, logprobs=True,
        extra_body={**AS_IDS, "logprob_token_ids": IDS})
    content = chat.choices[0].logprobs.content
    assert len(content) == 3
    for entry, row in zip(content, rows):
        sampled = int(row.argmax())
        assert entry.token == f"token_id:{sampled}"
        shown = [sampled, *_listed(sampled)]
        assert [t.token for t in entry.top_logprobs] == [f"token_id:{t}" for t in shown]
        for t, candidate in zip(shown, entry.top_logprobs):
            assert candidate.logprob == pytest.approx(float(row[t]), abs=1e-4)


@pytest.mark.parametrize("route, body, words", [
    ("completions", {"logprob_token_ids": [1, 2]}, "needs logprobs"),
    ("chat", {"logprob_token_ids": [1, 2]}, "needs logprobs"),
    ("completions", {"logprobs": 2, "logprob_token_ids": [1, 320]}, "outside the vocabulary"),
    ("completions", {"logprobs": 2, "logprob_token_ids": list(range(129))},
     "more than the 128 allowed"),
    ("chat", {"logprobs": True, "logprob_token_ids": list(range(129))},
     "--max-logprobs, does not apply"),
    ("chat", {"logprobs": True, "logprob_token_ids": [-3]}, ">= 0"),
])
def test_bad_lists_are_a_400_naming_the_field(client, route, body, words):
    logprobs = {"logprobs": body.pop("logprobs")} if "logprobs" in body else {}
    with pytest.raises(openai.BadRequestError) as caught:
        if route == "completions":
            client.completions.create(model="tiny", prompt="hi", max_tokens=2, **logprobs,
                                      extra_body=body)
        else:
            client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2,
                                           **logprobs, extra_body=body)
    assert words in str(caught.value)
    assert caught.value.body.get("param") == "logprob_token_ids"


def test_a_streamed_chat_shows_what_a_whole_one_does(client):
    kwargs = dict(model="tiny", messages=MESSAGES, max_tokens=3, temperature=0, logprobs=True,
                  extra_body={**AS_IDS, "logprob_token_ids": IDS})
    whole = client.chat.completions.create(**kwargs).choices[0].logprobs.content
    streamed = [entry for chunk in client.chat.completions.create(**kwargs, stream=True)
                for choice in chunk.choices if choice.logprobs
                for entry in choice.logprobs.content]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in whole]
    assert len(whole) == 3 and all(len(e.top_logprobs) >= len(set(IDS)) for e in whole)


def test_a_streamed_completion_at_logprobs_0_shows_the_asked_ids(server, client):
    """The same entries streamed as whole; their values within float noise,
    as the second request may read the first one's prompt from the prefix
    cache (a chunk computed apart sums in another order)."""
    kwargs = dict(model="tiny", prompt=PROMPT, max_tokens=3, temperature=0, logprobs=0,
                  extra_body={**AS_IDS, "logprob_token_ids": IDS})
    whole = client.completions.create(**kwargs).choices[0].logprobs.top_logprobs
    streamed = [top for chunk in client.completions.create(**kwargs, stream=True)
                for choice in chunk.choices if choice.logprobs
                for top in choice.logprobs.top_logprobs]
    assert [list(top) for top in streamed] == [list(top) for top in whole] and len(whole) == 3
    for top, want in zip(streamed, whole):
        assert top == pytest.approx(want, abs=1e-5)
    assert all(set(top) >= {f"token_id:{t}" for t in IDS} for top in whole)


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_128_ids_pass_above_max_logprobs(server, client, route):
    """vLLM's rule: the list's own limit (128), not ``--max-logprobs``
    (this server's 20), which would refuse ``logprobs`` 21."""
    ids = list(range(128))
    if route == "completions":
        with pytest.raises(openai.BadRequestError, match="more than max_logprobs 20"):
            client.completions.create(model="tiny", prompt=PROMPT, max_tokens=1, logprobs=21)
        resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=1,
                                         temperature=0, logprobs=1,
                                         extra_body={**AS_IDS, "logprob_token_ids": ids})
        sampled = int(resp.choices[0].logprobs.tokens[0].split(":")[1])
        shown = list(resp.choices[0].logprobs.top_logprobs[0])
    else:
        chat = client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=1, temperature=0, logprobs=True,
            extra_body={**AS_IDS, "logprob_token_ids": ids})
        entry = chat.choices[0].logprobs.content[0]
        sampled = int(entry.token.split(":")[1])
        shown = [t.token for t in entry.top_logprobs]
    want = [sampled, *(t for t in ids if t != sampled)]
    assert shown == [f"token_id:{t}" for t in want]
