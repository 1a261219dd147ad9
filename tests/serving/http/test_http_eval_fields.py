"""The request fields evaluation harnesses and benchmark clients send, through
the official ``openai`` client and httpx against ``tprun serve --http-port``
(tiny, TP=1, CPU), each checked against ``LLM.generate`` in this process:
``echo`` (with ``logprobs`` and ``max_tokens`` 0), ``prompt_logprobs``,
``min_tokens`` (stop ids, and stop strings), ``stream_options.continuous_usage_stats``,
``usage.prompt_tokens_details.cached_tokens``, ``return_token_ids``,
``return_tokens_as_token_ids``, ``add_special_tokens``, ``max_tokens`` null, ``best_of``
(ignored), ``logit_bias``,
``allowed_token_ids`` and ``bad_words``, ``/tokenize`` /
``/detokenize`` / ``/tokenizer_info``, the access log; a field the server
does not implement stays a 400 that names it."""

from __future__ import annotations

import importlib.metadata

import httpx
import openai
import pytest

from engine import LLM, SamplingParams
from ipc.messages import MAX_BAD_WORD_TOKENS
from tests.helpers.http_utils import serving_tiny

pytestmark = pytest.mark.timeout(180)

PROMPT = "The quick brown fox jumps over"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_tiny(tmp_path_factory.mktemp("http_eval"), "serve", "--model", "tiny",
                      "--device", "cpu", "--disable-log-stats", "--served-model-name", "tiny",
                      "tiny-alias", "--max-num-batched-tokens", "32", "--max-logprobs",
                      "30") as served:
        yield served


@pytest.fixture(scope="module")
def reference(server):
    with LLM(model=server.model_dir, device="cpu") as llm:
        yield llm


def _prompt_lps(reference, prompt: str, k: int):
    out = reference.generate(prompt, SamplingParams(temperature=0.0, max_tokens=1,
                                                    prompt_logprobs=k))[0]
    return out.prompt_token_ids, out.prompt_logprobs


def test_echo_with_logprobs_and_no_new_tokens(client, reference):
    """What lm-eval's loglikelihood requests look like (here with max_tokens 0)."""
    ids, want = _prompt_lps(reference, PROMPT, 2)
    resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=0, echo=True,
                                     logprobs=2, temperature=0)
    choice = resp.choices[0]
    assert choice.text == PROMPT
    assert choice.finish_reason == "length"
    assert resp.usage.completion_tokens == 0 and resp.usage.prompt_tokens == len(ids)
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids)
    assert lp.tokens[0] == "<s>" and "".join(lp.tokens[1:]) == PROMPT  # BOS, then bytes
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    outside = 0  # prompt tokens outside their position's top 2
    for j in range(1, len(ids)):
        assert lp.token_logprobs[j] == pytest.approx(want[j][ids[j]].logprob, abs=1e-5)
        # OpenAI's legacy shape (vLLM's): the token itself first, then the top 2.
        top = lp.top_logprobs[j]
        ranked = sorted(want[j].values(), key=lambda e: -e.logprob)[:2]
        in_top = want[j][ids[j]].rank <= 2
        outside += not in_top
        assert len(top) == (2 if in_top else 3)
        assert next(iter(top)) == lp.tokens[j]
        assert top[lp.tokens[j]] == lp.token_logprobs[j]
        assert sorted(top.values(), reverse=True)[:2] == pytest.approx(
            [e.logprob for e in ranked], abs=1e-5)
    assert outside > 0  # the byte-level prompt is not what the tiny model expects
    assert lp.text_offset == [0] + [3 + i for i in range(len(PROMPT))]


def test_echo_then_completion(client, reference):
    """lm-eval's shape: max_tokens 1, logprobs 1, echo; the generated token
    follows the prompt's, its offset after the prompt's text."""
    ids, want = _prompt_lps(reference, PROMPT, 1)
    ref = reference.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=3,
                                                    logprobs=1))[0].outputs[0]
    resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, echo=True,
                                     logprobs=1, temperature=0)
    choice = resp.choices[0]
    assert choice.text == PROMPT + ref.text
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) + 3
    assert lp.token_logprobs[len(ids):] == pytest.approx(
        [e[t].logprob for t, e in zip(ref.token_ids, ref.logprobs)], abs=1e-5)
    assert lp.token_logprobs[1:len(ids)] == pytest.approx(
        [want[j][ids[j]].logprob for j in range(1, len(ids))], abs=1e-5)
    assert lp.text_offset[len(ids)] == len("<s>" + PROMPT)  # on over the prompt's tokens


def test_echo_of_token_prompt_and_stream(client, reference):
    ids = reference.get_tokenizer().encode(PROMPT)
    stream = client.completions.create(model="tiny", prompt=ids, max_tokens=4, echo=True,
                                       temperature=0, stream=True)
    text = "".join(c.choices[0].text for c in stream if c.choices)
    ref = reference.generate({"prompt_token_ids": ids},
                             SamplingParams(temperature=0.0, max_tokens=4))[0].outputs[0]
    assert text == PROMPT + ref.text


