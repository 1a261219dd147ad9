"""``tprun serve --http-port --speculative-config`` on CPU with ``tiny``,
driven by the official ``openai`` client: greedy answers (two prompts, logprobs)
equal ``LLM.generate`` without drafts, a stop string inside a step's
accepted drafts cuts the output there (text, tokens and logprobs), and
/metrics shows the spec_decode counters."""

from __future__ import annotations

import json

import pytest

from engine import LLM, SamplingParams
from tests.helpers.http_utils import metric, serving_tiny

pytestmark = pytest.mark.timeout(240)

SPEC = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                   "prompt_lookup_min": 1})
# tiny answers this prompt with a run of period 2, which the drafts predict.
PROMPT = "the cat sat on the mat; the cat sat on the"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_tiny(tmp_path_factory.mktemp("http_spec"), "--nproc-per-node", "1", "serve",
                      "--model", "tiny", "--device", "cpu",
                      "--speculative-config", SPEC) as served:
        yield served


@pytest.fixture(scope="module")
def plain(server):
    """Greedy output without drafts: (token ids, text, logprobs)."""
    params = SamplingParams(temperature=0.0, max_tokens=40, logprobs=0)
    with LLM(model=server.model_dir, device="cpu") as llm:
        out = llm.generate(PROMPT, params)[0].outputs[0]
    return out.token_ids, out.text, [lp[t].logprob for t, lp in zip(out.token_ids,
                                                                    out.logprobs)]


def test_two_greedy_prompts_and_logprobs_equal_plain(client, plain, server):
    ids, text, logprobs = plain
    resp = client.completions.create(model="tiny", prompt=[PROMPT, PROMPT], max_tokens=40,
                                     temperature=0, logprobs=1)
    assert [c.text for c in resp.choices] == [text, text]
    for choice in resp.choices:
        assert choice.logprobs.token_logprobs == pytest.approx(logprobs, abs=1e-4)
    assert resp.usage.completion_tokens == 2 * len(ids)
    assert metric(server.url, "tprun:spec_decode_num_accepted_tokens_total") > 0
    assert metric(server.url, "tprun:spec_decode_num_draft_tokens_total") > 0


def _tokens_until(model_dir: str, ids: list[int], stop: str) -> int:
    """How many of ``ids`` the server's detokenizer needs before its text
    holds ``stop``."""
    from checkpoint.tokenizer import IncrementalDetokenizer, Tokenizer

    tokenizer = Tokenizer.from_dir(model_dir)
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode(PROMPT))
    text = ""
    for m, t in enumerate(ids, start=1):
        text += detok.feed([t])
        if stop in text:
            return m
    raise AssertionError("the stop string is not in the plain output")


def test_stop_string_inside_accepted_drafts_cuts_tokens_too(client, plain, server):
    """tiny's answer here is "f", then "\\x1d" and U+FFFD alternating, from
    token 4 on in runs of accepted drafts; the stop string completes inside
    one: text, token count and logprobs stop at the token completing it."""
    ids, text, _ = plain
    stop = "\x1d" + "\ufffd\x1d" * 4
    assert text.startswith("f" + stop)
    want_tokens = _tokens_until(server.model_dir, ids, stop)
    resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=40, temperature=0,
                                     stop=[stop], logprobs=0)
    choice = resp.choices[0]
    assert choice.text == "f" and choice.finish_reason == "stop"
    assert resp.usage.completion_tokens == want_tokens
    assert len(choice.logprobs.token_logprobs) == want_tokens
