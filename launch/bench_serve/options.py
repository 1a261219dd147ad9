"""The options of ``tprun bench serve``: vLLM's ``vllm bench serve``
names, defaults and meanings, for what this benchmark does (the random,
sharegpt, custom and prefix_repetition datasets, the completions and chat
endpoints)."""

from __future__ import annotations

import argparse
import json
import uuid

from launch.bench_serve.datasets import DATASETS
from launch.bench_serve.lora_assignment import ASSIGNMENTS
from launch.bench_serve.ramp_up import STRATEGIES
from launch.bench_serve.request import BACKENDS


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _json_object(text: str) -> dict:
    """A JSON object (what a request body can be merged with)."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def add_bench_serve_args(parser: argparse.ArgumentParser) -> None:
    server = parser.add_argument_group("server")
    server.add_argument("--backend", "--endpoint-type", dest="backend", default="openai",
                        choices=BACKENDS,
                        help="the API: openai and vllm send /v1/completions requests, "
                        "openai-chat /v1/chat/completions (with --endpoint "
                        "/v1/chat/completions)")
    server.add_argument("--base-url", default=None,
                        help="the server's URL (default: http://HOST:PORT)")
    server.add_argument("--host", default="127.0.0.1", help="the server's host")
    server.add_argument("--port", type=int, default=8000, help="the server's port")
    server.add_argument("--endpoint", default="/v1/completions",
                        help="the API path after the base URL")
    server.add_argument("--header", metavar="KEY=VALUE", nargs="*", default=None,
                        help="headers sent with every request")
    server.add_argument("--model", default=None,
                        help="the model name sent in requests and, unless --tokenizer, the "
                        "tokenizer's model ('tiny', a model directory or GGUF file; "
                        "default: the first model of the server's /v1/models)")
    server.add_argument("--served-model-name", default=None,
                        help="the model name sent in requests (default: --model)")
    server.add_argument("--tokenizer", default=None,
                        help="the model whose tokenizer makes the prompts and counts "
                        "output text ('tiny', a model directory or GGUF file; default: "
                        "--model)")
    server.add_argument("--insecure", action="store_true",
                        help="an https server's certificate is not checked (a self-signed "
                        "one, say)")
    server.add_argument("--lora-modules", nargs="+", default=None, metavar="NAME",
                        help="LoRA adapter names the server serves (its --lora-modules): "
                        "each request names one of them as its model")
    server.add_argument("--lora-assignment", default="random", choices=ASSIGNMENTS,
                        help="which adapter each request names: drawn by --seed (random) or "
                        "in turn (round-robin)")
    server.add_argument("--ready-check-timeout-sec", type=int, default=0,
                        help="first send the first prompt until it succeeds, for up to this "
                        "many seconds; failing that, stop with an error (0: no check)")
    dataset = parser.add_argument_group("dataset")
    dataset.add_argument("--dataset-name", default="random", choices=DATASETS,
                         help="where prompts come from: random token ids of the tokenizer "
                         "(random), a ShareGPT JSON file's conversations (sharegpt), a JSONL "
                         "file's prompts (custom), random prompts sharing a few prefixes "
                         "(prefix_repetition)")
    dataset.add_argument("--dataset-path", default=None, metavar="FILE",
                         help="the sharegpt or custom dataset's file")
    dataset.add_argument("--num-prompts", type=_positive_int, default=1000,
                         help="requests to send")
    dataset.add_argument("--input-len", type=int, default=None,
                         help="the same as --random-input-len")
    dataset.add_argument("--output-len", type=int, default=None,
                         help="every dataset's output length (--random-output-len, "
                         "--sharegpt-output-len, --custom-output-len, "
                         "--prefix-repetition-output-len)")
    dataset.add_argument("--no-oversample", action="store_true",
                         help="a file with fewer requests than --num-prompts sends only those "
                         "(without it, some are drawn again to make up the count)")
    dataset.add_argument("--disable-shuffle", action="store_true",
                         help="the file's order (prefix_repetition: prefix by prefix) instead "
                         "of a shuffle")
    dataset.add_argument("--skip-chat-template", action="store_true",
                         help="custom: send each prompt as it is, not rendered with the chat "
                         "template")
    dataset.add_argument("--chat-template-kwargs", type=_json_object, default=None,
                         help="custom: a JSON object of the chat template's variables when it "
                         "renders each prompt (e.g. '{\"enable_thinking\": false}')")
    synthetic = parser.add_argument_group("random dataset")
    synthetic.add_argument("--random-input-len", type=int, default=1024,
                           help="prompt tokens per request, as the server counts them")
    synthetic.add_argument("--random-output-len", type=int, default=128,
                           help="max_tokens per request")
    synthetic.add_argument("--random-range-ratio", type=float, default=0.0,
                           help="lengths drawn uniformly from [L*(1-r), L*(1+r)], r in [0, 1)")
    synthetic.add_argument("--random-prefix-len", type=int, default=0,
                           help="random tokens shared before every prompt")
    files = parser.add_argument_group("sharegpt and custom datasets")
    files.add_argument("--sharegpt-output-len", type=int, default=None,
                       help="sharegpt: max_tokens per request (default: the length of the "
                       "conversation's answer)")
    files.add_argument("--custom-output-len", type=int, default=256,
                       help="custom: max_tokens per request")
    prefixes = parser.add_argument_group("prefix_repetition dataset")
    prefixes.add_argument("--prefix-repetition-prefix-len", type=int, default=256,
                          help="tokens of each shared prefix")
    prefixes.add_argument("--prefix-repetition-suffix-len", type=int, default=256,
                          help="tokens of each prompt's own suffix, after its prefix")
    prefixes.add_argument("--prefix-repetition-num-prefixes", type=int, default=10,
                          help="prefixes, each shared by --num-prompts // this many prompts")
    prefixes.add_argument("--prefix-repetition-output-len", type=int, default=128,
                          help="max_tokens per request")
    traffic = parser.add_argument_group("traffic")
    traffic.add_argument("--request-rate", type=float, default=float("inf"),
                         help="requests per second, arriving as a Poisson process (gamma "
                         "with --burstiness); inf sends them all at once")
    traffic.add_argument("--burstiness", type=float, default=1.0,
                         help="the gamma shape of the gaps between sends: 1 Poisson, "
                         "below 1 burstier, above 1 more even")
    traffic.add_argument("--ramp-up-strategy", default=None, choices=STRATEGIES,
                         help="instead of --request-rate, raise each request's rate from "
                         "--ramp-up-start-rps at the first request to --ramp-up-end-rps at "
                         "the last: linearly, or by a constant factor per request "
                         "(exponential); --burstiness applies to each gap")
    traffic.add_argument("--ramp-up-start-rps", type=int, default=None,
                         help="the ramp's rate at the first request (at least 1)")
    traffic.add_argument("--ramp-up-end-rps", type=int, default=None,
                         help="the ramp's rate at the last request (at least the start)")
    traffic.add_argument("--max-concurrency", type=_positive_int, default=None,
                         help="at most this many requests in flight (the others wait)")
    traffic.add_argument("--probe-request-rate", type=float, default=0.0,
                         help="beside the load, one-token requests of a one-token prompt, one "
                         "at a time at most this many per second, outside --max-concurrency; "
                         "their latency is reported apart (0: none)")
    traffic.add_argument("--num-warmups", type=int, default=0,
                         help="requests of the first prompt sent before the measured run")
    traffic.add_argument("--seed", type=int, default=0, help="seed of prompts and arrivals")
    traffic.add_argument("--profile", action="store_true",
                         help="POST /start_profile before the measured run and /stop_profile "
                         "after it (the server needs --profiler-config)")
    traffic.add_argument("--request-id-prefix", default=f"bench-{uuid.uuid4().hex[:8]}-",
                         help="prefix of each request's x-request-id")
    sampling = parser.add_argument_group("sampling (sent when given)")
    sampling.add_argument("--ignore-eos", action="store_true",
                          help="generate max_tokens whatever the model says (always on "
                          "with the random dataset, as in vLLM)")
    sampling.add_argument("--logprobs", type=int, default=None,
                          help="logprobs per token (completions)")
    for name, kind in (("top-p", float), ("top-k", int), ("min-p", float),
                       ("temperature", float), ("frequency-penalty", float),
                       ("presence-penalty", float), ("repetition-penalty", float)):
        sampling.add_argument(f"--{name}", type=kind, default=None,
                              help=f"the request's {name.replace('-', '_')}")
    sampling.add_argument("--extra-body", type=_json_object, default=None,
                          help="a JSON object merged into every request body")
    results = parser.add_argument_group("results")
    results.add_argument("--percentile-metrics", default="ttft,tpot,itl",
                         help="comma-separated metrics to report: ttft, tpot, itl, e2el, "
                         "client_queue_time, e2el_including_client_queue")
    results.add_argument("--metric-percentiles", default="99",
                         help="comma-separated percentiles of each metric (e.g. 25,50,75)")
    results.add_argument("--goodput", nargs="+", default=None, metavar="KEY:VALUE",
                         help="count requests within every limit, in ms (ttft, tpot, e2el)")
    results.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    results.add_argument("--save-result", action="store_true",
                         help="save the result JSON")
    results.add_argument("--append-result", action="store_true",
                         help="append the result JSON to the file, one object a line")
    results.add_argument("--save-detailed", action="store_true",
                         help="keep per-request lists (ttfts, itls, texts, errors) in it")
    results.add_argument("--result-dir", default=None, help="directory of the result file")
    results.add_argument("--result-filename", default=None,
                         help="the result file's name (default: "
                         "{label}-{request_rate}qps[-concurrency{N}]-{model}-{date}.json; "
                         "with a ramp: {label}-ramp-up-{strategy}-{start}qps-{end}qps"
                         "[-concurrency{N}]-{model}-{date}.json)")
    results.add_argument("--label", default=None,
                         help="the result's label (default: --backend)")
    results.add_argument("--metadata", metavar="KEY=VALUE", nargs="*", default=None,
                         help="fields added to the result JSON")
