"""One ``tprun bench serve`` run, from options to exit code: resolve the
server's URL and model, make the prompts with the model's tokenizer, send
them at their arrival times under the concurrency limit, then print
vLLM's summary and save its result JSON.

The send times: ``--request-rate`` with ``--burstiness``, or a ramp-up
(``ramp_up``: each request at its own rate, recorded in the result as
``ramp_up_*`` and ``rps_change_events``).

``--lora-modules``: each measured request names an adapter
(``lora_assignment``); ``--probe-request-rate``: one-token probes run
beside the measured run (``probe``); ``--insecure``: an https server's
certificate is not checked.

Order of a run, as vLLM's: the ready check (``--ready-check-timeout-sec``
> 0: the first prompt until one succeeds, else ``BenchServeError``), the
warm-up requests (``--num-warmups`` of the first prompt, not measured),
with ``--profile`` ``POST /start_profile``, the measured run, then ``POST
/stop_profile``. A request that fails is counted and listed (its error),
never raised: a run whose every request fails still prints its table and
exits 0, as vLLM's does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import aiohttp

from launch.bench_serve.arrivals import arrival_offsets, arrive
from launch.bench_serve.datasets import dataset_requests, read_dataset
from launch.bench_serve.lora_assignment import lora_names
from launch.bench_serve.metrics import GOODPUT_METRICS, calculate_metrics
from launch.bench_serve.probe import probe_loop, probe_stats
from launch.bench_serve.ramp_up import RampUp, RpsChanges, ramp_up_from_args
from launch.bench_serve.random_dataset import SampleRequest
from launch.bench_serve.report import (
    DETAILED_FIELDS,
    METRIC_TITLES,
    metric_distributions,
    result_fields,
    selected_blocks,
    summary_lines,
)
from launch.bench_serve.request import CHAT_BACKENDS, RequestInput, RequestOutput, send_request

# vLLM's client timeout for one request, send to last byte.
REQUEST_TIMEOUT_S = 6 * 60 * 60
# Seconds between ready-check attempts.
READY_RETRY_S = 5.0
_SAMPLING_OPTIONS = ("top_p", "top_k", "min_p", "temperature", "frequency_penalty",
                     "presence_penalty", "repetition_penalty")


class BenchServeError(RuntimeError):
    """The run cannot go on: the server's models cannot be read, or the
    ready check ran out of time."""


@dataclass
class Settings:
    """The options, checked and read (``settings``)."""

    base_url: str
    api_url: str
    headers: dict[str, str]
    extra_body: dict[str, Any]
    metrics: list[str]
    percentiles: list[float]
    goodput: dict[str, float]
    metadata: dict[str, str]
    # The request-rate ramp (None: --request-rate for every request).
    ramp_up: RampUp | None
    # The dataset file's entries (``datasets.read_dataset``; none for a
    # dataset that makes its prompts).
    dataset_entries: list


def _pairs(items: list[str] | None, option: str) -> dict[str, str]:
    pairs = {}
    for item in items or ():
        if "=" not in item:
            raise ValueError(f"{option} takes KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        pairs[key.strip()] = value.strip()
    return pairs


def _goodput(items: list[str] | None) -> dict[str, float]:
    limits = {}
    for item in items or ():
        name, _, value = item.partition(":")
        try:
            limits[name] = float(value)
        except ValueError:
            raise ValueError(f"--goodput takes KEY:VALUE (ms), got {item!r}") from None
        if name not in GOODPUT_METRICS or limits[name] < 0:
            raise ValueError(f"--goodput {item!r}: the key must be one of "
                             f"{', '.join(GOODPUT_METRICS)} and the value at least 0")
    return limits


def settings(args) -> Settings:
    """The options read, the dataset's file too; ValueError naming the
    option for a bad one, so that no request (ready check, warm-up) is
    sent before a bad option or dataset file stops the run."""
    if args.backend in CHAT_BACKENDS and not args.endpoint.endswith("chat/completions"):
        raise ValueError(f"--backend {args.backend} sends chat requests: give --endpoint "
                         "/v1/chat/completions")
    if args.backend not in CHAT_BACKENDS and not args.endpoint.endswith("completions"):
        raise ValueError(f"--backend {args.backend} sends completions requests: --endpoint "
                         "must end with completions")
    if not args.request_rate > 0:
        raise ValueError(f"--request-rate must be positive (inf: all at once), got "
                         f"{args.request_rate}")
    if not args.burstiness > 0:
        raise ValueError(f"--burstiness must be positive, got {args.burstiness}")
    if not args.probe_request_rate >= 0:
        raise ValueError(f"--probe-request-rate must be at least 0 (0: no probes), got "
                         f"{args.probe_request_rate}")
    ramp_up = ramp_up_from_args(args.ramp_up_strategy, args.ramp_up_start_rps,
                                args.ramp_up_end_rps, args.request_rate)
    metrics = [m.strip() for m in args.percentile_metrics.split(",") if m.strip()]
    if unknown := [m for m in metrics if m not in METRIC_TITLES]:
        raise ValueError(f"--percentile-metrics: unknown {', '.join(unknown)} (one of "
                         f"{', '.join(METRIC_TITLES)})")
    try:
        percentiles = [float(p) for p in args.metric_percentiles.split(",")]
    except ValueError:
        raise ValueError("--metric-percentiles takes comma-separated numbers, got "
                         f"{args.metric_percentiles!r}") from None
    if not all(0 <= p <= 100 for p in percentiles):
        raise ValueError("--metric-percentiles must lie in [0, 100]")
    base = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    sampling = {k: getattr(args, k) for k in _SAMPLING_OPTIONS if getattr(args, k) is not None}
    return Settings(base_url=base, api_url=base + args.endpoint,
                    headers=_pairs(args.header, "--header"),
                    extra_body={**sampling, **(args.extra_body or {})}, metrics=metrics,
                    percentiles=percentiles, goodput=_goodput(args.goodput),
                    metadata=_pairs(args.metadata, "--metadata"), ramp_up=ramp_up,
                    dataset_entries=read_dataset(args))


def _tls(insecure: bool) -> bool:
    """aiohttp's ``ssl`` of a connector: False skips the certificate check
    (``--insecure``); True, aiohttp's default, checks an https server's."""
    return not insecure


def first_served_model(base_url: str, headers: dict[str, str],
                       insecure: bool = False) -> tuple[str, str]:
    """The first model of the server's /v1/models: the name requests give
    (its ``id``) and the model it serves (vLLM's ``root``, else the id)."""
    async def read() -> dict:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60),
                                         connector=aiohttp.TCPConnector(
                                             ssl=_tls(insecure))) as session:
            async with session.get(f"{base_url}/v1/models", headers=headers) as answer:
                answer.raise_for_status()
                return await answer.json(content_type=None)

    try:
        first = asyncio.run(read())["data"][0]
        return first["id"], first.get("root") or first["id"]
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, IndexError,
            TypeError) as e:
        raise BenchServeError(f"cannot read the models of {base_url}/v1/models (is the "
                              f"server running there?): {e!r}") from None