def test_sampled_tokens_lead_their_top_logprobs(client, reference):
    """Sampled tokens outside the top ``logprobs`` are shown too, first (the
    legacy completions shape, vLLM's); at ``logprobs`` 0 only they are."""
    params = dict(temperature=2.0, seed=5, max_tokens=12)
    ref = reference.generate(PROMPT, SamplingParams(logprobs=1, **params))[0].outputs[0]
    for k in (1, 0):
        resp = client.completions.create(model="tiny", prompt=PROMPT, logprobs=k, **params)
        lp = resp.choices[0].logprobs
        assert resp.choices[0].text == ref.text
        below = 0  # sampled tokens ranked below 1
        for token, logprob, top, token_id, candidates in zip(
                lp.tokens, lp.token_logprobs, lp.top_logprobs, ref.token_ids, ref.logprobs):
            assert next(iter(top)) == token and top[token] == logprob
            assert logprob == pytest.approx(candidates[token_id].logprob, abs=1e-5)
            best = min(candidates.values(), key=lambda e: e.rank)
            below += candidates[token_id].rank > 1
            if k:
                assert len(top) == 1 + (candidates[token_id].rank > 1)
                assert max(top.values()) == pytest.approx(best.logprob, abs=1e-5)
            else:
                assert len(top) == 1
        assert below > 0


def test_logprobs_are_bounded_by_max_logprobs(client):
    """The server's --max-logprobs (30 here) bounds ``logprobs``,
    ``top_logprobs`` and ``prompt_logprobs``, not OpenAI's 20; past it, the
    400 names the field the client sent, in its ``param`` and message."""
    resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, logprobs=25,
                                     temperature=0)
    assert [len(top) for top in resp.choices[0].logprobs.top_logprobs] == [25, 25]  # greedy
    chat = client.chat.completions.create(model="tiny", max_tokens=2, logprobs=True,
                                          top_logprobs=25,
                                          messages=[{"role": "user", "content": PROMPT}])
    assert [len(t.top_logprobs) for t in chat.choices[0].logprobs.content] == [25, 25]
    messages = [{"role": "user", "content": PROMPT}]
    asks = [
        ("logprobs", lambda: client.completions.create(model="tiny", prompt=PROMPT,
                                                       max_tokens=2, logprobs=31)),
        ("logprobs", lambda: client.completions.create(model="tiny", prompt=PROMPT,
                                                       max_tokens=2, logprobs=31, echo=True)),
        ("prompt_logprobs", lambda: client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=2, extra_body={"prompt_logprobs": 31})),
        ("top_logprobs", lambda: client.chat.completions.create(
            model="tiny", max_tokens=2, logprobs=True, top_logprobs=31, messages=messages)),
        ("prompt_logprobs", lambda: client.chat.completions.create(
            model="tiny", max_tokens=2, messages=messages, extra_body={"prompt_logprobs": 31})),
        ("top_logprobs", lambda: client.responses.create(
            model="tiny", input=PROMPT, max_output_tokens=2, top_logprobs=31,
            include=["message.output_text.logprobs"])),
    ]
    for field, ask in asks:  # the 400 names the field the client sent
        with pytest.raises(openai.BadRequestError) as raised:
            ask()
        assert raised.value.param == field
        assert f"{field} 31 is more than max_logprobs 30" in raised.value.message
    with pytest.raises(openai.BadRequestError) as raised:  # top_logprobs without logprobs
        client.chat.completions.create(model="tiny", max_tokens=2, top_logprobs=3,
                                       messages=messages)
    assert raised.value.param == "top_logprobs"
    assert "top_logprobs needs logprobs: true" in raised.value.message


def test_prompt_logprobs_in_extra_body(client, reference):
    ids, want = _prompt_lps(reference, PROMPT, 3)
    resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=1, temperature=0,
                                     extra_body={"prompt_logprobs": 3})
    got = resp.choices[0].model_extra["prompt_logprobs"]
    assert len(got) == len(ids) and got[0] is None
    for j in range(1, len(ids)):
        assert set(got[j]) == {str(t) for t in want[j]}
        for token_id, entry in want[j].items():
            assert got[j][str(token_id)]["logprob"] == pytest.approx(entry.logprob, abs=1e-5)
            assert got[j][str(token_id)]["rank"] == entry.rank
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=1,
        temperature=0, extra_body={"prompt_logprobs": 0})
    plp = chat.model_extra["prompt_logprobs"]
    assert plp[0] is None and len(plp) == chat.usage.prompt_tokens
    assert all(len(entry) == 1 for entry in plp[1:])


def test_min_tokens_holds_stop_ids(client, reference):
    first = reference.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=1))[0]
    stop = first.outputs[0].token_ids[0]
    plain = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0,
                                      extra_body={"stop_token_ids": [stop],
                                                  "return_token_ids": True})
    assert plain.usage.completion_tokens == 1 and plain.choices[0].finish_reason == "stop"
    # As vLLM: the stop token's id is there, its text is not.
    assert plain.choices[0].model_extra["token_ids"] == [stop] and plain.choices[0].text == ""
    assert plain.choices[0].model_extra["stop_reason"] == stop  # vLLM's field
    held = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0,
                                     extra_body={"stop_token_ids": [stop], "min_tokens": 8})
    ref = reference.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=16,
                                                    stop_token_ids=[stop], min_tokens=8))[0]
    assert held.usage.completion_tokens >= 8
    ref_ids = ref.outputs[0].token_ids
    want = reference.get_tokenizer().decode(
        ref_ids[:-1] if ref.outputs[0].finish_reason == "stop" else ref_ids)
    assert held.choices[0].text == ref.outputs[0].text == want
    streamed = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16,
                                         temperature=0, stream=True,
                                         extra_body={"stop_token_ids": [stop], "min_tokens": 8})
    assert "".join(c.choices[0].text for c in streamed if c.choices) == want
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=12,
        temperature=0, extra_body={"min_tokens": 12})
    assert chat.usage.completion_tokens == 12


