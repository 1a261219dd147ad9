"""vLLM's ``repetition_detection`` over HTTP (the official client's
``extra_body``, vLLM's JSON object): a completions or chat request whose
greedy output repeats ends with finish reason "repetition" and
``stop_reason`` "repetition_detected", its tokens those of the same request
without the field (which runs to ``max_tokens``) up to the first repetition;
bad parameters are a 400 naming the field; /metrics counts the reason."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.engine.test_repetition_detection import first_repetition
from tests.helpers.http_utils import serving_tiny

pytestmark = pytest.mark.timeout(240)

DETECT = {"max_pattern_size": 6, "min_pattern_size": 3, "min_count": 2}
CHAT_DETECT = {"max_pattern_size": 4, "min_count": 3}  # min_pattern_size 0: 1
PLAIN = {"ignore_eos": True, "return_token_ids": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_tiny(tmp_path_factory.mktemp("http_repetition"), "serve", "--model", "tiny",
                      "--device", "cpu", "--disable-log-stats",
                      "--served-model-name", "tiny") as served:
        yield served


def _check(plain, detected, detect: dict) -> None:
    full = plain.model_extra["token_ids"]
    assert plain.finish_reason == "length" and len(full) == 40
    end = first_repetition(full, detect["max_pattern_size"], detect["min_count"],
                           detect.get("min_pattern_size", 0))
    assert end is not None and end < 40
    assert detected.model_extra["token_ids"] == full[:end]
    assert detected.finish_reason == "repetition"
    assert detected.model_extra["stop_reason"] == "repetition_detected"


def _successes(url: str, reason: str) -> float:
    page = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(sample.value for family in text_string_to_metric_families(page)
               for sample in family.samples
               if sample.name == "tprun:request_success_total"
               and sample.labels["finished_reason"] == reason)


def test_completion_ends_at_the_repetition(server, client):
    kwargs = dict(model="tiny", prompt="Hello world", max_tokens=40, temperature=0)
    plain = client.completions.create(**kwargs, extra_body=PLAIN)
    detected = client.completions.create(
        **kwargs, extra_body=dict(PLAIN, repetition_detection=DETECT))
    _check(plain.choices[0], detected.choices[0], DETECT)
    assert _successes(server.url, "repetition") >= 1  # /metrics counts the reason


def test_chat_ends_at_the_repetition(client):
    messages = [{"role": "user", "content": "Hello world"}]
    kwargs = dict(model="tiny", messages=messages, max_tokens=40, temperature=0)
    plain = client.chat.completions.create(**kwargs, extra_body=PLAIN)
    detected = client.chat.completions.create(
        **kwargs, extra_body=dict(PLAIN, repetition_detection=CHAT_DETECT))
    _check(plain.choices[0], detected.choices[0], CHAT_DETECT)


def test_bad_parameters_are_a_400_naming_the_field(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="tiny", prompt="hi", max_tokens=2, extra_body={
            "repetition_detection": {"max_pattern_size": 3, "min_count": 1}})
    assert "min_count" in str(caught.value)
    assert caught.value.body.get("param") == "repetition_detection"