def load_tokenizer(model: str):
    """The tokenizer of ``model`` ('tiny', a model directory or GGUF file);
    ValueError for one tprun cannot load."""
    from checkpoint.resolve import resolve_model_dir
    from checkpoint.tokenizer import Tokenizer

    return Tokenizer.from_dir(resolve_model_dir(model))


async def _ready(session, backend: str, probe: RequestInput, timeout_s: float,
                 api_key: str | None) -> None:
    """Send ``probe`` until it succeeds, every ``READY_RETRY_S``; a probe
    still unanswered at the deadline is cancelled (as vLLM's): the check
    ends within ``timeout_s``, whatever the server does."""
    deadline = time.perf_counter() + timeout_s
    print(f"Waiting up to {timeout_s:g} s for the endpoint to answer...", flush=True)
    while True:
        try:
            out = await asyncio.wait_for(send_request(session, backend, probe, api_key),
                                         max(deadline - time.perf_counter(), 0))
        except asyncio.TimeoutError:
            out = RequestOutput(error=f"no answer within {timeout_s:g} s")
        if out.success:
            print("Initial test run completed.", flush=True)
            return
        if time.perf_counter() + READY_RETRY_S > deadline:
            raise BenchServeError("initial test run failed: check the benchmark's options "
                                  f"(URL, --model, --endpoint). Error: {out.error.strip()}")
        await asyncio.sleep(READY_RETRY_S)


@dataclass
class Measured:
    """What the measured run gives: every request's output, in order, its
    seconds, under a ramp-up vLLM's ``rps_change_events``, and the probe
    requests' outputs."""

    outputs: list[RequestOutput]
    duration: float
    rps_change_events: list[dict]
    # The --probe-request-rate requests' outputs, in order.
    probes: list[RequestOutput]


def _now() -> str:
    return datetime.now().isoformat()