def test_continuous_usage_stats_add_up(client, reference):
    ref = reference.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=10))[0]
    stream = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True})
    chunks = list(stream)
    assert chunks and all(c.usage is not None for c in chunks)
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts)
    for c in chunks:
        assert c.usage.prompt_tokens == len(ref.prompt_token_ids)
        assert c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens
    assert chunks[-1].choices == [] and counts[-1] == len(ref.outputs[0].token_ids)
    text_chunks = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in text_chunks) == ref.outputs[0].text
    plain = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, stream=True,
                                      stream_options={"include_usage": True})
    plain = list(plain)
    assert all(c.usage is None for c in plain[:-1]) and plain[-1].usage.completion_tokens == 3


def test_cached_tokens_count_prefix_hits(client):
    prompt = "A prompt long enough to fill several blocks of sixteen tokens: " * 2
    first = client.completions.create(model="tiny", prompt=prompt, max_tokens=1, temperature=0)
    again = client.completions.create(model="tiny", prompt=prompt, max_tokens=1, temperature=0)
    n = first.usage.prompt_tokens
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == (n - 1) // 16 * 16


def test_return_token_ids_whole(client, reference):
    """vLLM's ``return_token_ids``: the choice carries its prompt's and its
    own token ids, equal to ``LLM.generate``'s."""
    ids = [5, 300, 17, 42, 99, 7, 250, 3]
    ref = reference.generate({"prompt_token_ids": ids},
                             SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))[0]
    resp = client.completions.create(model="tiny", prompt=ids, max_tokens=6, temperature=0,
                                     extra_body={"return_token_ids": True, "ignore_eos": True})
    extra = resp.choices[0].model_extra
    assert extra["prompt_token_ids"] == ids
    assert extra["token_ids"] == ref.outputs[0].token_ids and len(extra["token_ids"]) == 6
    plain = client.completions.create(model="tiny", prompt=ids, max_tokens=2, temperature=0)
    assert "token_ids" not in plain.choices[0].model_extra


def test_chat_return_token_ids_whole_and_streamed(server, client):
    """vLLM's ``return_token_ids`` on the chat: the answer carries its
    prompt's ids (transformers' rendering of the messages) and each of its
    choices its own, which transformers' tokenizer decodes to its content
    and which the completions route gives for the same prompt and seed;
    streamed, the role chunks carry the prompt's ids and every later chunk
    its delta's, adding up to the whole answer's."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(server.model_dir)
    messages = [{"role": "user", "content": PROMPT}]
    letters = hf.encode("abcdefgh ", add_special_tokens=False)  # each decodes on its own
    sampling = dict(model="tiny", n=2, max_tokens=8, temperature=1.0, seed=7)
    extra = {"return_token_ids": True, "allowed_token_ids": letters}
    whole = client.chat.completions.create(messages=messages, extra_body=extra, **sampling)
    prompt = whole.model_extra["prompt_token_ids"]
    assert prompt == list(hf.apply_chat_template(messages, tokenize=True,
                                                 add_generation_prompt=True, return_dict=False))
    ids = [c.model_extra["token_ids"] for c in whole.choices]
    assert ids[0] != ids[1] and all(len(i) == 8 and set(i) <= set(letters) for i in ids)
    assert [hf.decode(i) for i in ids] == [c.message.content for c in whole.choices]
    assert whole.usage.completion_tokens == 16
    completion = client.completions.create(prompt=prompt, extra_body=extra, **sampling)
    assert [c.model_extra["token_ids"] for c in completion.choices] == ids
    chunks = list(client.chat.completions.create(messages=messages, extra_body=extra,
                                                 stream=True, **sampling))
    assert [c.model_extra.get("prompt_token_ids") for c in chunks[:2]] == [prompt, prompt]
    assert all("prompt_token_ids" not in c.model_extra for c in chunks[2:])
    streamed, texts = [[], []], ["", ""]
    for chunk in chunks[2:]:
        choice = chunk.choices[0]
        streamed[choice.index] += choice.model_extra["token_ids"]
        texts[choice.index] += choice.delta.content or ""
    assert streamed == ids and texts == [c.message.content for c in whole.choices]


def test_served_model_names_version_and_ping(server, client):
    """vLLM's ``--served-model-name``: every name is listed and accepted, an
    answer names the model as its request did (else by the first name), and
    no other name (the --model path included, when names are given) is
    served; ``/version`` and ``/ping`` answer as vLLM's do."""
    assert [m.id for m in client.models.list().data] == ["tiny", "tiny-alias"]
    for name in ("tiny-alias", "tiny"):
        resp = client.completions.create(model=name, prompt=PROMPT, max_tokens=1)
        assert resp.model == name
        chat = client.chat.completions.create(model=name, max_tokens=1,
                                              messages=[{"role": "user", "content": PROMPT}])
        assert chat.model == name
    anonymous = httpx.post(f"{server.url}/v1/completions",
                           json={"prompt": PROMPT, "max_tokens": 1}, timeout=60).json()
    assert anonymous["model"] == "tiny"
    with pytest.raises(openai.NotFoundError, match="serves 'tiny' or 'tiny-alias'"):
        client.completions.create(model="other", prompt=PROMPT, max_tokens=1)
    assert httpx.get(f"{server.url}/version").json()["version"] == \
        importlib.metadata.version("tprun")
    assert httpx.get(f"{server.url}/ping").status_code == 200
    assert httpx.post(f"{server.url}/ping").status_code == 200


