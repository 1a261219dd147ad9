"""vLLM's ``cache_salt`` over HTTP, sent by the official ``openai`` client in
``extra_body``: ``usage.prompt_tokens_details.cached_tokens`` (the
Responses API's ``usage.input_tokens_details.cached_tokens``) shows that
requests of different salts (or a salt and none) share no cached block and
requests of one salt do; the greedy text is the unsalted one; an empty salt
is a 400 naming the field, as vLLM answers it."""

from __future__ import annotations

import openai
import pytest

from tests.helpers.http_utils import serving_tiny

PROMPT = "a prompt of more than one cache block, " * 3


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_tiny(tmp_path_factory.mktemp("cache-salt"), "--nproc-per-node", "1", "serve",
                      "--model", "tiny", "--device", "cpu", "--max-model-len", "256",
                      "--block-size", "16", "--disable-log-stats") as served:
        yield served


def _completion(client, salt: str | None, prompt: str = PROMPT):
    extra = {"ignore_eos": True} | ({"cache_salt": salt} if salt is not None else {})
    return client.completions.create(model="tiny", prompt=prompt, max_tokens=4,
                                     temperature=0, extra_body=extra)


@pytest.mark.timeout(180)
def test_completions_share_cached_blocks_only_within_a_salt(client):
    """One prompt, one request after another: a first salt and a second find
    nothing cached, the first again finds every full block of the prompt
    before its last token, no salt finds nothing, then itself."""
    answers = [_completion(client, salt) for salt in ("x", "y", "x", None, None)]
    full = 16 * ((answers[0].usage.prompt_tokens - 1) // 16)
    assert full >= 16
    assert [a.usage.prompt_tokens_details.cached_tokens for a in answers] == \
        [0, 0, full, 0, full]
    assert len({a.choices[0].text for a in answers}) == 1


@pytest.mark.timeout(180)
def test_chat_shares_cached_blocks_only_within_a_salt(client):
    messages = [{"role": "user", "content": "a chat message of more than one block " * 3}]

    def chat(salt: str | None):
        return client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=4, temperature=0,
            extra_body={"ignore_eos": True} | ({"cache_salt": salt} if salt else {}))

    answers = [chat(salt) for salt in ("p", "q", "p", None)]
    full = 16 * ((answers[0].usage.prompt_tokens - 1) // 16)
    assert full >= 16
    assert [a.usage.prompt_tokens_details.cached_tokens for a in answers] == [0, 0, full, 0]
    assert len({a.choices[0].message.content for a in answers}) == 1


@pytest.mark.timeout(180)
def test_responses_share_cached_blocks_only_within_a_salt(client):
    text = "a responses input of more than one block " * 3

    def respond(salt: str | None):
        return client.responses.create(
            model="tiny", input=text, max_output_tokens=4, temperature=0, store=False,
            extra_body={"ignore_eos": True} | ({"cache_salt": salt} if salt else {}))

    answers = [respond(salt) for salt in ("r", "s", "r", None)]
    full = 16 * ((answers[0].usage.input_tokens - 1) // 16)
    assert full >= 16
    assert [a.usage.input_tokens_details.cached_tokens for a in answers] == [0, 0, full, 0]
    assert len({a.output_text for a in answers}) == 1


@pytest.mark.timeout(60)
def test_an_empty_salt_is_refused_by_responses(client):
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="tiny", input="hi", max_output_tokens=2, store=False,
                                extra_body={"cache_salt": ""})
    assert raised.value.body["param"] == "cache_salt"
    assert "cache_salt must be a non-empty string" in raised.value.body["message"]


@pytest.mark.timeout(60)
def test_an_empty_salt_is_refused(client):
    with pytest.raises(openai.BadRequestError) as raised:
        _completion(client, "", prompt="hi")
    assert raised.value.body["param"] == "cache_salt"
    assert "cache_salt must be a non-empty string" in raised.value.body["message"]
