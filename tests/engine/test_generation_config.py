"""A model's recommended sampling from its generation_config.json, as vLLM
applies it (``--generation-config auto``): read by the file's own keys;
``LLM.generate`` without ``SamplingParams`` samples with it; over HTTP,
unset fields take it and its ``max_new_tokens`` caps ``max_tokens``;
``generation_config="vllm"`` leaves it. References: the same prompts with
the recommended values written out as explicit ``SamplingParams`` (greedy,
so the tokens are fixed), and the default's 16 tokens."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from checkpoint.generation_config import sampling_defaults
from checkpoint.tiny_model import ensure_tiny_model
from engine import LLM, SamplingParams
from tests.helpers.http_utils import openai_client, start_http, stop_http

PROMPT = "The quick brown fox"
# Greedy by recommendation, five tokens at most; do_sample is not a sampling default.
RECOMMENDED = {"temperature": 0.0, "top_k": 5, "max_new_tokens": 5, "do_sample": True,
               "eos_token_id": 257}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """``tiny`` with a generation_config.json of RECOMMENDED."""
    path = tmp_path_factory.mktemp("recommended") / "tiny"
    shutil.copytree(ensure_tiny_model(str(tmp_path_factory.mktemp("cache"))), path)
    (path / "generation_config.json").write_text(json.dumps(RECOMMENDED))
    return str(path)


def test_the_files_sampling_keys_by_their_names(tmp_path):
    assert sampling_defaults(str(tmp_path)) == {}  # no file
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.6, "top_p": 0.9, "max_new_tokens": 256, "repetition_penalty": None,
         "num_beams": 4, "bos_token_id": 1}))
    assert sampling_defaults(str(tmp_path)) == {"temperature": 0.6, "top_p": 0.9,
                                                "max_tokens": 256}
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_k": 2.5}))
    with pytest.raises(ValueError, match=r"generation_config.json: top_k must be an int"):
        sampling_defaults(str(tmp_path))


@pytest.mark.timeout(120)
def test_generate_without_params_samples_as_the_model_recommends(model_dir):
    greedy5 = SamplingParams(temperature=0.0, top_k=5, max_tokens=5)
    with LLM(model=model_dir, device="cpu") as llm:
        assert llm.get_default_sampling_params() == greedy5
        want = llm.generate(PROMPT, greedy5)[0].outputs[0].token_ids
        assert [llm.generate(PROMPT)[0].outputs[0].token_ids for _ in range(2)] == [want] * 2
        chat = [{"role": "user", "content": PROMPT}]
        assert llm.chat(chat)[0].outputs[0].token_ids == \
            llm.chat(chat, greedy5)[0].outputs[0].token_ids
    with LLM(model=model_dir, device="cpu", generation_config="vllm") as llm:
        assert llm.get_default_sampling_params() == SamplingParams()
        out = llm.generate(PROMPT, SamplingParams(ignore_eos=True))[0].outputs[0]
        assert len(out.token_ids) == 16


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_http_unset_fields_take_the_recommendation(model_dir, tmp_path):
    served = start_http(tmp_path, "serve", "--model", model_dir, "--device", "cpu",
                        "--disable-log-stats", "--max-model-len", "64")
    try:
        url = f"{served.url}/v1/completions"
        body = {"prompt": PROMPT, "ignore_eos": True}
        recommended = httpx.post(url, json=body, timeout=60).json()["choices"][0]
        capped = httpx.post(url, json=dict(body, max_tokens=12), timeout=60).json()
        chat = httpx.post(f"{served.url}/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": PROMPT}], "ignore_eos": True}).json()
        # Two prompts, max_tokens null: each is capped by its own room (62
        # tokens leave 2, 3 tokens leave 61, capped to 5).
        both = httpx.post(url, timeout=60, json=dict(
            body, prompt=[[7] * 62, [7, 8, 9]], max_tokens=None)).json()
    finally:
        code, output, leftovers = stop_http(served)
    assert code == 0 and not leftovers, output
    with LLM(model=model_dir, device="cpu") as llm:
        want = llm.generate(PROMPT, SamplingParams(temperature=0.0, top_k=5, max_tokens=5,
                                                   ignore_eos=True))[0].outputs[0]
    assert recommended["text"] == want.text and recommended["finish_reason"] == "length"
    assert capped["usage"]["completion_tokens"] == 5  # max_new_tokens caps max_tokens
    assert chat["usage"]["completion_tokens"] == 5
    assert (both["usage"]["prompt_tokens"], both["usage"]["completion_tokens"]) == (65, 7)
    assert [c["finish_reason"] for c in both["choices"]] == ["length", "length"]


SECONDARY = 97  # a byte token of tiny's, made an end id by generation_config.json


@pytest.fixture(scope="module")
def two_eos_dir(tmp_path_factory) -> str:
    """``tiny`` whose generation_config.json ends outputs at its tokenizer's
    EOS and at SECONDARY."""
    path = tmp_path_factory.mktemp("two_eos") / "tiny"
    shutil.copytree(ensure_tiny_model(str(tmp_path_factory.mktemp("cache"))), path)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [257, SECONDARY]}))
    return str(path)


def forced(**kw) -> SamplingParams:
    """Greedy with SECONDARY made the argmax wherever min_tokens (2) lets it be drawn."""
    return SamplingParams(**{"temperature": 0.0, "max_tokens": 6, "min_tokens": 2,
                             "logit_bias": {SECONDARY: 100.0}, **kw})


@pytest.mark.timeout(120)
def test_a_secondary_eos_id_is_the_stop_reason(two_eos_dir):
    """vLLM's rule for the end ids beyond the tokenizer's EOS: they join the
    request's stop token ids (unless ``ignore_eos``), so one that ends an
    output is its ``stop_reason``; the tokenizer's own EOS leaves it None;
    ``min_tokens`` holds every one back, with ``ignore_eos`` too. Hand-worked:
    the bias makes SECONDARY (or the EOS) the argmax once min_tokens is met."""
    with LLM(model=two_eos_dir, device="cpu") as llm:
        tokenizer = llm.get_tokenizer()
        assert tokenizer.eos_token_id == 257
        ended, ignored, by_eos, listed = [o.outputs[0] for o in llm.generate([PROMPT] * 4, [
            forced(), forced(ignore_eos=True), forced(logit_bias={257: 100.0}),
            forced(ignore_eos=True, stop_token_ids=[SECONDARY])])]
    assert (ended.finish_reason, ended.stop_reason) == ("stop", SECONDARY)
    assert len(ended.token_ids) == 3 and ended.token_ids[-1] == SECONDARY
    assert SECONDARY not in ended.token_ids[:2]
    assert ended.text == tokenizer.decode(ended.token_ids[:2])  # the stop token's text left out
    assert (ignored.finish_reason, ignored.stop_reason) == ("length", None)
    assert ignored.token_ids == ended.token_ids[:2] + [SECONDARY] * 4
    assert (by_eos.finish_reason, by_eos.stop_reason) == ("stop", None)
    assert by_eos.token_ids == ended.token_ids[:2] + [257]
    assert (listed.finish_reason, listed.stop_reason) == ("stop", SECONDARY)  # asked for: stays
    assert listed.token_ids == ended.token_ids


@pytest.mark.timeout(180)
def test_http_stop_reason_names_a_secondary_eos_id(two_eos_dir, tmp_path):
    """The HTTP answers carry the same ``stop_reason`` (completions and chat)."""
    served = start_http(tmp_path, "serve", "--model", two_eos_dir, "--device", "cpu",
                        "--disable-log-stats")
    try:
        with openai_client(served) as client:
            body = {"temperature": 0, "max_tokens": 6,
                    "extra_body": {"min_tokens": 2, "logit_bias": {str(SECONDARY): 100}}}
            completion = client.completions.create(model=two_eos_dir, prompt=PROMPT,
                                                   **body).choices[0]
            chat = client.chat.completions.create(
                model=two_eos_dir, messages=[{"role": "user", "content": PROMPT}],
                **body).choices[0]
            ignored = client.completions.create(model=two_eos_dir, prompt=PROMPT, **dict(
                body, extra_body=dict(body["extra_body"], ignore_eos=True))).choices[0]
    finally:
        code, output, leftovers = stop_http(served)
    assert code == 0 and not leftovers, output
    for choice in (completion, chat):
        assert (choice.finish_reason, choice.model_extra["stop_reason"]) == ("stop", SECONDARY)
    assert (ignored.finish_reason, ignored.model_extra["stop_reason"]) == ("length", None)