def test_max_tokens_null_is_what_the_context_leaves(server, reference):
    """vLLM's: left out, max_tokens is 16; sent as null, it is what the
    context leaves after the prompt (4096 - 4090 here)."""
    ids = [(7 * i) % 250 + 3 for i in range(4090)]
    body = {"model": "tiny", "prompt": ids, "temperature": 0, "ignore_eos": True}
    usage = [httpx.post(f"{server.url}/v1/completions", json=b, timeout=120).json()["usage"]
             for b in (dict(body, max_tokens=None), dict(body, prompt=ids[:10]))]
    assert [u["completion_tokens"] for u in usage] == [6, 16]


def test_best_of_is_ignored_as_vllm_ignores_a_field_it_does_not_have(client, reference):
    """vLLM's completions request has no ``best_of``: the field is ignored
    like any unknown one, whatever its value; the answer is the n choices
    the request asks for, each the one generated without it."""
    ref = reference.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=4,
                                                    ignore_eos=True))[0].outputs[0]
    for best_of in (1, 3, 0):
        resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4,
                                         temperature=0, best_of=best_of,
                                         extra_body={"ignore_eos": True})
        assert [c.text for c in resp.choices] == [ref.text], best_of


def test_add_special_tokens_false_leaves_out_the_bos(client, reference):
    """vLLM's ``add_special_tokens`` on completions: false tokenizes the text
    without the BOS the tokenizer adds; the answer is the one for those ids."""
    ids = reference.get_tokenizer().encode(PROMPT, add_special_tokens=False)
    assert reference.get_tokenizer().encode(PROMPT) == [256, *ids]  # tiny's BOS
    ref = reference.generate({"prompt_token_ids": ids},
                             SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))[0]
    resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0,
                                     extra_body={"add_special_tokens": False, "ignore_eos": True,
                                                 "return_token_ids": True})
    extra = resp.choices[0].model_extra
    assert extra["prompt_token_ids"] == ids and extra["token_ids"] == ref.outputs[0].token_ids


def test_return_tokens_as_token_ids_names_tokens_by_id(client, reference):
    """vLLM's ``return_tokens_as_token_ids``: each token in logprobs, its
    top logprobs' too, is "token_id:N"; the values are the same as without."""
    kwargs = dict(model="tiny", prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2)
    named = client.completions.create(**kwargs).choices[0].logprobs
    by_id = client.completions.create(
        **kwargs, extra_body={"return_tokens_as_token_ids": True, "return_token_ids": True})
    lp = by_id.choices[0].logprobs
    token_ids = by_id.choices[0].model_extra["token_ids"]
    assert lp.tokens == [f"token_id:{t}" for t in token_ids]
    assert lp.token_logprobs == named.token_logprobs
    for top, plain in zip(lp.top_logprobs, named.top_logprobs):
        assert all(key.startswith("token_id:") for key in top)
        assert list(top.values()) == list(plain.values())
    messages = [{"role": "user", "content": PROMPT}]
    want = reference.chat(messages, SamplingParams(temperature=0.0, max_tokens=3,
                                                   ignore_eos=True))[0].outputs[0].token_ids
    chat = client.chat.completions.create(
        model="tiny", max_tokens=3, temperature=0, logprobs=True, top_logprobs=2,
        messages=messages, extra_body={"return_tokens_as_token_ids": True, "ignore_eos": True})
    content = chat.choices[0].logprobs.content
    assert [c.token for c in content] == [f"token_id:{t}" for t in want]
    assert all(t.token.startswith("token_id:") for c in content for t in c.top_logprobs)


def test_return_token_ids_stream_has_a_chunk_per_token(client, reference):
    """Streamed, every token has its chunk with its id (even one whose text
    is held back: byte tokens that start a character), the prompt's ids on
    the first chunk only; the text adds up to the whole answer's."""
    prompt = "\u00e9\u00e9\u00e9"  # tiny answers with lead bytes of characters never completed
    ref = reference.generate(prompt, SamplingParams(temperature=0.0, max_tokens=12,
                                                    ignore_eos=True))[0]
    chunks = list(client.completions.create(
        model="tiny", prompt=prompt, max_tokens=12, temperature=0, stream=True,
        extra_body={"return_token_ids": True, "ignore_eos": True}))
    extras = [c.choices[0].model_extra for c in chunks]
    assert [t for e in extras for t in e["token_ids"]] == ref.outputs[0].token_ids
    assert all(len(e["token_ids"]) == 1 for e in extras) and len(extras) == 12
    assert extras[0]["prompt_token_ids"] == ref.prompt_token_ids
    assert all("prompt_token_ids" not in e for e in extras[1:])
    assert "".join(c.choices[0].text for c in chunks) == ref.outputs[0].text
    assert any(c.choices[0].text == "" for c in chunks)  # a token whose text waits


