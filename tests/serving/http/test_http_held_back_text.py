"""Over HTTP, through the official ``openai`` client: an answer forced to
end inside a UTF-8 character ("a", 0xC3, "a", 0xC3: ``logit_bias`` favours
both, ``bad_words`` ["aa"] bans an "a" after an "a") has vLLM's text,
whole and streamed: the lead byte at the end, which vLLM's detokenizer
still holds back when the request ends, is not shown; the one inside is
U+FFFD. Reference: tokenizers' ``DecodeStream`` as vLLM uses it
(``tests/helpers/vllm_detokenizer.py``) over the prompt and answer ids the
server returns."""

from __future__ import annotations

import httpx
import pytest
from tokenizers import Tokenizer

from tests.helpers.http_utils import serving_tiny
from tests.helpers.vllm_detokenizer import vllm_fast_text

pytestmark = pytest.mark.timeout(240)

A, LEAD = ord("a"), 0xC3
FORCED = {"temperature": 0, "max_tokens": 4, "logit_bias": {str(A): 100, str(LEAD): 50}}
EXTRA = {"bad_words": ["aa"], "ignore_eos": True, "return_token_ids": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_tiny(tmp_path_factory.mktemp("held_back"), "serve", "--model", "tiny",
                      "--device", "cpu", "--disable-log-stats") as served:
        yield served


@pytest.fixture(scope="module")
def hf(server) -> Tokenizer:
    return Tokenizer.from_file(f"{server.model_dir}/tokenizer.json")


@pytest.mark.parametrize("stop", [None, ["never-here"]])
def test_completion_whole_and_streamed(client, hf, stop):
    whole = client.completions.create(model="tiny", prompt="x", stop=stop, extra_body=EXTRA,
                                      **FORCED).choices[0]
    prompt, ids = whole.model_extra["prompt_token_ids"], whole.model_extra["token_ids"]
    assert ids == [A, LEAD, A, LEAD]
    want = vllm_fast_text(hf, prompt, ids)
    assert want == "a\ufffda" == whole.text
    chunks = [c.choices[0] for c in client.completions.create(
        model="tiny", prompt="x", stop=stop, stream=True, extra_body=EXTRA, **FORCED)]
    assert [t for c in chunks for t in c.model_extra["token_ids"]] == ids
    assert "".join(c.text for c in chunks) == want


def test_chat_whole_and_streamed(server, client, hf):
    """The answer's ids from its logprobs (``return_tokens_as_token_ids``),
    the prompt's from /tokenize."""
    messages = [{"role": "user", "content": "x"}]
    extra = {"bad_words": ["aa"], "ignore_eos": True, "return_tokens_as_token_ids": True}
    whole = client.chat.completions.create(model="tiny", messages=messages, logprobs=True,
                                           extra_body=extra, **FORCED).choices[0]
    ids = [int(t.token.removeprefix("token_id:")) for t in whole.logprobs.content]
    assert ids == [A, LEAD, A, LEAD]
    prompt = httpx.post(f"{server.url}/tokenize", json={"model": "tiny", "messages": messages},
                        timeout=30).json()["tokens"]
    want = vllm_fast_text(hf, prompt, ids)
    assert whole.message.content == want == "a\ufffda"
    chunks = client.chat.completions.create(model="tiny", messages=messages, stream=True,
                                            extra_body=extra, **FORCED)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want


EURO = list("€".encode())  # E2 82 AC


@pytest.mark.parametrize("stop", [None, ["never-here"]])
@pytest.mark.parametrize("max_tokens, want", [(1, "€"), (3, "€")])
def test_completion_after_a_prompt_that_ends_inside_a_character(client, hf, stop, max_tokens,
                                                                want):
    """Prompt ids "x" and the first two bytes of "€"; the answer forced to
    its last byte (``logit_bias``), then the same byte again (a stray
    continuation byte, U+FFFD, held back at the end): its text, whole and
    streamed, is "€", the text of prompt and answer decoded together less
    the prompt's "x"."""
    prompt = [*hf.encode("x").ids, *EURO[:2]]
    forced = {"temperature": 0, "max_tokens": max_tokens, "logit_bias": {str(EURO[2]): 100}}
    extra = {"ignore_eos": True, "return_token_ids": True}
    whole = client.completions.create(model="tiny", prompt=prompt, stop=stop, extra_body=extra,
                                      **forced).choices[0]
    ids = whole.model_extra["token_ids"]
    assert ids == [EURO[2]] * max_tokens
    assert hf.decode(prompt) == "x\ufffd"
    assert hf.decode([*prompt, EURO[2]]) == "x€"
    assert whole.text == want == vllm_fast_text(hf, prompt, ids)
    chunks = [c.choices[0] for c in client.completions.create(
        model="tiny", prompt=prompt, stop=stop, stream=True, extra_body=extra, **forced)]
    assert [t for c in chunks for t in c.model_extra["token_ids"]] == ids
    assert chunks[0].text == want
    assert "".join(c.text for c in chunks) == want