async def benchmark(args, s: Settings, model: str, requests: list[SampleRequest]) -> Measured:
    """The measured run (after the ready check and the warm-up)."""
    api_key = os.environ.get("OPENAI_API_KEY") or None
    inputs = [RequestInput(prompt=r.prompt, api_url=s.api_url, prompt_len=r.prompt_len,
                           output_len=r.expected_output_len, model=model,
                           logprobs=args.logprobs, ignore_eos=args.ignore_eos,
                           extra_body=s.extra_body, extra_headers=s.headers,
                           request_id=r.request_id) for r in requests]
    probe = replace(inputs[0], request_id=None)
    if args.lora_modules:
        names = lora_names(args.lora_modules, len(inputs), args.lora_assignment, args.seed)
        inputs = [replace(given, model=name) for given, name in zip(inputs, names)]
    gate = (asyncio.Semaphore(args.max_concurrency) if args.max_concurrency
            else contextlib.nullcontext())
    # vLLM's pool: at most --max-concurrency connections (0: no limit), each
    # kept alive for reuse. No proxy from the environment (aiohttp's
    # default): the benchmark measures the server, not a proxy.
    connector = aiohttp.TCPConnector(limit=args.max_concurrency or 0,
                                     limit_per_host=args.max_concurrency or 0,
                                     keepalive_timeout=60, ssl=_tls(args.insecure))
    async with aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as client:
        if args.ready_check_timeout_sec > 0:
            await _ready(client, args.backend, probe, args.ready_check_timeout_sec, api_key)
        else:
            print("Skipping endpoint ready check.", flush=True)

        async def limited(given: RequestInput, arrived: float) -> RequestOutput:
            """``given`` once the gate lets it through; its client queue
            time counts from ``arrived``, its task's creation (vLLM's)."""
            async with gate:
                out = await send_request(client, args.backend, given, api_key)
            out.client_queue_time = out.start_time - arrived
            return out

        if args.num_warmups > 0:
            print(f"Warming up with {args.num_warmups} requests...", flush=True)
            await asyncio.gather(*(limited(probe, time.perf_counter())
                                 for _ in range(args.num_warmups)))
            print("Warmup run completed.", flush=True)
        if args.profile:
            await _profile(client, s, "start", api_key)
        distribution = "Poisson process" if args.burstiness == 1.0 else "Gamma distribution"
        ramp = s.ramp_up
        print(f"Traffic request rate: {args.request_rate}" if ramp is None else
              f"Traffic ramp-up strategy: {ramp.strategy}.\nWill increase RPS from "
              f"{ramp.start_rps} to {ramp.end_rps} RPS over the duration of the benchmark.",
              flush=True)
        print(f"Burstiness factor: {args.burstiness} ({distribution})\nMaximum request "
              f"concurrency: {args.max_concurrency}", flush=True)
        offsets = arrival_offsets(len(inputs), args.request_rate, args.burstiness, args.seed,
                                  ramp)
        rates = ramp.rates(len(inputs)) if ramp else [args.request_rate] * len(inputs)
        changes = RpsChanges()
        from tqdm import tqdm

        with tqdm(total=len(inputs), disable=args.disable_tqdm, file=sys.stderr) as bar:
            async def counted(given: RequestInput, arrived: float) -> RequestOutput:
                out = await limited(given, arrived)
                bar.update(1)
                return out

            stop_probes, probing = asyncio.Event(), None
            if args.probe_request_rate > 0:
                print(f"Probe request rate: {args.probe_request_rate} req/s", flush=True)
                short = replace(probe, prompt="Hi", prompt_len=1, output_len=1)
                probing = asyncio.create_task(_probes(args, short, api_key, stop_probes))
            start, tasks = time.perf_counter(), []
            if ramp:
                changes.start(ramp.start_rps, _now())
            async for given, rate in arrive(list(zip(inputs, rates)), offsets):
                if ramp:
                    changes.sent(rate, _now())
                tasks.append(asyncio.create_task(counted(given, time.perf_counter())))
            outputs = await asyncio.gather(*tasks)
            duration = time.perf_counter() - start
            stop_probes.set()
            probes = await probing if probing else []
        if args.profile:
            await _profile(client, s, "stop", api_key)
    return Measured(list(outputs), duration, changes.events, probes)


async def _probes(args, short: RequestInput, api_key: str | None,
                  stop: asyncio.Event) -> list[RequestOutput]:
    """The probe requests (``probe``), over a connection of their own: the
    run's pool, capped at --max-concurrency, would queue them behind the
    load they are there to measure."""
    async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=_tls(args.insecure)),
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as own:
        return await probe_loop(lambda: send_request(own, args.backend, short, api_key),
                                args.probe_request_rate, stop)


async def _profile(session, s: Settings, action: str, api_key: str | None) -> None:
    """``POST /start_profile`` or ``/stop_profile`` (``--profile``), as vLLM's
    bench: the run goes on whatever the answer, which is said on one line
    (a stop returns once the server has written its traces)."""
    print(f"{'Starting' if action == 'start' else 'Stopping'} profiler...", flush=True)
    headers = dict(s.headers)
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        async with session.post(f"{s.base_url}/{action}_profile", headers=headers) as answer:
            if answer.status == 200:
                print("Profiler started" if action == "start" else "Profiler stopped",
                      flush=True)
                return
            why = f"HTTP {answer.status}: {(await answer.text()).strip()[:200]}"
    except aiohttp.ClientError as e:
        why = repr(e)
    print(f"WARNING: /{action}_profile failed ({why}); is the server started with "
          "--profiler-config?", flush=True)


