"""An answer's id, as vLLM's server makes it, through the official
``openai`` client (in process, over a link that answers every request at
once): the route's prefix before the ``X-Request-Id`` header, else the
body's ``request_id``, else a random id; every chunk of a stream has it."""

from __future__ import annotations

import openai
import pytest
from fastapi.testclient import TestClient

from checkpoint.tiny_model import ensure_tiny_model
from checkpoint.tokenizer import Tokenizer
from serving.http.app import create_app
from tests.helpers.engine_links import AnsweringLink

MESSAGES = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    tokenizer = Tokenizer.from_dir(ensure_tiny_model(str(tmp_path_factory.mktemp("ids"))))
    link = AnsweringLink([104, 105], "hi", "stop")
    with TestClient(create_app(link, tokenizer, ["tiny"], 4096)) as http:
        yield openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http,
                            max_retries=0)


def _chat(client, **fields):
    return client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2,
                                          **fields)


def _completion(client, **fields):
    return client.completions.create(model="tiny", prompt="Hello", max_tokens=2, **fields)


@pytest.mark.parametrize("ask, prefix", [(_chat, "chatcmpl-"), (_completion, "cmpl-")])
def test_the_id_is_the_request_ones(client, ask, prefix):
    assert ask(client, extra_body={"request_id": "job-7"}).id == prefix + "job-7"
    header = {"X-Request-Id": "trace-1"}
    assert ask(client, extra_headers=header).id == prefix + "trace-1"
    assert ask(client, extra_headers=header,
               extra_body={"request_id": "job-7"}).id == prefix + "trace-1"  # the header wins
    chunks = list(ask(client, stream=True, n=2, extra_body={"request_id": "job-8"}))
    assert len(chunks) >= 2 and {c.id for c in chunks} == {prefix + "job-8"}
    fresh = {ask(client).id for _ in range(2)}
    assert len(fresh) == 2 and all(i.startswith(prefix) and len(i) > len(prefix) for i in fresh)


def test_beam_search_answers_take_it_too(client):
    beams = client.completions.create(model="tiny", prompt="Hello", max_tokens=1, n=1,
                                      extra_body={"use_beam_search": True, "request_id": "b"})
    assert beams.id == "cmpl-b"
