"""``tprun --nproc-per-node 2 serve --http-port`` on CPU with ``tiny``, driven by the official
``openai`` client, curl and plain HTTP; greedy answers checked against
``LLM.generate`` in this process, chat prompts against transformers'
``apply_chat_template``."""

from __future__ import annotations

import json
import subprocess

import httpx
import openai
import pytest

from engine import LLM, SamplingParams
from tests.helpers.http_utils import metric, openai_client, serving_tiny, wait_for_metric

pytestmark = pytest.mark.timeout(180)

KEY = "test-key-4f2a"
UI_ORIGIN = "http://ui.example:3000"
PROMPTS = ["Hello, my name is", "The capital of France is", "héllo wörld €"]
MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2 + 2?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_tiny(tmp_path_factory.mktemp("http"), "--nproc-per-node", "2", "serve",
                      "--model", "tiny", "--device", "cpu", "--disable-log-stats",
                      "--allowed-origins", UI_ORIGIN, env={"TPRUN_API_KEY": KEY}) as served:
        yield served


@pytest.fixture(scope="module")
def client(server):
    with openai_client(server, KEY) as c:
        yield c


@pytest.fixture(scope="module")
def reference(server):
    with LLM(model=server.model_dir, device="cpu") as llm:
        yield llm


def _greedy(reference, prompt, max_tokens=16, **kwargs):
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, **kwargs)
    return reference.generate(prompt, params)[0]


def _chat_ids(model_dir) -> list[int]:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(model_dir).apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_completion_equals_llm_generate(client, reference):
    for prompt in PROMPTS:
        ref = _greedy(reference, prompt)
        resp = client.completions.create(model="tiny", prompt=prompt, max_tokens=16,
                                         temperature=0)
        choice = resp.choices[0]
        assert choice.text == ref.outputs[0].text
        assert choice.finish_reason == ref.outputs[0].finish_reason
        assert resp.usage.prompt_tokens == len(ref.prompt_token_ids)
        assert resp.usage.completion_tokens == len(ref.outputs[0].token_ids)
        assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_completion_stream_equals_whole(client, reference):
    ref = _greedy(reference, PROMPTS[2], max_tokens=24)
    stream = client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=24,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert text == ref.outputs[0].text
    assert reasons[-1] == ref.outputs[0].finish_reason and reasons.count(None) == len(reasons) - 1
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == len(ref.outputs[0].token_ids)
    assert chunks[-1].usage.prompt_tokens == len(ref.prompt_token_ids)


def test_token_id_prompts_and_batches(client, reference):
    ids = reference.get_tokenizer().encode(PROMPTS[0])
    refs = [_greedy(reference, {"prompt_token_ids": ids}), _greedy(reference, PROMPTS[1])]
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=16, temperature=0)
    assert by_ids.choices[0].text == refs[0].outputs[0].text
    batch = client.completions.create(model="tiny", prompt=PROMPTS[:2], max_tokens=16,
                                      temperature=0)
    assert [c.index for c in batch.choices] == [0, 1]
    assert [c.text for c in batch.choices] == [r.outputs[0].text for r in refs]


def test_chat_equals_llm_generate(client, reference, server):
    ids = _chat_ids(server.model_dir)
    ref = _greedy(reference, {"prompt_token_ids": ids}, max_tokens=12)
    resp = client.chat.completions.create(model="tiny", messages=MESSAGES,
                                          max_completion_tokens=12, temperature=0)
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == ref.outputs[0].text
    assert resp.usage.prompt_tokens == len(ids)
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12,
                                            temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ref.outputs[0].text
    assert chunks[-1].choices[0].finish_reason == ref.outputs[0].finish_reason


def test_chat_template_errors_are_400(client):
    with pytest.raises(openai.BadRequestError, match="unknown role: robot"):
        client.chat.completions.create(model="tiny", max_tokens=4,
                                       messages=[{"role": "robot", "content": "hi"}])
    # A template of the request's own is refused without --trust-request-chat-template
    # (vLLM's default), not ignored.
    with pytest.raises(openai.BadRequestError, match="--trust-request-chat-template is not set"):
        client.chat.completions.create(model="tiny", max_tokens=4, messages=MESSAGES,
                                       extra_body={"chat_template": "{{ messages }}"})