def _detokenize(server, tokens: list[int]) -> httpx.Response:
    return httpx.post(f"{server.url}/detokenize", json={"tokens": tokens}, timeout=30)


def test_tokenize_round_trips_detokenize(server, reference):
    """vLLM's /detokenize is transformers' ``decode`` with its defaults:
    special tokens shown, so tiny's BOS comes back as "<s>"."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(server.model_dir)
    tok = reference.get_tokenizer()
    for text in [PROMPT, "héllo wörld €", "line one\nline two"]:
        r = httpx.post(f"{server.url}/tokenize", json={"prompt": text}, timeout=30)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["tokens"] == tok.encode(text)
        assert body["count"] == len(body["tokens"]) and body["max_model_len"] > 0
        d = _detokenize(server, body["tokens"])
        assert d.status_code == 200 and d.json() == {"prompt": hf.decode(body["tokens"])}
        assert d.json()["prompt"] == "<s>" + text


def test_detokenize_leaves_out_ids_the_tokenizer_does_not_know(server):
    """tiny's model has 320 rows, its tokenizer 259 tokens: a padded row's id,
    and any other the tokenizer does not know, adds nothing (transformers'
    ``decode``, which vLLM's route calls); an id the tokenizer cannot read
    (it reads unsigned 32-bit ids) is a 400 naming ``tokens``, as vLLM's
    refuses it."""
    import json

    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(server.model_dir)
    with open(f"{server.model_dir}/config.json") as f:
        padded = json.load(f)["vocab_size"] - 1
    assert padded >= len(hf)
    ids = [72, padded, 105, len(hf), 10**6, (1 << 32) - 1]
    d = _detokenize(server, ids)
    assert d.status_code == 200 and d.json() == {"prompt": hf.decode(ids)} == {"prompt": "Hi"}
    for bad in (-1, 1 << 32):
        r = _detokenize(server, [72, bad])
        assert r.status_code == 400 and r.json()["error"]["param"] == "tokens", r.text
        with pytest.raises(OverflowError):  # what vLLM's route answers with a 400
            hf.decode([72, bad])


def test_detokenize_and_tokenize_take_more_than_max_model_len(server):
    """vLLM's /detokenize and /tokenize check no context length (their
    tokenize parameters set no ``max_total_tokens``): ids past the served
    ``max_model_len`` decode whole, as transformers' ``decode`` does, and a
    text that long tokenizes whole, its ``count`` above ``max_model_len``."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(server.model_dir)
    text = "abc " * 1100  # a token a byte: 4401 ids with the BOS
    r = httpx.post(f"{server.url}/tokenize", json={"prompt": text}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["tokens"]) > body["max_model_len"]
    assert body["tokens"] == hf(text)["input_ids"]
    d = _detokenize(server, body["tokens"])
    assert d.status_code == 200 and d.json() == {"prompt": hf.decode(body["tokens"])}
    assert d.json()["prompt"] == "<s>" + text


def test_tokenize_messages_equals_chat_prompt(server, client):
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    r = httpx.post(f"{server.url}/tokenize", json={"messages": messages}, timeout=30)
    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=1,
                                          temperature=0)
    assert r.json()["count"] == chat.usage.prompt_tokens
    info = httpx.get(f"{server.url}/tokenizer_info", timeout=30).json()
    assert "eos_token" in info and "chat_template" in info


def test_unimplemented_fields_are_refused(client):
    with pytest.raises(openai.BadRequestError, match="suffix"):
        client.completions.create(model="tiny", prompt=PROMPT, suffix="x", max_tokens=2)
    for bad in (0, -1, -1000):
        with pytest.raises(openai.BadRequestError, match="max_tokens must be >= 1"):
            client.completions.create(model="tiny", prompt=PROMPT, max_tokens=bad)
    with pytest.raises(openai.BadRequestError, match="max_tokens must be >= 1"):
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=-5, echo=True)
    messages = [{"role": "user", "content": PROMPT}]
    function = {"name": "f", "parameters": {"type": "object", "properties": {}}}
    # A tool choice without tools; OpenAI's deprecated function fields.
    for extra, message in (({"tool_choice": "required"}, "needs tools"),
                           ({"tool_choice": "auto"}, "needs tools"),
                           ({"tool_choice": {"type": "function", "function": {"name": "f"}}},
                            "needs tools"),
                           ({"functions": [function]}, "deprecated form of tools"),
                           ({"function_call": "auto"}, "deprecated form of tool_choice")):
        with pytest.raises(openai.BadRequestError, match=message):
            client.chat.completions.create(model="tiny", max_tokens=2, messages=messages,
                                           extra_body=extra)
    # Asking for no tool is asking for the plain answer this server gives.
    plain = client.chat.completions.create(model="tiny", max_tokens=3, temperature=0,
                                           messages=messages)
    none = client.chat.completions.create(model="tiny", max_tokens=3, temperature=0,
                                          messages=messages, tool_choice="none")
    assert none.choices[0].message.content == plain.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="min_tokens"):
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2,
                                  extra_body={"min_tokens": 3})
    # A request's own template, on a server not started to trust it (vLLM's refusal).
    with pytest.raises(openai.BadRequestError, match="--trust-request-chat-template is not set"):
        client.chat.completions.create(model="tiny", max_tokens=2,
                                       extra_body={"chat_template": "{{ messages }}"},
                                       messages=[{"role": "user", "content": PROMPT}])


