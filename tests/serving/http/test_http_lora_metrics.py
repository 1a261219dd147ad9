"""vLLM's ``lora_requests_info`` gauge on ``GET /metrics`` (as
``tprun:lora_requests_info``): its labels name the adapters the engine's
running and waiting requests really run with, and its value is the Unix
time of the stats it shows.

A server with one adapter slot (``--max-loras 1``) and two adapters: a
request streaming under "sql" holds the slot, so a request under "mlp"
waits until it ends, while a request on the base model runs beside it and
is listed under no adapter. The requests are the official ``openai``
client's; the streaming ones ignore the end-of-sequence token and ask for
more tokens than a slow machine makes in the minute the test may look, so
each state is there to be read until the test ends it (closing a stream
aborts its request)."""

from __future__ import annotations

import threading
import time

import pytest

from engine.prometheus_metrics import Metrics
from ipc.engine_messages import EngineStats
from tests.helpers.http_utils import metric, openai_client, serving_model
from tests.helpers.lora_adapters import model_with_adapters

INFO = "tprun:lora_requests_info"
PROMPT = [5, 17, 99, 3]
LONG = 16_000  # the model's 16,384 positions less the prompt and a margin
SHORT = 20  # mlp's request, answered once sql's is aborted


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("http-lora-metrics")
    model_dir, paths, _ = model_with_adapters(root, [PROMPT], 1, max_position_embeddings=16_384)
    with serving_model(root, model_dir, "--nproc-per-node", "1", "serve", "--model", model_dir,
                       "--served-model-name", "base", "--device", "cpu", "--disable-log-stats",
                       "--enable-lora", "--max-loras", "1", "--lora-modules",
                       f"sql={paths[1]}", f"mlp={paths[3]}") as server:
        with openai_client(server) as client:
            yield server, client


def _stream(client, model: str):
    """A streaming completion under ``model``, once its first chunk came
    (the request is running then)."""
    stream = client.completions.create(model=model, prompt=PROMPT, max_tokens=LONG,
                                       temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    chunks = iter(stream)
    next(chunks)
    return stream


def _info_when(url: str, running: str, waiting: str) -> tuple[float, float, float]:
    """(the time before the scrape, the gauge's value, the time after) of
    the first scrape whose sample has these labels; KeyError naming the
    page if none has within a minute."""
    labels = {"max_lora": "1", "running_lora_adapters": running,
              "waiting_lora_adapters": waiting}
    deadline = time.monotonic() + 60
    while True:
        before = time.time()
        try:
            value = metric(url, INFO, labels)
        except KeyError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
            continue
        return before, value, time.time()


@pytest.mark.timeout(300)
def test_the_labels_name_the_adapters_of_the_running_and_waiting_requests(served):
    server, client = served
    before, value, after = _info_when(server.url, running="", waiting="")  # idle
    assert before <= value <= after
    sql, plain = _stream(client, "sql"), _stream(client, "base")
    answers = []
    waiting = threading.Thread(target=lambda: answers.append(client.completions.create(
        model="mlp", prompt=PROMPT, max_tokens=SHORT, temperature=0,
        extra_body={"ignore_eos": True})))
    waiting.start()
    try:
        before, value, after = _info_when(server.url, running="sql", waiting="mlp")
        assert before <= value <= after
        assert metric(server.url, "tprun:num_requests_running") == 2  # sql's and the base one's
        assert metric(server.url, "tprun:num_requests_waiting") == 1  # mlp's
        sql.close()  # aborts it: the slot goes to mlp
        _info_when(server.url, running="mlp", waiting="")
    finally:
        sql.close()
        plain.close()
        waiting.join(timeout=240)
    assert answers and answers[0].model == "mlp"
    assert answers[0].usage.completion_tokens == SHORT
    _info_when(server.url, running="", waiting="")


def test_the_page_shows_each_engines_adapters_in_their_requests_order():
    """Names joined by commas, each once, in the order of the requests
    (hand-written snapshots); several engines each under ``engine``; LoRA
    off, no gauge."""
    from prometheus_client.parser import text_string_to_metric_families

    def stats(running: dict, waiting: dict) -> EngineStats:
        return EngineStats(num_running=sum(running.values()), num_waiting=sum(waiting.values()),
                           num_blocks=8, num_free_blocks=8, kv_usage=0.0, prefix_hit_rate=0.0,
                           num_preemptions=0, num_steps=0, num_prompt_tokens=0,
                           num_generation_tokens=0, num_scheduled_tokens=0,
                           running_lora_adapters=running, waiting_lora_adapters=waiting)

    def samples(metrics: Metrics, snapshots) -> list:
        page = metrics.render(snapshots).decode()
        return [s for family in text_string_to_metric_families(page)
                for s in family.samples if s.name == INFO]

    one = stats({"b": 2, "a": 1}, {"c": 1})
    before = time.time()
    (sample,) = samples(Metrics("m", max_loras=2), one)
    assert sample.labels == {"max_lora": "2", "running_lora_adapters": "b,a",
                             "waiting_lora_adapters": "c"}
    assert before <= sample.value <= time.time()
    got = samples(Metrics("m", max_loras=4), [one, stats({}, {"a": 3})])
    assert [s.labels for s in got] == [
        {"max_lora": "4", "running_lora_adapters": "b,a", "waiting_lora_adapters": "c",
         "engine": "0"},
        {"max_lora": "4", "running_lora_adapters": "", "waiting_lora_adapters": "a",
         "engine": "1"}]
    assert samples(Metrics("m"), one) == []