def test_n_choices_seeded(client):
    kwargs = dict(model="tiny", prompt=PROMPTS[0], max_tokens=8, temperature=1.0, n=3,
                  seed=7)
    first = client.completions.create(**kwargs)
    again = client.completions.create(**kwargs)
    assert sorted(c.index for c in first.choices) == [0, 1, 2]
    texts = [c.text for c in sorted(first.choices, key=lambda c: c.index)]
    assert texts == [c.text for c in sorted(again.choices, key=lambda c: c.index)]
    assert len(set(texts)) > 1  # different seeds per choice
    assert first.usage.completion_tokens == 24
    streamed = ["", "", ""]
    for chunk in client.completions.create(**kwargs, stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.text
    assert streamed == texts


def test_greedy_n_above_1_is_a_400_naming_n(client, reference):
    """vLLM's rule (greedy choices could not differ), on both routes; the
    default temperature (1) samples, so ``n`` alone is served."""
    for call in (client.chat.completions.create, client.completions.create):
        with pytest.raises(openai.BadRequestError,
                           match="n must be 1 when sampling greedily") as raised:
            call(model="tiny", n=2, max_tokens=8, temperature=0,
                 **({"messages": MESSAGES} if call == client.chat.completions.create
                    else {"prompt": PROMPTS[0]}))
        assert (raised.value.status_code, raised.value.param) == (400, "n")
    resp = client.completions.create(model="tiny", prompt=PROMPTS[0], n=2, max_tokens=8)
    assert len(resp.choices) == 2
    ref = _greedy(reference, PROMPTS[0], max_tokens=8)
    resp = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=8,
                                     temperature=0)
    assert resp.choices[0].text == ref.outputs[0].text


def test_completion_logprobs(client, reference):
    ref = _greedy(reference, PROMPTS[0], max_tokens=8, logprobs=2).outputs[0]
    resp = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=8,
                                     temperature=0, logprobs=2)
    lp = resp.choices[0].logprobs
    assert len(lp.token_logprobs) == len(ref.token_ids) == 8
    for got, token, candidates, top in zip(lp.token_logprobs, ref.token_ids, ref.logprobs,
                                           lp.top_logprobs):
        assert got == pytest.approx(candidates[token].logprob, abs=1e-4)
        assert 1 <= len(top) <= 2
        assert max(top.values()) == pytest.approx(got, abs=1e-5)  # greedy: the top one


def test_chat_logprobs(client):
    resp = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6,
                                          temperature=0, logprobs=True, top_logprobs=3)
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens == 6
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-5)
        assert [t.logprob for t in entry.top_logprobs] == sorted(
            (t.logprob for t in entry.top_logprobs), reverse=True)


def test_stop_strings(client, reference):
    full = _greedy(reference, PROMPTS[1], max_tokens=24).outputs[0].text
    stop = full[6:9]
    expected = full[: full.find(stop)]
    resp = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=24,
                                     temperature=0, stop=stop)
    assert resp.choices[0].text == expected and resp.choices[0].finish_reason == "stop"
    assert resp.usage.completion_tokens < 24
    stops = [full[12:14], stop]
    expected = full[: min(full.find(s) for s in stops)]  # the earliest stop string wins
    stream = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=24,
                                       temperature=0, stop=stops, stream=True)
    chunks = [c.choices[0] for c in stream]
    assert "".join(c.text for c in chunks) == expected
    assert chunks[-1].finish_reason == "stop"