def test_access_log_has_a_line_per_request(server, client):
    client.models.list()
    httpx.post(f"{server.url}/tokenize", json={"prompt": "x"}, timeout=30)
    log = server.output()
    assert "GET /v1/models 200" in log
    assert "POST /tokenize 200" in log


def test_stop_strings_wait_for_min_tokens(client, reference):
    """As vLLM: a stop string in the first min_tokens tokens' text ends
    nothing; one that a later token completes does, even where it begins in
    that text."""
    ref = reference.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=12,
                                                    ignore_eos=True))[0].outputs[0]
    stop = ref.text[1:3]  # text the second and third tokens make (one byte each)
    assert stop and stop not in ref.text[:1]
    cut = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0,
                                    stop=[stop], extra_body={"ignore_eos": True})
    assert cut.choices[0].text == ref.text[:ref.text.index(stop)]
    assert cut.choices[0].model_extra["stop_reason"] == stop  # vLLM's: the string met
    chat_kwargs = dict(model="tiny", messages=[{"role": "user", "content": PROMPT}],
                       max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    chat_text = client.chat.completions.create(**chat_kwargs).choices[0].message.content
    chat_stop = chat_text[1:3]  # met in the answer, so it ends the stream
    assert chat_stop
    chat = list(client.chat.completions.create(**chat_kwargs, stop=[chat_stop], stream=True))
    last = [c.choices[0] for c in chat if c.choices and c.choices[0].finish_reason][-1]
    assert last.finish_reason == "stop" and last.model_extra["stop_reason"] == chat_stop
    long = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert long.choices[0].finish_reason == "length"
    assert long.choices[0].model_extra["stop_reason"] is None
    held = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0,
                                     stop=[stop], extra_body={"ignore_eos": True,
                                                              "min_tokens": 6})
    at = ref.text.find(stop, 6 - len(stop) + 1)  # ends past the sixth token's text
    want = ref.text if at < 0 else ref.text[:at]
    assert held.choices[0].text == want
    # The sixth and seventh tokens' text as the stop: it ends in the seventh.
    straddle = ref.text[5:7]
    assert ref.text.find(straddle, 6 - len(straddle) + 1) == 5  # its first that may end it
    cut = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0,
                                    stop=[straddle], extra_body={"ignore_eos": True,
                                                                 "min_tokens": 6})
    assert cut.choices[0].text == ref.text[:5]
    assert cut.choices[0].finish_reason == "stop"


def test_text_offsets_depend_on_the_tokens_alone(client):
    """A stop string that may begin anywhere holds text back at every token;
    the tokens' ``text_offset`` must not follow the text released so far, in
    a whole answer or a stream."""
    kwargs = dict(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0, logprobs=0,
                  extra_body={"ignore_eos": True})
    plain = client.completions.create(**kwargs).choices[0]
    stops = sorted({c + "\x00\x00" for c in plain.text})[:4]  # never met, often begun
    assert not any(s in plain.text for s in stops)
    held = client.completions.create(**kwargs, stop=stops).choices[0]
    assert held.text == plain.text and held.logprobs.tokens == plain.logprobs.tokens
    assert held.logprobs.text_offset == plain.logprobs.text_offset
    streamed = [c.choices[0].logprobs for c in client.completions.create(
        **kwargs, stop=stops, stream=True) if c.choices and c.choices[0].logprobs]
    assert [o for lp in streamed for o in lp.text_offset] == plain.logprobs.text_offset


def test_logit_bias_and_allowed_token_ids(reference, client):
    """OpenAI's ``logit_bias`` (keys are ids as text; biases clamped to
    [-100, 100], as vLLM clamps) and vLLM's ``allowed_token_ids``, on both
    routes, against ``LLM.generate`` with the same parameters."""
    def ids(extra=None, **kw):
        out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=5,
                                        extra_body={"return_token_ids": True, **(extra or {})},
                                        **kw)
        return out.choices[0].model_extra["token_ids"]

    def expected(**kw):
        params = SamplingParams(max_tokens=5, **kw)
        return reference.generate(PROMPT, params)[0].outputs[0].token_ids

    assert ids(temperature=0, logit_bias={"65": 100}) == [65] * 5
    assert ids(temperature=0, logit_bias={"66": 1e9, "65": -3}) == expected(
        temperature=0.0, logit_bias={66: 100.0, 65: -3.0})
    allowed = [65, 70, 99, 101]
    sampled = ids({"allowed_token_ids": allowed}, temperature=1.0, seed=4)
    assert set(sampled) <= set(allowed)
    assert sampled == expected(temperature=1.0, seed=4, allowed_token_ids=allowed)
    for bad, message in (([], "allowed_token_ids must be None or 1 to 1024"),
                         ([5, 10**6], "allowed_token_ids token ids")):
        with pytest.raises(openai.BadRequestError, match=message):
            ids({"allowed_token_ids": bad}, temperature=0)
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
        temperature=0, logit_bias={"70": 100})
    assert chat.choices[0].message.content == reference.get_tokenizer().decode([70] * 3)
    assert chat.usage.completion_tokens == 3