def result_filename(args, model: str, date: str) -> str:
    """vLLM's default name (the ramp's rates in place of the request rate
    under a ramp-up), or --result-filename; under --result-dir."""
    concurrency = (f"-concurrency{args.max_concurrency}" if args.max_concurrency is not None
                   else "")
    rate = (f"{args.request_rate}qps" if args.ramp_up_strategy is None else
            f"ramp-up-{args.ramp_up_strategy}-{args.ramp_up_start_rps}qps-"
            f"{args.ramp_up_end_rps}qps")
    name = args.result_filename or (f"{args.label or args.backend}-{rate}"
                                    f"{concurrency}-{model.split('/')[-1]}-{date}.json")
    if args.result_dir:
        os.makedirs(args.result_dir, exist_ok=True)
        name = os.path.join(args.result_dir, name)
    return name


def run_bench_serve(args, s: Settings) -> int:
    """The run of checked options ``s``; prints the summary, saves the
    result; 0 (failed requests are results, not errors)."""
    print("Model not specified, reading the server's first model..." if args.model is None
          else f"Model: {args.model}", flush=True)
    if args.model is None:
        model_name, model_id = first_served_model(s.base_url, s.headers, args.insecure)
    else:
        model_name, model_id = args.served_model_name or args.model, args.model
    tokenizer_id = args.tokenizer or model_id
    tokenizer = load_tokenizer(tokenizer_id)
    requests = dataset_requests(args, s.dataset_entries, tokenizer)
    if args.dataset_name == "random":  # runs to its lengths, as in vLLM
        args.ignore_eos = True
    if "temperature" not in s.extra_body:
        print("Note: no --temperature: the server's default sampling applies "
              "(--temperature 0 for greedy).", flush=True)
    measured = asyncio.run(benchmark(args, s, model_name, requests))
    outputs, duration = measured.outputs, measured.duration
    metrics = calculate_metrics(outputs, duration,
                                lambda text: len(tokenizer.encode(text, False)),
                                s.percentiles, s.goodput)
    _print_failures(outputs)
    found = metric_distributions(metrics, outputs, s.percentiles, args.max_concurrency,
                                 args.request_rate)
    blocks = selected_blocks(found, s.metrics)
    probed = probe_stats(measured.probes)
    for line in summary_lines(metrics, duration, args.max_concurrency, args.request_rate,
                              bool(s.goodput), blocks, probed):
        print(line)
    sys.stdout.flush()
    if args.save_result or args.append_result:
        date = datetime.now().strftime("%Y%m%d-%H%M%S")
        result = {"date": date, "endpoint_type": args.backend, "backend": args.backend,
                  "label": args.label, "model_id": model_id, "tokenizer_id": tokenizer_id,
                  "num_prompts": args.num_prompts, **s.metadata,
                  "request_rate": "inf" if math.isinf(args.request_rate) else args.request_rate,
                  "burstiness": args.burstiness, "max_concurrency": args.max_concurrency}
        if s.ramp_up:
            result.update(ramp_up_strategy=s.ramp_up.strategy,
                          ramp_up_start_rps=s.ramp_up.start_rps,
                          ramp_up_end_rps=s.ramp_up.end_rps)
        result.update(result_fields(metrics, outputs, duration, bool(s.goodput), blocks))
        result.update(probed or {})
        if measured.rps_change_events:
            result["rps_change_events"] = measured.rps_change_events
        if not args.save_detailed:
            result = {k: v for k, v in result.items() if k not in DETAILED_FIELDS}
        _write_result(result_filename(args, model_id, date), result, args.append_result)
    return 0


def _print_failures(outputs: list[RequestOutput]) -> None:
    failed = [o for o in outputs if not o.success]
    if len(failed) == len(outputs):
        print("WARNING: all requests failed: check the benchmark's options (URL, --model, "
              "--endpoint).", flush=True)
    if failed:
        print("Failed requests during benchmark run detected (capping to 10):")
        for i, out in enumerate(failed[:10]):
            print(f"Error {i}: {out.error}")


def _write_result(path: str, result: dict, append: bool) -> None:
    with open(path, "a+" if append else "w", encoding="utf-8") as f:
        if append and f.tell() != 0:
            f.write("\n")
        json.dump(result, f)
    print(f"Result saved to {path}", flush=True)
