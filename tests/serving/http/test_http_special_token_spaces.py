"""vLLM's ``spaces_between_special_tokens`` over HTTP, through the official
``openai`` client's ``extra_body``, on a small model whose WordPiece
decoder spaces tokens apart, added ones too (``tests/helpers/wordpiece.py``).

Reference: vLLM's detokenizer of a fast tokenizer written out
(``tests/helpers/vllm_detokenizer.py``) over the token ids the server answers with
(``return_token_ids``); the default is transformers' decode of the output
after the prompt. A seed and ``allowed_token_ids`` of words and added
tokens make outputs with added tokens in a row. Beside ``use_beam_search``
the field is taken and changes no beam's text, as in vLLM's server."""

from __future__ import annotations

import httpx
import pytest
from transformers import PreTrainedTokenizerFast

from tests.helpers.http_utils import openai_client, start_http, stop_http
from tests.helpers.vllm_detokenizer import vllm_fast_text
from tests.helpers.wordpiece import CLS, SEP, X, save_wordpiece_model, wordpiece_tokenizer

pytestmark = pytest.mark.timeout(300)

SAMPLING = {"temperature": 1.0, "seed": 3, "max_tokens": 24}
EXTRA = {"ignore_eos": True, "skip_special_tokens": False, "allowed_token_ids": [1, 2, CLS, SEP, X],
         "return_token_ids": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return save_wordpiece_model(tmp_path_factory.mktemp("wordpiece") / "model")


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    served = start_http(tmp_path_factory.mktemp("serve"), "serve", "--model", model_dir,
                        "--device", "cpu", "--disable-log-stats")
    yield served
    code, output, leftovers = stop_http(served)
    assert code == 0 and not leftovers, output


@pytest.fixture(scope="module")
def client(server):
    with openai_client(server) as c:
        yield c


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def _in_a_row(ids: list[int]) -> bool:
    added = {CLS, SEP, X}
    return any(a in added and b in added for a, b in zip(ids, ids[1:]))


def _spaced(prompt: list[int], ids: list[int]) -> str:
    """transformers' decode of ``ids`` after ``prompt``, special tokens shown."""
    hf = PreTrainedTokenizerFast(tokenizer_object=wordpiece_tokenizer())
    return hf.decode(prompt + ids, skip_special_tokens=False)[
        len(hf.decode(prompt, skip_special_tokens=False)):]


@pytest.mark.parametrize("spaces", [False, True])
def test_completions_text_whole_and_streamed(client, model, spaces):
    extra = dict(EXTRA, spaces_between_special_tokens=spaces)
    whole = client.completions.create(model=model, prompt="the cat", extra_body=extra,
                                      **SAMPLING).choices[0]
    prompt, ids = whole.model_extra["prompt_token_ids"], whole.model_extra["token_ids"]
    assert _in_a_row(ids)
    want = vllm_fast_text(wordpiece_tokenizer(), prompt, ids, False, spaces)
    assert (want == _spaced(prompt, ids)) is spaces
    assert whole.text == want
    chunks = [c.choices[0] for c in client.completions.create(
        model=model, prompt="the cat", stream=True, extra_body=extra, **SAMPLING)]
    assert [t for c in chunks for t in c.model_extra["token_ids"]] == ids
    assert "".join(c.text for c in chunks) == want


@pytest.mark.parametrize("spaces", [False, True])
def test_chat_text(server, client, model, spaces):
    """The chat's answer to the prompt its template renders is the text of
    the completion of that prompt's ids (the same seed samples the same
    tokens)."""
    messages = [{"role": "user", "content": "the cat"}]
    prompt = httpx.post(f"{server.url}/tokenize", json={"messages": messages},
                        timeout=30).json()["tokens"]
    extra = dict(EXTRA, spaces_between_special_tokens=spaces)
    ids = client.completions.create(model=model, prompt=prompt, extra_body=extra,
                                    **SAMPLING).choices[0].model_extra["token_ids"]
    assert _in_a_row(ids)
    del extra["return_token_ids"]
    chat = client.chat.completions.create(model=model, messages=messages, extra_body=extra,
                                          **SAMPLING)
    assert chat.choices[0].message.content == vllm_fast_text(wordpiece_tokenizer(), prompt,
                                                             ids, False, spaces)


def test_a_value_that_is_no_bool_is_a_400_naming_it(server, model):
    r = httpx.post(f"{server.url}/v1/completions", timeout=30, json={
        "model": model, "prompt": "the", "spaces_between_special_tokens": "maybe"})
    assert r.status_code == 400 and "spaces_between_special_tokens" in r.text


def test_beam_search_takes_the_field_and_keeps_the_spaces(server, client, model, model_dir):
    """As vLLM's server: beside ``use_beam_search`` the field is taken, and
    each beam's text is the tokenizer's decode of its tokens (special tokens
    shown), with the space before each added token after another.
    Reference: transformers' own beams of the same weights (end-of-sequence
    ids ignored), decoded by transformers."""
    import torch
    from transformers import AutoModelForCausalLM

    prompt = httpx.post(f"{server.url}/tokenize", json={"prompt": "the cat"},
                        timeout=30).json()["tokens"]
    hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        beams = hf_model.generate(torch.tensor([prompt]), num_beams=2, num_return_sequences=2,
                                  do_sample=False, max_new_tokens=10, eos_token_id=None,
                                  pad_token_id=0)
    hf = PreTrainedTokenizerFast(tokenizer_object=wordpiece_tokenizer())
    want = [hf.decode(beam[len(prompt):], skip_special_tokens=False) for beam in beams]
    assert any(_in_a_row(beam[len(prompt):].tolist()) for beam in beams)
    extra = {"use_beam_search": True, "ignore_eos": True, "skip_special_tokens": False}
    for spaces in (False, True):
        resp = client.completions.create(
            model=model, prompt="the cat", n=2, max_tokens=10,
            extra_body={**extra, "spaces_between_special_tokens": spaces})
        assert [c.text for c in resp.choices] == want