def _two_token_word(tokenizer, ids: list[int]) -> str:
    """Text of two consecutive ids of ``ids`` that encodes back to them and
    has no leading space: a bad word that bans the second after the first."""
    for i in range(1, len(ids) - 1):
        text = tokenizer.decode(ids[i:i + 2])
        if text == text.lstrip() and tokenizer.encode(text, add_special_tokens=False) == ids[
                i:i + 2]:
            return text
    raise AssertionError(f"no two-token word in {ids}")


def test_bad_words_are_served(reference, client):
    """vLLM's ``bad_words`` on both routes, equal to ``LLM.generate`` (and
    ``LLM.chat``) with the same parameters; the word comes from the
    unconstrained answer, which it changes."""
    messages = [{"role": "user", "content": PROMPT}]

    def ask(route: str, words: list[str] | None):
        """(``LLM``'s output, the served text) of a greedy answer."""
        params = SamplingParams(temperature=0.0, max_tokens=12, bad_words=words)
        extra = {"bad_words": words} if words else None
        if route == "completions":
            served = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12,
                                               temperature=0, extra_body=extra)
            return reference.generate(PROMPT, params)[0].outputs[0], served.choices[0].text
        served = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12,
                                                temperature=0, extra_body=extra)
        return reference.chat(messages, params)[0].outputs[0], served.choices[0].message.content

    for route in ("completions", "chat"):
        plain, _ = ask(route, None)
        words = [_two_token_word(reference.get_tokenizer(), plain.token_ids)]
        banned, served = ask(route, words)
        assert served == banned.text and banned.token_ids != plain.token_ids
    long_word = "x" * (MAX_BAD_WORD_TOKENS + 1)  # a token a byte
    with pytest.raises(openai.BadRequestError, match="bad_words_token_ids must be"):
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2,
                                  extra_body={"bad_words": [long_word]})


def test_include_stop_str_and_truncate_prompt_tokens(reference, client):
    """vLLM's ``include_stop_str_in_output`` (the text ends after the stop
    string) and ``truncate_prompt_tokens`` (the prompt's last k tokens, -1
    its last max_model_len, also what ``echo`` shows), against ``LLM.generate`` and the tokenizer."""
    greedy = {"temperature": 0, "max_tokens": 12, "extra_body": {"ignore_eos": True}}
    text = client.completions.create(model="tiny", prompt=PROMPT, **greedy).choices[0].text
    stop = text[4:6]
    cut = text.find(stop)
    for include, expected in ((False, text[:cut]), (True, text[:cut + len(stop)])):
        out = client.completions.create(
            model="tiny", prompt=PROMPT, stop=[stop], temperature=0, max_tokens=12,
            extra_body={"ignore_eos": True, "include_stop_str_in_output": include})
        assert (out.choices[0].text, out.choices[0].finish_reason) == (expected, "stop")
        ref = reference.generate(PROMPT, SamplingParams(
            temperature=0.0, max_tokens=12, ignore_eos=True, stop=[stop],
            include_stop_str_in_output=include))[0].outputs[0]
        assert ref.text == expected and ref.stop_reason == stop
    ids = reference.get_tokenizer().encode(PROMPT)
    out = client.completions.create(
        model="tiny", prompt=PROMPT, temperature=0, max_tokens=3, echo=True,
        extra_body={"truncate_prompt_tokens": 3, "return_token_ids": True})
    kept = ids[-3:]
    assert out.choices[0].model_extra["prompt_token_ids"] == kept
    assert out.usage.prompt_tokens == 3
    ref = reference.generate({"prompt_token_ids": kept},
                             SamplingParams(temperature=0.0, max_tokens=3))[0].outputs[0]
    assert out.choices[0].text == reference.get_tokenizer().decode(kept) + ref.text
    [whole] = reference.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=3,
                                                        truncate_prompt_tokens=3))
    assert whole.prompt_token_ids == kept and whole.outputs[0].token_ids == ref.token_ids
    # -1: the last max_model_len tokens, the whole of this prompt.
    out = client.completions.create(
        model="tiny", prompt=PROMPT, temperature=0, max_tokens=3, echo=True,
        extra_body={"truncate_prompt_tokens": -1, "return_token_ids": True})
    assert out.choices[0].model_extra["prompt_token_ids"] == ids