def test_stop_token_ids(client, reference):
    token_ids = _greedy(reference, PROMPTS[1], max_tokens=12).outputs[0].token_ids
    stop_ids = [token_ids[4]]
    ref = _greedy(reference, PROMPTS[1], max_tokens=12, stop_token_ids=stop_ids).outputs[0]
    resp = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=12,
                                     temperature=0, extra_body={"stop_token_ids": stop_ids})
    assert resp.choices[0].text == ref.text and ref.finish_reason == "stop"
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage.completion_tokens == len(ref.token_ids)


def test_sampling_fields_reach_the_engine(client, reference):
    """Penalties, top-k and min-p change greedy answers exactly as in ``LLM``."""
    extra = {"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.3}
    ref = _greedy(reference, PROMPTS[0], max_tokens=12, presence_penalty=0.5,
                  frequency_penalty=0.7, **extra).outputs[0]
    resp = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12,
                                     temperature=0, presence_penalty=0.5,
                                     frequency_penalty=0.7, extra_body=extra)
    assert resp.choices[0].text == ref.text


def test_curl_completion(server, reference):
    ref = _greedy(reference, PROMPTS[0], max_tokens=10)
    body = json.dumps({"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 10,
                       "temperature": 0})
    out = subprocess.run(
        ["curl", "-sS", "--max-time", "60", f"{server.url}/v1/completions",
         "-H", "Content-Type: application/json", "-H", f"Authorization: Bearer {KEY}",
         "-d", body], capture_output=True, text=True, timeout=90, check=True)
    answer = json.loads(out.stdout)
    assert answer["object"] == "text_completion"
    assert answer["choices"][0]["text"] == ref.outputs[0].text


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_cors_lets_the_allowed_origin_in_and_no_other(server):
    """--allowed-origins: a browser's preflight from that origin is answered
    (without the key, which preflights never carry) and its calls carry the
    CORS header; another origin's get no header, so its browser refuses."""
    url = f"{server.url}/v1/chat/completions"
    preflight = {"Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    ok = httpx.options(url, headers={"Origin": UI_ORIGIN, **preflight}, timeout=30)
    assert ok.status_code == 200
    assert ok.headers["access-control-allow-origin"] == UI_ORIGIN
    other = httpx.options(url, headers={"Origin": "http://evil.example", **preflight},
                          timeout=30)
    assert "access-control-allow-origin" not in other.headers
    body = {"model": "tiny", "max_tokens": 2, "messages": MESSAGES}
    auth = {"Authorization": f"Bearer {KEY}"}
    call = httpx.post(url, json=body, headers={"Origin": UI_ORIGIN, **auth}, timeout=60)
    assert call.status_code == 200 and call.headers["access-control-allow-origin"] == UI_ORIGIN
    keyless = httpx.post(url, json=body, headers={"Origin": UI_ORIGIN}, timeout=60)
    assert keyless.status_code == 401  # CORS lets the page in, not past the key
    plain = httpx.post(url, json=body, headers={"Origin": "http://evil.example", **auth},
                       timeout=60)
    assert "access-control-allow-origin" not in plain.headers


def test_api_key_is_required(server, client):
    url = f"{server.url}/v1/completions"
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
    assert "API key" in _error(httpx.post(url, json=body), 401)["message"]
    _error(httpx.post(url, json=body, headers={"Authorization": "Bearer wrong"}), 401)
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.get(f"{server.url}/health").status_code == 200


@pytest.mark.parametrize("fields, message", [
    ({"prompt": ""}, "the prompt is empty"),
    ({"max_tokens": 5000}, "exceeds max_model_len 4096"),
    ({"temperature": -1}, "temperature must be >= 0"),
    ({"top_p": 0}, "top_p must be in (0, 1]"),
    ({"n": 0}, "n must be in"),
    ({"prompt": [400, 1]}, "outside the vocabulary"),
    ({"max_tokens": "many"}, "max_tokens"),
    ({"suffix": "!"}, "suffix is not supported"),
    ({"logit_bias": {"A": 5}}, "logit_bias keys must be token ids, got 'A'"),
    ({"logit_bias": {"400": 5}}, "logit_bias token ids"),  # outside the vocabulary
    ({"seed": 2**70}, "seed"),  # beyond the 64 bits a seed travels in
    ({"prompt": [2**70]}, "prompt"),
    ({"max_tokens": 2**64}, "max_tokens"),
    ({"stream_options": {"include_usage": True}}, "stream_options needs stream: true"),
    ({"use_beam_search": True, "logprobs": 2}, "use_beam_search does not take logprobs"),
    ({"prompt_embeds": "AAAA"}, "prompt_embeds is not supported"),
    ({"logits_processors": ["m.f"]}, "logits_processors is not supported"),
    ({"priority": 2}, "priority 2 needs the 'priority' scheduling policy"),
])
def test_bad_requests_are_400(server, client, fields, message):
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2, **fields}
    response = httpx.post(f"{server.url}/v1/completions", json=body,
                          headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert message in _error(response, 400)["message"]
    vllm_fields = {"use_beam_search", "prompt_embeds", "logits_processors", "priority"}
    extra = {k: body.pop(k) for k in vllm_fields & set(body)}
    with pytest.raises(openai.BadRequestError, match=message.split("(")[0]):
        client.completions.create(**body, extra_body=extra or None)


@pytest.mark.parametrize("route, fields, param", [
    ("completions", {"prompt": None}, "prompt"),
    ("completions", {"prompt": [2**63]}, "prompt.0"),
    ("completions", {"prompt": [[1], [2**64]]}, "prompt.1.0"),
    ("completions", {"prompt": "hi", "stop": 5}, "stop"),
    ("completions", {"prompt": "hi", "stream_options": {"include_usage": "maybe"}},
     "stream_options.include_usage"),
    ("chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ("chat/completions", {"messages": [{"content": "hi"}]}, "messages.0.role"),
])
def test_a_bad_field_is_named_as_the_client_sent_it(server, route, fields, param):
    """Pydantic puts the label of each union member it tried (``str``,
    ``list[str]``) in an error's location: the error names the field the
    client sent, never such a label, down to the item that is wrong."""
    body = {"model": "tiny", "max_tokens": 2, **fields}
    response = httpx.post(f"{server.url}/v1/{route}", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {KEY}"})
    error = _error(response, 400)
    assert error["param"] == param, error
    assert error["message"].startswith(f"{param}: "), error


def test_unknown_model_is_404_and_a_long_prompt_says_so(server, client):
    with pytest.raises(openai.NotFoundError, match="not served here") as info:
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=2)
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="maximum context length") as info:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5000)
    assert (info.value.code, info.value.param) == ("context_length_exceeded", "max_tokens")
    with pytest.raises(openai.BadRequestError, match="max_tokens must be an int >= 1"):
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4,
                                       max_completion_tokens=0)  # set, so it counts


