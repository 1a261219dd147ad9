"""vLLM's ``stream_interval`` on a served ``tiny``, through the official
``openai`` client: a stream's chunks group that many new tokens, the first
token going out at once and the last chunk taking what is left (vLLM's
output processor's rule). Hand-worked: ``tiny`` greedy on CPU brings one
token per engine step (checked on the ungrouped stream), so ``max_tokens``
11 at interval 4 is chunks of 1, 4, 4 and 2 tokens; the text and token ids
joined are the unstreamed answer's at every interval. A server started with
``--stream-interval 4`` groups 4 tokens a chunk when the request asks for
nothing; a request's smaller interval leaves it at 4, a larger one raises it
(vLLM's rule: the larger of the two); a Responses stream groups its text
deltas by the server's interval."""

from __future__ import annotations

import pytest

from tests.helpers.http_utils import openai_client, serving_tiny

pytestmark = pytest.mark.timeout(240)

ASK = {"model": "tiny", "max_tokens": 11, "temperature": 0}
EXTRA = {"ignore_eos": True, "return_token_ids": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_tiny(tmp_path_factory.mktemp("stream_interval"), "serve", "--model", "tiny",
                      "--device", "cpu", "--disable-log-stats") as served:
        yield served


def _expected_sizes(num_tokens: int, interval: int) -> list[int]:
    """vLLM's rule for one token per step: the first token alone, then
    ``interval`` at a time, the rest in the last chunk."""
    sizes, left = [1], num_tokens - 1
    while left > 0:
        sizes.append(min(interval, left))
        left -= interval
    return sizes


@pytest.mark.parametrize("interval, sizes", [(None, [1] * 11), (1, [1] * 11),
                                             (4, [1, 4, 4, 2]), (5, [1, 5, 5]),
                                             (20, [1, 10])])
def test_completion_chunks_group_the_interval(client, interval, sizes):
    assert sizes == _expected_sizes(11, interval or 1)
    whole = client.completions.create(prompt="Once upon", extra_body=EXTRA, **ASK).choices[0]
    extra = {**EXTRA, **({"stream_interval": interval} if interval else {})}
    chunks = [c.choices[0] for c in client.completions.create(
        prompt="Once upon", stream=True, extra_body=extra, **ASK)]
    assert [len(c.model_extra["token_ids"]) for c in chunks] == sizes
    assert [t for c in chunks for t in c.model_extra["token_ids"]] == whole.model_extra[
        "token_ids"]
    assert "".join(c.text for c in chunks) == whole.text
    assert [c.finish_reason for c in chunks] == [None] * (len(sizes) - 1) + ["length"]


@pytest.mark.parametrize("interval, sizes", [(None, [1] * 11), (3, [1, 3, 3, 3, 1])])
def test_chat_chunks_group_the_interval(client, interval, sizes):
    messages = [{"role": "user", "content": "Hello"}]
    whole = client.chat.completions.create(messages=messages, extra_body=EXTRA,
                                           **ASK).choices[0]
    extra = {**EXTRA, **({"stream_interval": interval} if interval else {})}
    chunks = [c.choices[0] for c in client.chat.completions.create(
        messages=messages, stream=True, extra_body=extra, **ASK)][1:]  # after the role's
    assert [len(c.model_extra["token_ids"]) for c in chunks] == sizes
    assert [t for c in chunks for t in c.model_extra["token_ids"]] == whole.model_extra[
        "token_ids"]
    assert "".join(c.delta.content or "" for c in chunks) == whole.message.content
    assert chunks[-1].finish_reason == "length"


def test_logprobs_and_n_choices_group_each_choice(client):
    """Each choice of n keeps its own count; logprobs join with their tokens."""
    chunks = [c.choices[0] for c in client.completions.create(
        prompt="Once upon", stream=True, n=2, logprobs=1, seed=7,
        extra_body={**EXTRA, "stream_interval": 4}, **{**ASK, "temperature": 1})]
    for index in (0, 1):
        mine = [c for c in chunks if c.index == index]
        assert [len(c.model_extra["token_ids"]) for c in mine] == [1, 4, 4, 2]
        assert all(len(c.logprobs.tokens) == len(c.model_extra["token_ids"]) for c in mine)


@pytest.fixture(scope="module")
def floored_client(tmp_path_factory):
    with serving_tiny(tmp_path_factory.mktemp("stream_interval_4"), "serve", "--model", "tiny",
                      "--device", "cpu", "--disable-log-stats",
                      "--stream-interval", "4") as served, openai_client(served) as client:
        yield client


@pytest.mark.parametrize("requested, sizes", [(None, [1, 4, 4, 2]), (2, [1, 4, 4, 2]),
                                              (5, [1, 5, 5])])
def test_server_interval_is_the_floor_of_a_request_s(floored_client, requested, sizes):
    assert sizes == _expected_sizes(11, max(4, requested or 1))
    whole = floored_client.completions.create(prompt="Once upon", extra_body=EXTRA,
                                              **ASK).choices[0]
    extra = {**EXTRA, **({"stream_interval": requested} if requested else {})}
    chunks = [c.choices[0] for c in floored_client.completions.create(
        prompt="Once upon", stream=True, extra_body=extra, **ASK)]
    assert [len(c.model_extra["token_ids"]) for c in chunks] == sizes
    assert "".join(c.text for c in chunks) == whole.text


def test_responses_stream_groups_the_server_interval(floored_client):
    """A Responses stream groups its tokens by the server's interval, as
    vLLM's output processor groups every route's: each text delta carries
    its tokens' logprobs, one per token. Its text joined is the response
    answered whole."""
    ask = {"model": "tiny", "input": "Once upon", "max_output_tokens": 11, "temperature": 0,
           "include": ["message.output_text.logprobs"], "top_logprobs": 0,
           "extra_body": {"ignore_eos": True}}
    whole = floored_client.responses.create(**ask)
    deltas = [e for e in floored_client.responses.create(stream=True, **ask)
              if e.type == "response.output_text.delta"]
    assert [len(e.logprobs) for e in deltas] == _expected_sizes(11, 4) == [1, 4, 4, 2]
    assert "".join(e.delta for e in deltas) == whole.output_text
    assert [lp.token for e in deltas for lp in e.logprobs] == [
        lp.token for lp in whole.output[0].content[0].logprobs]