def test_truncation_side_right_keeps_the_first_tokens(client, reference, server):
    """vLLM's ``truncation_side``: "right" cuts the prompt's end off,
    keeping its first k tokens ("left", as left out, its last); the answer
    is ``LLM.generate``'s for the kept ids, on both routes (the chat's
    prompt: transformers' rendering of the messages)."""
    from transformers import AutoTokenizer

    ids = reference.get_tokenizer().encode(PROMPT)
    messages = [{"role": "user", "content": PROMPT}]
    chat_ids = list(AutoTokenizer.from_pretrained(server.model_dir).apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=False))
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    for side, kept, chat_kept in (("right", ids[:5], chat_ids[:5]),
                                  ("left", ids[-5:], chat_ids[-5:])):
        extra = {"truncate_prompt_tokens": 5, "truncation_side": side, "ignore_eos": True,
                 "return_token_ids": True}
        out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4,
                                        temperature=0, echo=True, extra_body=extra)
        ref = reference.generate({"prompt_token_ids": kept}, greedy)[0].outputs[0]
        assert out.choices[0].model_extra["prompt_token_ids"] == kept
        assert out.choices[0].text == reference.get_tokenizer().decode(kept) + ref.text
        chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=4,
                                              temperature=0, extra_body=extra)
        ref = reference.generate({"prompt_token_ids": chat_kept}, greedy)[0].outputs[0]
        assert chat.model_extra["prompt_token_ids"] == chat_kept
        assert chat.choices[0].model_extra["token_ids"] == ref.token_ids
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2,
                                  extra_body={"truncation_side": "middle"})
    assert refused.value.body["param"] == "truncation_side"


def test_truncate_prompt_tokens_above_max_model_len_is_a_400(client, reference):
    """The engine's rule (``truncated_prompt``: vLLM refuses a k above
    ``max_model_len`` up front, whatever the prompt's length) on both
    routes: a 400 that names the field, and the server goes on serving."""
    too_many = reference.engine.scheduler.config.max_model_len + 1
    calls = (lambda body: client.completions.create(model="tiny", prompt=PROMPT, **body),
             lambda body: client.chat.completions.create(
                 model="tiny", messages=[{"role": "user", "content": PROMPT}], **body))
    for call in calls:
        with pytest.raises(openai.BadRequestError) as refused:
            call({"max_tokens": 2, "extra_body": {"truncate_prompt_tokens": too_many}})
        error = refused.value.body
        assert error["param"] == "truncate_prompt_tokens"
        assert f"truncate_prompt_tokens {too_many} is more than max_model_len" in error["message"]
        assert call({"max_tokens": 2, "extra_body": {"truncate_prompt_tokens": 3}}).usage \
            .prompt_tokens == 3


def test_include_stop_str_shows_the_stop_tokens_text(client):
    """vLLM's ``include_stop_str_in_output`` shows the text of the stop token
    that ended the answer too, and checks the stop strings over it as over
    any text: where it is one, that string is the reason, else the token id
    is (one-letter tokens, hand-worked)."""
    letters = list(range(ord("a"), ord("z") + 1))
    greedy = {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    body = {"ignore_eos": True, "allowed_token_ids": letters, "return_token_ids": True}
    ids = client.completions.create(**greedy, extra_body=body).choices[0].model_extra["token_ids"]
    at = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])
    for stop, reason in (([], ids[at]), ([chr(ids[at])], chr(ids[at]))):
        out = client.completions.create(**greedy, stop=stop, extra_body={
            **body, "stop_token_ids": [ids[at]], "include_stop_str_in_output": True}).choices[0]
        assert (out.finish_reason, out.model_extra["stop_reason"]) == ("stop", reason)
        assert out.text == "".join(map(chr, ids[:at + 1]))


def test_skip_special_tokens_false_shows_them(reference, client):
    """vLLM's ``skip_special_tokens``: False puts special tokens' text in
    the answer, whole and streamed, as the tokenizer decodes them."""
    from checkpoint.tiny_model import EOS

    tokenizer = reference.get_tokenizer()
    kw = dict(model="tiny", prompt=PROMPT, max_tokens=3, temperature=0,
              logit_bias={str(EOS): 100})
    for skip in (True, False):
        extra = {"ignore_eos": True, "skip_special_tokens": skip}
        whole = client.completions.create(extra_body=extra, **kw).choices[0].text
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            stream=True, extra_body=extra, **kw))
        assert whole == streamed == tokenizer.decode([EOS] * 3, skip_special_tokens=skip)
    assert whole  # the special token has text, shown only when asked


def test_continue_final_message(reference, client):
    """vLLM's ``continue_final_message``: the assistant's begun answer is
    continued, as ``LLM.chat`` continues it (the rendering itself is checked
    against transformers in test_http_chat_template.py)."""
    messages = [{"role": "user", "content": "Name a color."},
                {"role": "assistant", "content": "My favourite is"}]
    got = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=4, temperature=0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False,
                    "ignore_eos": True})
    [want] = reference.chat(messages, SamplingParams(temperature=0.0, max_tokens=4,
                                                     ignore_eos=True),
                            add_generation_prompt=False, continue_final_message=True)
    assert want.prompt.endswith("My favourite is")
    assert got.choices[0].message.content == want.outputs[0].text
    assert got.usage.prompt_tokens == len(want.prompt_token_ids)
    with pytest.raises(openai.BadRequestError, match="cannot both be set"):
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=2,
                                       extra_body={"continue_final_message": True})