def test_malformed_bodies_are_400_without_server_internals(server):
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    url = f"{server.url}/v1/completions"
    for content in ('{"model": "tiny", "prompt": ', "[1, 2]", ""):
        error = _error(httpx.post(url, content=content, headers=headers, timeout=60), 400)
        assert "Traceback" not in error["message"] and ".py" not in error["message"]
        assert error["param"] is None, error
    error = _error(httpx.post(url, content='{"model": "tiny", "prompt": ', headers=headers,
                              timeout=60), 400)
    assert error["message"].startswith("the body is not valid JSON")


def test_a_body_that_is_not_sent_as_json_is_415(server):
    """As vLLM: a valid body sent as text or as a form is refused with 415
    Unsupported Media Type, on every route that reads a JSON body; a JSON
    media type (``+json`` too) is served."""
    body = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 2, "temperature": 0})
    auth = {"Authorization": f"Bearer {KEY}"}
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"):
        for media_type in ("text/plain", "application/x-www-form-urlencoded"):
            response = httpx.post(f"{server.url}{path}", content=body, timeout=60,
                                  headers={**auth, "Content-Type": media_type})
            error = _error(response, 415)
            assert error["code"] == "unsupported_media_type", error
            assert "application/json" in error["message"]
    response = httpx.post(f"{server.url}/v1/completions", content=body, timeout=60,
                          headers={**auth, "Content-Type": "application/vnd.api+json"})
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 2


def test_extreme_sampling_values_are_served_and_the_engine_lives(server, client):
    """top_k beyond int32 filters nothing, a top_p that rounds to 0 keeps the
    most likely token: both answered, as vLLM does, and the engine goes on."""
    want = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=4,
                                     temperature=0).choices[0].text
    for extra in ({"top_k": 2**31}, {"top_k": 2**62}):
        resp = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=3,
                                         temperature=0.7, seed=1, extra_body=extra)
        assert resp.usage.completion_tokens == 3
    tiny_p = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=4,
                                       temperature=1.0, top_p=1e-50, seed=2)
    assert tiny_p.choices[0].text == want  # only the argmax is left: greedy
    # The last seed: choice 1's seed wraps past the 64-bit range.
    last = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=4,
                                     temperature=1.0, top_p=1e-50, n=2, seed=2**63 - 1)
    assert [c.text for c in last.choices] == [want, want]


def test_body_size_limit_is_413(server):
    body = json.dumps({"model": "tiny", "prompt": "a" * (9 * 1024 * 1024)})
    response = httpx.post(f"{server.url}/v1/completions", content=body, timeout=60,
                          headers={"Authorization": f"Bearer {KEY}",
                                   "Content-Type": "application/json"})
    assert "larger than" in _error(response, 413)["message"]
    _error(httpx.get(f"{server.url}/v1/nothing", headers={"Authorization": f"Bearer {KEY}"}),
           404)


def test_disconnect_aborts_the_request(server):
    running = "tprun:num_requests_running"
    body = {"model": "tiny", "prompt": "Tell me a long story", "max_tokens": 3000,
            "temperature": 0, "ignore_eos": True, "stream": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{server.url}/v1/completions", json=body,
                         headers=headers) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            assert wait_for_metric(server.url, running, lambda v: v == 1) == 1
    assert wait_for_metric(server.url, running, lambda v: v == 0) == 0
    assert metric(server.url, "tprun:kv_cache_usage_perc") == 0
    # A client that gives up on a whole (non-streaming) answer aborts it too.
    body["stream"] = False
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=body, headers=headers, timeout=1.0)
    assert wait_for_metric(server.url, running, lambda v: v == 0) == 0


def test_metrics_count_tokens_and_latency(server, client):
    names = ("tprun:generation_tokens_total", "tprun:time_to_first_token_seconds_count",
             "tprun:e2e_request_latency_seconds_count", "tprun:request_success_total",
             "tprun:prefix_cache_queries_total", "tprun:prefix_cache_hits_total")
    before = {name: metric(server.url, name) for name in names}
    prompt = "a prompt of more than one cache block " * 4  # the second request hits its blocks
    for _ in range(2):
        resp = client.completions.create(model="tiny", prompt=prompt, max_tokens=5,
                                         temperature=0, extra_body={"ignore_eos": True})
        assert resp.usage.completion_tokens == 5
    cached = resp.usage.prompt_tokens_details.cached_tokens
    assert cached > 0
    after = {name: metric(server.url, name) - before[name] for name in names}
    assert after == {"tprun:generation_tokens_total": 10,
                     "tprun:time_to_first_token_seconds_count": 2,
                     "tprun:e2e_request_latency_seconds_count": 2,
                     "tprun:request_success_total": 2,
                     "tprun:prefix_cache_queries_total": 2 * resp.usage.prompt_tokens,
                     "tprun:prefix_cache_hits_total": cached}
    page = httpx.get(f"{server.url}/metrics", timeout=30).text
    assert 'finished_reason="length"' in page
    assert metric(server.url, "tprun:inter_token_latency_seconds_count") >= 8
    assert metric(server.url, "tprun:prompt_tokens_total") > 0
    assert metric(server.url, "tprun:num_preemptions_total") == 0
    assert metric(server.url, "tprun:num_requests_waiting") == 0
