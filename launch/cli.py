"""``tprun``: torchrun's flags, then a subcommand that does the work.

    tprun --nproc-per-node 2 generate --model tiny --prompt "Hello" --json
    tprun --nproc-per-node 2 serve --model tiny --endpoint-file /tmp/ep
    tprun --nproc-per-node 2 serve --model tiny --http-port 8000   # + OpenAI HTTP API
    tprun --nproc-per-node 2 bench --model tiny --num-prompts 64 --json
    tprun --nproc-per-node 2 run-batch -i requests.jsonl -o results.jsonl --model tiny
    tprun bench serve --base-url http://127.0.0.1:8000 --num-prompts 100   # vLLM's bench serve

The tprun process is the executor process (engine + executor); it starts
one worker daemon per rank with the environment torchrun would set.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import dataclasses
import decimal
import json
import logging
import os
import signal
import sys

from launch.generate_output import output_lines
from launch.sampling_flags import (
    add_sampling_flags,
    check_logprobs,
    check_thinking_budget,
    sampling_params,
)

DEFAULT_PROMPTS = ["Hello, my name is", "The future of AI is"]

logger = logging.getLogger("tprun.serve")


# A dict field takes its JSON text (EngineConfig parses it).
_TYPES = {"int": int, "float": float, "str": str, "dict": str, "list": str}

_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_int(text: str) -> int:
    """An integer as vLLM's CLI reads token counts and byte sizes: plain,
    or with a decimal suffix k/m/g/t (``32k`` 32000, ``25.6k`` 25600) or a
    binary one K/M/G/T (``32K`` 32768; a whole number only)."""
    text = text.strip()
    number, suffix = text[:-1], text[-1:]
    try:
        if suffix in _DECIMAL:
            value = decimal.Decimal(number) * _DECIMAL[suffix]
            if value != value.to_integral_value():
                raise ValueError("not a whole number")
            return int(value)
        if suffix in _BINARY:
            return int(number) * _BINARY[suffix]
        return int(text)
    except (ValueError, OverflowError, decimal.InvalidOperation):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an integer (2048, 32k = 32000, 32K = 32768)") from None


def human_int_or_auto(text: str) -> int:
    """``human_int``, or -1 for ``auto`` (any case) and ``-1``: vLLM's
    ``--max-model-len`` value for the longest length the KV cache holds."""
    if text.strip().lower() in ("auto", "-1"):
        return -1
    try:
        return human_int(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(str(e)[:-1] + "; or auto)") from None


# Fields that take human_int's forms on the command line, as in vLLM's. They
# are read in _engine_config, so that a bad value is one line like any other.
_HUMAN_INTS = {"max_model_len": human_int_or_auto, "max_num_batched_tokens": human_int,
               "kv_cache_memory_bytes": human_int}


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions as written, and every option's default after its help,
    except a None default: it means "decided elsewhere", which the option's
    own help says."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


def _engine_args(parser: argparse.ArgumentParser) -> None:
    """One option per ``EngineConfig`` field (its name in kebab case, or the
    flag its metadata names), with the field's default and help text."""
    from engine.config import EngineConfig

    for f in dataclasses.fields(EngineConfig):
        meta = f.metadata
        if meta.get("cli") is False:
            continue
        flag = _flag(f)
        base = str(f.type).split("|")[0].strip()
        default = argparse.SUPPRESS if meta.get("given_only") else f.default
        kwargs = dict(dest=f.name, default=default, help=meta["help"])
        if base == "bool":
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = str if f.name in _HUMAN_INTS else _TYPES[base]
            for key in ("choices", "metavar", "nargs"):
                if key in meta:
                    kwargs[key] = meta[key]
        parser.add_argument(flag, *meta.get("aliases", ()), **kwargs)


def _flag(f: dataclasses.Field) -> str:
    """The option of an ``EngineConfig`` field."""
    return f.metadata.get("flag", "--" + f.name.replace("_", "-"))


def _default_model_said(parser: argparse.ArgumentParser) -> None:
    """``generate`` without ``--model`` runs 'tiny' and says so on stderr
    (``run_generate``); its help says so too."""
    action = next(a for a in parser._actions if a.dest == "model")
    action.default = argparse.SUPPRESS
    action.help += " (default: 'tiny', the built-in model, said on stderr)"


def _engine_config(args, **overrides):
    """The ``EngineConfig`` of the parsed options; the top-level torchrun
    flags give the TP size (or the subcommand's vLLM spelling of it) and
    the rendezvous address."""
    from engine.config import EngineConfig

    # An option left out on purpose (generate's --model) keeps the field's default.
    kwargs = {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig)
              if f.metadata.get("cli") is not False and hasattr(args, f.name)}
    kwargs.update(_human_ints(kwargs))
    kwargs.update(tensor_parallel_size=_tensor_parallel_size(args), executor="mp",
                  master_addr=args.master_addr, master_port=args.master_port)
    kwargs.update(overrides)
    return EngineConfig(**kwargs)


def _human_ints(kwargs: dict) -> dict:
    """The ``_HUMAN_INTS`` options given as text, read as vLLM reads them;
    ConfigError naming the option for text that is no such value."""
    from engine.config import ConfigError, EngineConfig

    read = {}
    for f in dataclasses.fields(EngineConfig):
        text = kwargs.get(f.name)
        if f.name not in _HUMAN_INTS or not isinstance(text, str):
            continue  # left out: the field's default
        try:
            read[f.name] = _HUMAN_INTS[f.name](text)
        except argparse.ArgumentTypeError as e:
            raise ConfigError(f"{_flag(f)} {e}") from None
    return read


def _tensor_parallel_size(args) -> int:
    """``--nproc-per-node N`` (torchrun's, before the subcommand) or vLLM's
    ``--tensor-parallel-size`` / ``-tp`` (after it); both given must agree.
    With serve's ``--data-parallel-size D`` N counts the ranks of all D
    replicas: N = T x D, T the ranks of one (-tp T, else N / D)."""
    from engine.config import ConfigError

    nproc = getattr(args, "nproc_per_node", None)
    tp = getattr(args, "tensor_parallel_size", None)
    dp = getattr(args, "data_parallel_size", 1)
    if dp < 1:
        raise ConfigError(f"--data-parallel-size must be at least 1, got {dp}")
    if dp > 1 and nproc is not None:
        if tp is not None and nproc != tp * dp:
            raise ConfigError(f"--nproc-per-node {nproc} is not --tensor-parallel-size {tp} x "
                              f"--data-parallel-size {dp} = {tp * dp} (the ranks of all "
                              "replicas): give one of them")
        if nproc % dp:
            raise ConfigError(f"--nproc-per-node {nproc} is not a multiple of "
                              f"--data-parallel-size {dp}: each replica has as many ranks")
        return nproc // dp
    if nproc is not None and tp is not None and nproc != tp:
        raise ConfigError(f"--nproc-per-node {nproc} and --tensor-parallel-size {tp} disagree: "
                          "give one of them")
    return next((n for n in (tp, nproc) if n is not None), 1)


def build_parser() -> argparse.ArgumentParser:
    # No abbreviations of tprun's own options: argparse matches them against
    # every argument, the subcommand's too (generate's --n would be taken
    # for an abbreviation of --nproc-per-node).
    parser = argparse.ArgumentParser(prog="tprun", description=__doc__,
                                     formatter_class=_HelpFormatter, allow_abbrev=False)
    # No argparse default: _tensor_parallel_size tells it given from left out.
    parser.add_argument("--nproc-per-node", "--nproc_per_node", type=int,
                        default=argparse.SUPPRESS,
                        help="tensor-parallel ranks (worker daemons) on this host; the "
                        "subcommand's --tensor-parallel-size / -tp is vLLM's spelling "
                        "(default: 1)")
    parser.add_argument("--master-addr", "--master_addr", default="127.0.0.1",
                        help="address of the ranks' rendezvous (torchrun's MASTER_ADDR)")
    parser.add_argument("--master-port", "--master_port", type=int, default=None,
                        help="port of the ranks' rendezvous (torchrun's MASTER_PORT; "
                        "default: a free one)")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text for prompts",
                         formatter_class=_HelpFormatter)
    _engine_args(gen)
    _default_model_said(gen)
    gen.add_argument("--prompt", action="append", default=[],
                     help="a text prompt (repeatable; none: two built-in prompts, said on "
                     "stderr)")
    gen.add_argument("--prompt-token-ids", action="append", default=[],
                     help="a prompt as comma-separated token ids (repeatable)")
    gen.add_argument("--chat", action="store_true",
                     help="send each --prompt as one user message through the model's chat "
                     "template (as LLM.chat)")
    add_sampling_flags(gen)
    gen.add_argument("--json", action="store_true",
                     help="one JSON object per completion and line")
    gen.add_argument("--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
                     help="with --enable-lora: the LoRA adapter (a PEFT directory) every prompt "
                     "runs with, in serve's --lora-modules form (one: generate has no "
                     "model name a prompt could choose an adapter by)")
    constraint = gen.add_mutually_exclusive_group()
    constraint.add_argument("--json-schema", metavar="FILE", default=None,
                            help="constrain the output to this JSON schema (a file)")
    constraint.add_argument("--regex", default=None,
                            help="constrain the output to match this regular expression")
    constraint.add_argument("--choice", nargs="+", default=None, metavar="TEXT",
                            help="the output is exactly one of these texts")
    _serve_parser(sub)
    _bench_parser(sub)
    _run_batch_parser(sub)
    return parser


SERVE_HELP = """\
Serve the engine to clients (serving.client.EngineClient) over ZeroMQ.

Where it listens: by default an ipc:// socket in a new private directory
(mode 0700); --port P: tcp://127.0.0.1:P; --host ADDR [--port P]:
tcp://ADDR:P, with a warning unless ADDR is loopback.

Every message must carry an HMAC-SHA256 made with a secret generated at each
start. The secret is written (hex, mode 0600) to engine.key in the private
directory (next to the ipc:// socket) and, with --endpoint-file F, to F.key;
the start-up line names the key file, and shutdown removes it. EngineClient
finds the key itself given F or the ipc:// address; for a tcp:// address
pass key_file=. Messages without a valid MAC are dropped and logged.

With --http-port P it also serves the OpenAI API over HTTP (/v1/completions,
/v1/chat/completions, /v1/responses, /v1/models, /tokenize, /detokenize,
/health, /metrics)
on --host (default 127.0.0.1), as one more client of the engine endpoint,
logging one line per request unless --no-access-log; --api-key KEY ... (or
$TPRUN_API_KEY, or vLLM's $VLLM_API_KEY) makes /v1 and /v2 routes require
'Authorization: Bearer KEY' with one of the keys.
--enable-auto-tool-choice --tool-call-parser NAME serves tool_choice "auto"
(the default when tools are given): the model answers freely and the parser
finds its calls in the text (llama3_json: Llama 3.x JSON calls; hermes:
<tool_call> blocks of Hermes, Qwen, SmolLM2; pythonic: a Python list of
calls, Llama 3.2 and 4; mistral: [TOOL_CALLS] calls of Mistral models;
qwen3_coder: the XML <function=...> calls of Qwen3-Coder);
without them "auto" is refused. --reasoning-parser deepseek_r1|qwen3 answers a
reasoning model's thinking (<think>...</think>) in the message's "reasoning"
field, apart from its content. The host and the ports are bound once and released before the model loads: a
host that does not resolve or is not this machine's, or a busy port, is
refused at once.

With --http-port, --data-parallel-size D (-dp D) serves D engine replicas
of -tp T ranks each behind the one HTTP server (--nproc-per-node counts
all T x D ranks), each request sent to the replica with the fewest
unfinished requests; a replica that fails ends the server.

From vLLM's `vllm serve MODEL ...`: the model may come first (MODEL, as
--model), -tp is --nproc-per-node, and vLLM's --port (the HTTP port) is
--http-port here: --port is the engine endpoint's.
"""

# vLLM's serve options for what tprun's HTTP server does not do: refused by name.
_REFUSED_SERVE_OPTIONS = {
    "--root-path": "tprun serves its routes at / (no ASGI root path): have the proxy strip "
                   "the path prefix",
    "--ssl-keyfile": "tprun serves plain HTTP (no TLS): put a TLS-terminating proxy in front",
    "--ssl-certfile": "tprun serves plain HTTP (no TLS): put a TLS-terminating proxy in front",
}

# uvicorn's level names (its "trace" is below debug).
_UVICORN_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")

# vLLM's request-log toggles; the first two ask for the log tprun does not write.
_LOG_REQUESTS_FLAGS = ("--enable-log-requests", "--no-disable-log-requests",
                       "--disable-log-requests", "--no-enable-log-requests")


class _LogRequests(argparse.Action):
    """Which of ``_LOG_REQUESTS_FLAGS`` was given (the last one), for
    ``_check_http_args``'s note; none changes what tprun logs."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, option_string)


def _serve_parser(sub) -> None:
    serve = sub.add_parser("serve", help="serve the engine to clients over ZeroMQ",
                           description=SERVE_HELP, formatter_class=_HelpFormatter)
    _engine_args(serve)
    model = next(a for a in serve._actions if a.dest == "model")
    model.default = argparse.SUPPRESS  # given or not: _serve_model tells
    model.help += " (or MODEL first, as vLLM's serve takes it; default: 'tiny')"
    serve.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                       help="the model, as in `vllm serve MODEL` (the same as --model)")
    serve.add_argument("--data-parallel-size", "-dp", type=int, default=1,
                       help="with --http-port: engine replicas behind the one HTTP server, "
                       "each with its own -tp ranks (--nproc-per-node counts them all: "
                       "-tp x -dp); a request goes to the replica with the fewest unfinished "
                       "requests")
    serve.add_argument("--port", type=int, default=None,
                       help="listen on tcp://127.0.0.1:PORT (0: any free port) instead of an "
                       "ipc:// socket in a private directory (not vLLM's --port, the HTTP "
                       "port: that is --http-port)")
    serve.add_argument("--host", default=None,
                       help="listen on tcp://HOST:PORT (PORT from --port, else any free one); "
                       "an address other than loopback draws a warning")
    serve.add_argument("--endpoint-file", default=None,
                       help="write the endpoint address to this file once the engine is ready, "
                       "and the key to this file + '.key'")
    serve.add_argument("--disable-log-stats", action="store_true",
                       help="no periodic stats line")
    serve.add_argument("--log-stats-interval", type=float, default=10.0,
                       help="seconds between stats lines")
    serve.add_argument("--http-port", type=int, default=None,
                       help="also serve the OpenAI API over HTTP on this port (0: any free "
                       "one), on --host (default 127.0.0.1); the engine endpoint then stays "
                       "an ipc:// socket (or tcp://127.0.0.1:PORT with --port)")
    serve.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                       help="with --http-port: the names requests may give the model, the "
                       "first in metrics and /v1/models first (default: --model as given)")
    serve.add_argument("--allowed-origins", nargs="+", default=None, metavar="ORIGIN",
                       help="with --http-port: web origins (e.g. http://localhost:3000, or *) "
                       "whose pages may call the API from a browser (CORS); default none")
    serve.add_argument("--api-key", nargs="+", action="extend", default=None, metavar="KEY",
                       help="with --http-port: require 'Authorization: Bearer KEY' on /v1 "
                       "routes, KEY any of those given (--api-key K1 K2, or the option "
                       "repeated); default: $TPRUN_API_KEY, else vLLM's $VLLM_API_KEY, else "
                       "no key")
    serve.add_argument("--no-access-log", "--disable-uvicorn-access-log", dest="access_log",
                       action="store_false",
                       help="with --http-port: no log line per HTTP request (method, path, "
                       "status, duration)")
    serve.add_argument("--uvicorn-log-level", default=None, choices=_UVICORN_LEVELS,
                       help="with --http-port: the level of uvicorn's own log, its start-up "
                       "lines included (None: warning)")
    serve.add_argument(*_LOG_REQUESTS_FLAGS, dest="log_requests", default=None,
                       action=_LogRequests, nargs=0,
                       help="vLLM's; taken, changes nothing: tprun logs no request's prompt "
                       "or parameters (with --http-port, each request has its access-log "
                       "line)")
    serve.add_argument("--enable-responses-api-store", action="store_true", default=None,
                       help="with --http-port: keep /v1/responses answers in memory (the "
                       "newest 1024 finished, at most 64 Mi characters, and every one still "
                       "running) for GET /v1/responses/ID, its input_items, DELETE, "
                       "previous_response_id and background responses (their cancel and "
                       "streamed replay) (default: vLLM's $VLLM_ENABLE_RESPONSES_API_STORE=1, "
                       "else off)")
    serve.add_argument("--enable-server-load-tracking", action=argparse.BooleanOptionalAction,
                       default=False,
                       help="with --http-port: vLLM's; count the requests in flight of the "
                       "routes that use the engine (generation, Responses API, pooling, "
                       "/invocations), from their arrival until their response (a stream "
                       "too) has been sent, which GET /load answers as {\"server_load\": N} "
                       "(off: /load answers 0)")
    serve.add_argument("--stream-interval", default=None, metavar="N",
                       help="with --http-port: vLLM's; a completion or chat stream sends a "
                       "choice's first token at once, then a chunk per N new tokens, the "
                       "last chunk the rest; a request's stream_interval may raise it, not "
                       "lower it (None: 1, a chunk per engine step)")
    serve.add_argument("--chat-template", default=None, metavar="FILE_OR_TEMPLATE",
                       help="with --http-port: the chat template of /v1/chat/completions "
                       "instead of the model's, as vLLM's: a file, or the Jinja template "
                       "itself (text with a brace or a line break; \\n escapes read as such)")
    serve.add_argument("--trust-request-chat-template", action="store_true",
                       help="with --http-port: vLLM's; render a chat or /tokenize request's "
                       "own chat_template (or chat_template_kwargs' chat_template, unless "
                       "--chat-template is given) in the template sandbox instead of "
                       "refusing it (a 400 without this option)")
    serve.add_argument("--response-role", default=None, metavar="ROLE",
                       help="with --http-port: vLLM's; the role of a chat answer after a "
                       "generation prompt (None: assistant; without a generation prompt "
                       "the answer continues the last message, in its role)")
    serve.add_argument("--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
                       help="with --http-port and --enable-lora: vLLM's; LoRA adapters (PEFT "
                       "directories) served as models of their own: a request whose model "
                       "is NAME runs with that adapter (also a JSON object "
                       "'{\"name\": NAME, \"path\": PATH}')")
    serve.add_argument("--allow-runtime-lora-updating", action="store_true", default=None,
                       help="with --http-port and --enable-lora: serve vLLM's POST "
                       "/v1/load_lora_adapter and /v1/unload_lora_adapter, which load and "
                       "unload adapters while the server runs (also vLLM's "
                       "$VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; off: they are 404)")
    for flag, why in _REFUSED_SERVE_OPTIONS.items():
        serve.add_argument(flag, default=None, help=f"vLLM's; refused: {why}")
    serve.add_argument("--enable-auto-tool-choice", action="store_true",
                       help='with --http-port and --tool-call-parser: serve tool_choice "auto" '
                       "by reading calls out of the model's free text")
    serve.add_argument("--tool-call-parser", default=None, metavar="NAME",
                       help="the model's tool-call syntax for --enable-auto-tool-choice: "
                       "llama3_json, hermes, pythonic, mistral or qwen3_coder")


BENCH_SERVE_HELP = """\
vLLM's online serving benchmark (`vllm bench serve`): send --num-prompts
streamed requests of random prompts (token ids of the model's tokenizer,
decoded to text; or --dataset-name sharegpt / custom --dataset-path FILE,
or prefix_repetition) to an OpenAI-compatible server (`tprun serve
--http-port`, vLLM's) at --request-rate (Poisson; gamma with --burstiness; inf: all at
once) under --max-concurrency, then print TTFT, TPOT, ITL and E2EL
(mean, median, --metric-percentiles) and throughputs; --save-result
writes vLLM's result JSON. Failed requests are counted, not fatal.

    tprun bench serve --base-url http://127.0.0.1:8000 --model tiny \\
        --random-input-len 512 --random-output-len 128 --num-prompts 100 \\
        --request-rate 10
"""


def _bench_parser(sub) -> None:
    bench = sub.add_parser("bench", help="throughput and latency (in-process engine); "
                           "bench serve: against an HTTP server",
                           formatter_class=_HelpFormatter)
    _engine_args(bench)
    bench.add_argument("--num-prompts", type=int, default=64, help="requests to run")
    bench.add_argument("--input-len", type=int, default=128, help="random prompt length")
    bench.add_argument("--output-len", type=int, default=64, help="output tokens per request")
    bench.add_argument("--dataset", default=None,
                       help='JSONL file, one {"prompt": ...} or {"prompt_token_ids": [...]} '
                       '(optional "max_tokens") per line')
    bench.add_argument("--temperature", type=float, default=0.0,
                       help="sampling temperature (0: greedy)")
    bench.add_argument("--no-warmup", action="store_true",
                       help="no warm-up request before the measured run")
    bench.add_argument("--json", action="store_true",
                       help="print the summary as one JSON object (last line of stdout)")
    modes = bench.add_subparsers(dest="bench_mode", metavar="{serve}")
    serve = modes.add_parser("serve", help="vLLM's online serving benchmark against an "
                             "OpenAI-compatible HTTP server", description=BENCH_SERVE_HELP,
                             formatter_class=_HelpFormatter)
    from launch.bench_serve.options import add_bench_serve_args

    add_bench_serve_args(serve)


RUN_BATCH_HELP = """\
Answer an OpenAI batch file offline, as vLLM's `vllm run-batch`: each line
is sent to the OpenAI API's route it names, in process, on an engine started
as serve starts it, so each answer is the one the HTTP server would give.
The lines run concurrently (the engine batches them); the output has one
line per input line (blank lines skipped), in the input's order.

Input line:  {"custom_id": ID, "method": "POST", "url": "/v1/chat/completions",
             "/v1/completions" or (with --runner pooling) "/v1/embeddings",
             "body": {... the route's request ...}}
Output line: {"id", "custom_id", "response": {"status_code", "request_id",
             "body"}, "error"}: body the answer (status 200), else null and
             error the route's error body (its HTTP status in status_code);
             an url not served (or not the model's: embeddings on a
             generating model, generation on a pooling one), a streaming
             request or a line that is not a batch request: status 400 and
             error a message.

Either file may be an http:// or https:// URL, as in vLLM: the input is
read with a GET before the engine starts, the output written to a local
file and sent whole with a PUT once the batch has ended well (an upload
that fails names that file, which stays).

Exit code 0 when every line was a batch request (refused ones included),
2 when some were not (each has its error line; the others are answered).
"""


def _run_batch_parser(sub) -> None:
    batch = sub.add_parser("run-batch", help="answer an OpenAI batch file (JSONL) offline",
                           description=RUN_BATCH_HELP, formatter_class=_HelpFormatter)
    _engine_args(batch)
    batch.add_argument("-i", "--input-file", required=True, metavar="FILE",
                       help="the batch file, one request a line (-: stdin; an http:// or "
                       "https:// URL: its GET's body, read before the engine starts)")
    batch.add_argument("-o", "--output-file", required=True, metavar="FILE",
                       help="where the output lines go, the file emptied once the engine has "
                       "started (-: stdout; an http:// or https:// URL: the whole file sent "
                       "with a PUT once the batch has ended well)")
    batch.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                       help="the names requests may give the model (default: --model as "
                       "given)")
    batch.add_argument("--chat-template", default=None, metavar="FILE_OR_TEMPLATE",
                       help="the chat template of /v1/chat/completions instead of the "
                       "model's, as serve's --chat-template")
    batch.add_argument("--response-role", default=None, metavar="ROLE",
                       help="vLLM's; the role of a chat answer after a generation prompt "
                       "(None: assistant), as serve's --response-role")
    batch.add_argument("--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
                       help="with --enable-lora: vLLM's; LoRA adapters (PEFT directories) "
                       "served as models of their own, as serve's --lora-modules: a line "
                       "whose body's model is NAME runs with that adapter")
    batch.add_argument("--output-tmp-dir", default=None, metavar="DIR",
                       help="vLLM's; write the output lines to a new file in DIR and move it "
                       "onto --output-file once the batch has ended well (until then an older "
                       "output file stays as it was; a batch that ends early leaves its lines "
                       "in DIR, the file named); for a URL output, the file uploaded (default: "
                       "the system's temporary directory)")
    batch.add_argument("--enable-metrics", action="store_true",
                       help="vLLM's; serve the run's Prometheus metrics (serve's GET /metrics "
                       "page, and no other route) at http://URL:PORT/metrics while the batch "
                       "runs")
    batch.add_argument("--url", default="127.0.0.1", metavar="HOST",
                       help="with --enable-metrics: the host the metrics page listens on "
                       "(vLLM's default is 0.0.0.0: tprun's, this machine only)")
    batch.add_argument("--port", type=int, default=8000,
                       help="with --enable-metrics: its port (0: any free one)")
    batch.add_argument("--max-log-len", type=int, default=None, metavar="N",
                       help="vLLM's; taken, changes nothing: tprun logs no request's prompt")
    batch.add_argument("--enable-prompt-tokens-details", action="store_true",
                       help="vLLM's; taken, changes nothing: every usage carries "
                       "prompt_tokens_details (cached_tokens)")
    batch.add_argument("--enable-force-include-usage", action="store_true",
                       help="vLLM's; taken, changes nothing: batch answers are never streamed, "
                       "and a whole answer always carries its usage")


def _prompts(args) -> list:
    """The prompts of ``--prompt`` and ``--prompt-token-ids``, checked before
    any process starts: an empty one is refused here, as the engine would
    refuse it after the model loads."""
    from engine.config import ConfigError

    if args.chat and args.prompt_token_ids:
        raise ConfigError("--chat sends each --prompt as a user message: give texts, not "
                          "--prompt-token-ids")
    prompts: list = []
    for text in args.prompt:
        if not text:
            raise ConfigError("--prompt is empty: give a text of at least one character")
        prompts.append(text)
    for text in args.prompt_token_ids:
        try:
            ids = [int(t) for t in text.split(",") if t.strip()]
        except ValueError as e:
            raise ConfigError(f"--prompt-token-ids must be comma-separated integers: {e}") from e
        if not ids:
            raise ConfigError(f"--prompt-token-ids {text!r} is empty: give at least one token id")
        prompts.append({"prompt_token_ids": ids})
    return prompts or list(DEFAULT_PROMPTS)


def _say(line: str) -> None:
    """One line for the user, on stderr (stdout holds the answers)."""
    print(f"tprun {line}", file=sys.stderr, flush=True)


def _from_arguments(make, **options):
    """``make(**options)`` for what the user gave on the command line: a
    value it rejects is the user's input error (exit code 2)."""
    from engine.config import ConfigError

    try:
        return make(**options)
    except ValueError as e:
        raise ConfigError(str(e)) from e


def _structured_outputs(args) -> dict | None:
    """The ``structured_outputs`` of ``--json-schema`` / ``--regex`` /
    ``--choice`` (at most one: argparse refuses two); an unreadable schema
    file is an argument error."""
    from engine.config import ConfigError

    if args.json_schema is not None:
        try:
            with open(args.json_schema, encoding="utf-8") as f:
                return {"json": json.load(f)}
        except (OSError, ValueError) as e:
            raise ConfigError(f"--json-schema {args.json_schema}: {e}") from e
    if args.regex is not None:
        return {"regex": args.regex}
    if args.choice is not None:
        return {"choice": args.choice}
    return None


def _ctrl_c_noted() -> bool:
    """``_interrupt`` or ``_note_interrupt`` has run: Ctrl-C reached this
    process, whether or not a KeyboardInterrupt made it up the stack."""
    from executor import stop_signals

    return stop_signals.first() == signal.SIGINT


def _raise_if_interrupted() -> None:
    """Ctrl-C noted but not raised (``_interrupts_deferred``), or swallowed
    on its way up (a library's broad ``except`` around an import or a probe
    can catch the KeyboardInterrupt), is raised here: once a deferring block
    ends, and at the start of each long phase."""
    if _ctrl_c_noted():
        raise KeyboardInterrupt


def _check_chat_template(llm, model: str) -> None:
    """``--chat`` renders the model's chat template (its tokenizer's, or its
    GGUF's), which only the loaded model tells: ConfigError naming the
    option for a model without one."""
    from engine.config import ConfigError

    if llm.get_tokenizer().chat_template is None:
        raise ConfigError(f"--chat renders the model's chat template, and {model} has none: "
                          "give the prompts without --chat")


def _generate_lora(args):
    """The ``LoRARequest`` every prompt of ``generate`` runs with: its one
    ``--lora-modules`` entry (None: none). One only: a prompt names no
    model, so nothing could choose among several."""
    from engine.config import ConfigError

    modules = _lora_modules(args)
    if len(modules) > 1:
        raise ConfigError("generate runs every prompt with one adapter: give --lora-modules "
                          "one NAME=PATH")
    return modules[0] if modules else None


def run_generate(args) -> int:
    from engine import LLM
    from engine.lora_checks import check_lora_modules

    _raise_if_interrupted()

    params = sampling_params(args, _structured_outputs(args))
    model_given = hasattr(args, "model")
    config = _engine_config(args)  # every rule the arguments decide, before any notice
    check_thinking_budget(params, config.resolved_reasoning_parser)
    check_logprobs(params, config.max_logprobs)
    config.check_machine()  # and the machine's (the engine checks again as it starts)
    prompts = _prompts(args)
    lora = _generate_lora(args)
    if not model_given:
        _say("generate: no --model given: running 'tiny' (the built-in model: random weights, "
             "a byte tokenizer)")
    if not args.prompt and not args.prompt_token_ids:
        _say(f"generate: no --prompt given: running the built-in prompts {DEFAULT_PROMPTS}")
    _say(f"generate: loading {config.model} (TP={config.tensor_parallel_size}, "
         f"device {config.device}) ...")
    with LLM.from_config(config) as llm:
        _raise_if_interrupted()
        if lora is not None:  # read once here: a bad adapter is the option's error
            check_lora_modules(llm.llm_engine.lora_checks, [lora])
        # A prompt the engine refuses (too long, ids outside the vocabulary)
        # is the user's input: exit code 2, as for a bad option.
        use_tqdm = len(prompts) > 1 and not args.json
        if args.chat:
            _check_chat_template(llm, config.model)
            chats = [[{"role": "user", "content": text}] for text in prompts]
            outputs = _from_arguments(llm.chat, messages=chats, sampling_params=params,
                                      use_tqdm=use_tqdm, lora_request=lora)
        else:
            outputs = _from_arguments(llm.generate, prompts=prompts, sampling_params=params,
                                      use_tqdm=use_tqdm, lora_request=lora)
    for line in output_lines(outputs, args.json):
        print(line, flush=True)
    return 0


def run_serve(args) -> int:
    """Start the engine, then serve it until SIGINT or SIGTERM (either one:
    a clean stop, exit code 0, sockets and files removed, then one line
    on stderr, ``tprun serve: stopped by SIGTERM``). A signal before the
    engine serves stops the launch as ``main`` says (130 or 143)."""
    from engine.config import ConfigError
    from engine.llm_engine import LLMEngine
    from executor import stop_signals
    from executor.base import WorkerFailure
    from ipc.auth import new_secret
    from launch.data_parallel import ReplicaProcesses, ranks_of
    from serving.endpoint import (
        Endpoint,
        EngineServer,
        check_listen_address,
        exposure_warning,
    )

    _raise_if_interrupted()
    _serve_model(args)
    # A data-parallel replica's index comes with its options (launch.data_parallel).
    config = _engine_config(args, disable_log_stats=args.disable_log_stats,
                            log_stats_interval_s=args.log_stats_interval,
                            data_parallel_rank=getattr(args, "data_parallel_rank", 0))
    if not args.disable_log_stats:
        logging.getLogger("tprun.stats").setLevel(logging.INFO)
    http = args.http_port is not None
    _check_http_args(args)
    dp = args.data_parallel_size
    if dp > 1:
        _check_data_parallel(args, config)
    if args.endpoint_file is not None:
        _check_endpoint_file(args.endpoint_file)
    # With --http-port, --host is the HTTP server's; the engine endpoint stays local.
    try:  # checked before any worker starts
        endpoint = Endpoint.create(args.port, None if http else args.host)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if endpoint.host is not None:
        try:
            check_listen_address(endpoint.host, args.port or 0, "--port")
        except ValueError as e:
            endpoint.cleanup()
            raise ConfigError(str(e)) from None
    if (warning := exposure_warning(endpoint)) is not None:
        print(f"tprun serve: warning: {warning}", file=sys.stderr, flush=True)
        logger.warning("%s", warning)
    if (note := port_note(args)) is not None:
        print(f"tprun serve: note: {note}", file=sys.stderr, flush=True)
    replicas = None  # replicas 1..dp-1; this process serves replica 0
    try:
        if dp > 1:  # started first: they load their model while this process loads its own
            replicas = ReplicaProcesses(args, config.tensor_parallel_size, dp,
                                        config.resolved_device)
        engine = LLMEngine(config)
    except BaseException:
        endpoint.cleanup()
        if replicas is not None:
            replicas.stop()
        raise
    secret = new_secret()
    http_server = None
    others: tuple[tuple[str, bytes], ...] = ()  # replicas 1..dp-1: (endpoint, secret)
    try:
        server = EngineServer(engine, endpoint, args.endpoint_file, secret=secret)
        try:
            if http:
                others = () if replicas is None else tuple(replicas.wait_ready())
                http_server = _start_http(args, engine, server, secret, others)
        except BaseException:
            server.close(term_context=False)  # a front end that did not start may hold a socket
            raise
    except BaseException:
        engine.shutdown()
        endpoint.cleanup()
        if replicas is not None:
            replicas.stop()
        raise
    def stop(signum, _frame) -> None:
        stop_signals.note(signum)
        server.stop()

    previous = {sig: signal.signal(sig, stop) for sig in _STOP_SIGNALS}
    if replicas is not None:
        replicas.watch(server.stop)  # a replica that ends stops the server
    endpoints = [(server.address, server.key_file)]
    if replicas is not None:
        endpoints += zip((address for address, _ in others), replicas.key_files())
    print(_ready_line(endpoints), flush=True)
    for index, (address, key_file) in enumerate(endpoints):
        logger.info("engine endpoint %s, key file %s%s", address, key_file,
                    f" (data-parallel replica {index})" if replicas is not None else "")
    if http_server is not None:
        name = (args.served_model_name or [args.model])[0]
        replicas_said = "" if dp == 1 else f", {dp} data-parallel replicas"
        print(f"tprun serve: OpenAI-compatible HTTP server ready on {http_server.url} "
              f"(model {name!r}{replicas_said})", flush=True)
    try:
        _raise_if_interrupted()  # swallowed while the engine started: stop before serving
        server.serve()
    except WorkerFailure as e:
        if replicas is None:
            raise
        raise WorkerFailure(f"data-parallel replica 0 ({ranks_of(0, config.tensor_parallel_size)})"
                            f" failed: {e}") from None
    finally:
        if replicas is not None:  # their streams end as replica 0's do, before the HTTP server
            replicas.terminate()
        http_stopped = http_server is None or http_server.stop()
        server.close(term_context=http_stopped)
        engine.shutdown()
        if replicas is not None:
            replicas.stop()
        for sig, handler in previous.items():  # a second signal during shutdown is ignored
            signal.signal(sig, handler)
    if replicas is not None and replicas.failed is not None:
        raise WorkerFailure(replicas.failed)
    if (signum := stop_signals.first()) is not None:
        print(f"tprun serve: stopped by {signal.Signals(signum).name}", file=sys.stderr,
              flush=True)
    return 0


def _ready_line(endpoints: list[tuple[str, str]]) -> str:
    """``serve``'s ready line: its engine endpoint and key file, or, with
    data parallelism, every replica's, in replica order."""
    if len(endpoints) == 1:
        address, key_file = endpoints[0]
        return f"tprun serve: ready: engine endpoint {address} (key file {key_file})"
    named = ", ".join(f"{address} (replica {index}, key file {key_file})"
                      for index, (address, key_file) in enumerate(endpoints))
    return f"tprun serve: ready: engine endpoints {named}"


def _check_data_parallel(args, config) -> None:
    """``--data-parallel-size``'s rules, checked before any process starts:
    its replicas are served behind the HTTP front end only, each spawns
    its own workers, replica d's rendezvous port (``--master-port`` P + d)
    is one it can listen on, and on CUDA each has its own devices."""
    from engine.config import ConfigError

    dp = args.data_parallel_size
    if args.http_port is None:
        raise ConfigError("--data-parallel-size needs --http-port: the replicas are served "
                          "behind its HTTP server")
    for flag in ("port", "endpoint_file"):
        if getattr(args, flag) is not None:
            raise ConfigError(f"--{flag.replace('_', '-')} is the engine endpoint's, which "
                              "--data-parallel-size leaves private to the HTTP server")
    if config.attach_workers_dir is not None:
        raise ConfigError("--attach-workers serves one engine's workers; with "
                          "--data-parallel-size each replica spawns its own")
    if config.master_port is not None:
        if config.master_port + dp - 1 > 65535:
            raise ConfigError(f"--master-port {config.master_port} gives data-parallel replica "
                              f"{dp - 1} port {config.master_port + dp - 1}, above 65535 "
                              f"(replica d listens on --master-port + d)")
        for index in range(1, dp):
            try:
                dataclasses.replace(config, master_port=config.master_port + index
                                    ).check_machine()
            except ConfigError as e:
                raise ConfigError(f"data-parallel replica {index} (--master-port "
                                  f"{config.master_port} + {index}): {e}") from None
    if config.resolved_device == "cuda":
        import torch

        world = config.tensor_parallel_size * dp
        count = torch.cuda.device_count()
        if world > count:
            raise ConfigError(f"--tensor-parallel-size {config.tensor_parallel_size} x "
                              f"--data-parallel-size {dp} needs {world} CUDA devices; this "
                              f"machine has {count}")


def _check_endpoint_file(path: str) -> None:
    """--endpoint-file names a file serve can write (with its key file
    beside it), checked before the model loads."""
    from engine.config import ConfigError

    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ConfigError(f"--endpoint-file {path}: directory {directory} does not exist")
    if os.path.isdir(path):
        raise ConfigError(f"--endpoint-file {path} is a directory: give the path of a file "
                          "to write")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"--endpoint-file {path}: directory {directory} is not writable")


def _serve_model(args) -> None:
    """``args.model`` from --model or serve's positional MODEL (vLLM's
    ``vllm serve MODEL``); both given must agree; neither: 'tiny'."""
    from engine.config import ConfigError, model_exists

    given = getattr(args, "model", None)
    if args.model_tag is not None and given is not None and given != args.model_tag:
        raise ConfigError(f"MODEL {args.model_tag!r} and --model {given!r} disagree: give "
                          "one of them")
    keys = args.api_key or []
    if args.model_tag is None and given is None and len(keys) > 1 and model_exists(keys[-1]):
        # --api-key takes every value after it: `serve --api-key K MODEL`
        # would serve 'tiny' with MODEL as a second key.
        raise ConfigError(f"--api-key took {keys[-1]!r}, which names a model, as a key: give "
                          "MODEL before --api-key (or as --model)")
    args.model = args.model_tag or given or "tiny"



def port_note(args: argparse.Namespace) -> str | None:
    """What to tell a vLLM user whose ``--port`` (vLLM's HTTP port) starts
    no HTTP server here; said once the command line has passed every check,
    so that a refusal stays one line."""
    if args.port is None or args.http_port is not None:
        return None
    return (f"--port {args.port} is the engine endpoint's port (tprun's socket protocol); "
            "no HTTP server starts without --http-port, which is vLLM's --port")


def _check_http_args(args) -> None:
    """--http-port's companions and vLLM's serve options, checked before any
    process starts."""
    from engine.config import ConfigError
    from serving.endpoint import DEFAULT_HOST, check_listen_address, is_loopback

    for flag, why in _REFUSED_SERVE_OPTIONS.items():
        if getattr(args, flag[2:].replace("-", "_")) is not None:
            raise ConfigError(f"{flag} is not supported: {why}")
    _check_tool_args(args)
    if args.log_requests in _LOG_REQUESTS_FLAGS[:2]:
        print(f"tprun serve: note: {args.log_requests} changes nothing: tprun logs no "
              "request's prompt or parameters", file=sys.stderr, flush=True)
    if args.http_port is None:
        if args.api_key is not None:
            raise ConfigError("--api-key needs --http-port")
        if args.enable_auto_tool_choice:
            raise ConfigError("--enable-auto-tool-choice needs --http-port")
        if args.served_model_name is not None:
            raise ConfigError("--served-model-name needs --http-port")
        if args.allowed_origins is not None:
            raise ConfigError("--allowed-origins needs --http-port")
        if args.chat_template is not None:
            raise ConfigError("--chat-template needs --http-port")
        if args.trust_request_chat_template:
            raise ConfigError("--trust-request-chat-template needs --http-port")
        if args.uvicorn_log_level is not None:
            raise ConfigError("--uvicorn-log-level needs --http-port")
        if args.enable_responses_api_store:
            raise ConfigError("--enable-responses-api-store needs --http-port")
        if args.enable_server_load_tracking:
            raise ConfigError("--enable-server-load-tracking needs --http-port")
        if args.stream_interval is not None:
            raise ConfigError("--stream-interval needs --http-port")
        if args.response_role is not None:
            raise ConfigError("--response-role needs --http-port")
        if args.lora_modules is not None:
            raise ConfigError("--lora-modules needs --http-port")
        if args.allow_runtime_lora_updating:
            raise ConfigError("--allow-runtime-lora-updating needs --http-port")
        return
    args.lora_modules = _lora_modules(args)
    args.allow_runtime_lora_updating = _runtime_lora_updating(args)
    args.response_role = _response_role(args.response_role)
    args.stream_interval = _stream_interval(args.stream_interval)
    args.enable_responses_api_store = _responses_store(args.enable_responses_api_store)
    args.dev_mode = _dev_mode()
    if args.chat_template is not None:
        args.chat_template = _read_chat_template(args.chat_template)
    if args.served_model_name is not None and not all(n.strip() for n in args.served_model_name):
        raise ConfigError("--served-model-name takes non-empty names")
    if not 0 <= args.http_port < 65536:
        raise ConfigError(f"--http-port must be in [0, 65535], got {args.http_port}")
    if args.port and args.port == args.http_port:
        raise ConfigError(f"--port {args.port} and --http-port {args.http_port} are the same "
                          "port: the engine endpoint and the HTTP server each need their own")
    args.api_key = _api_keys(args.api_key)
    args.host = args.host or DEFAULT_HOST
    try:  # bound once and released, before minutes of model loading
        check_listen_address(args.host, args.http_port, "--http-port")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not is_loopback(args.host):
        warning = (f"the HTTP server listens on {args.host}, beyond this machine"
                   + ("" if args.api_key else ", with no API key: anyone who reaches it "
                      "may use the engine"))
        print(f"tprun serve: warning: {warning}", file=sys.stderr, flush=True)


def _runtime_lora_updating(args) -> bool:
    """Whether adapters may be loaded and unloaded over HTTP: the flag
    (which needs --enable-lora), else vLLM's $VLLM_ALLOW_RUNTIME_LORA_UPDATING
    ("true" or "1", any case; unset, empty, "false" or "0": off). On, a
    warning says so: anyone who reaches the server may then read any
    adapter directory the server can."""
    from engine.config import ConfigError

    if args.allow_runtime_lora_updating:
        if not args.enable_lora:
            raise ConfigError("--allow-runtime-lora-updating needs --enable-lora")
        on = True
    else:
        value = os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").strip().lower()
        if value not in ("", "0", "1", "false", "true"):
            raise ConfigError(f"VLLM_ALLOW_RUNTIME_LORA_UPDATING must be True or False (1 or "
                              f"0), got {value!r}")
        on = value in ("1", "true")
    if on:
        print("tprun serve: warning: LoRA adapters may be loaded and unloaded over HTTP "
              "(/v1/load_lora_adapter): a client names a directory of this machine for the "
              "server to read", file=sys.stderr, flush=True)
    return on


def _response_role(given: str | None) -> str:
    """--response-role's value: a role name (None: "assistant", vLLM's
    default); ConfigError for an empty one."""
    from engine.config import ConfigError

    if given is None:
        return "assistant"
    if not given.strip():
        raise ConfigError("--response-role takes a non-empty role name")
    return given


def _stream_interval(given: str | None) -> int:
    """--stream-interval's value: a whole number of at least 1 (None: 1,
    vLLM's default); ConfigError naming the option else."""
    from engine.config import ConfigError

    if given is None:
        return 1
    try:
        value = int(given)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"--stream-interval must be an integer of at least 1, got {given!r}")
    return value


def _api_keys(given: list[str] | None) -> list[str] | None:
    """The keys that open /v1: --api-key's, else $TPRUN_API_KEY, else
    vLLM's $VLLM_API_KEY (an empty variable is unset); None: no key."""
    from engine.config import ConfigError

    if given is not None:
        if not all(given):
            raise ConfigError("--api-key takes non-empty keys")
        return [_header_safe_key(key, "--api-key") for key in given]
    for name in ("TPRUN_API_KEY", "VLLM_API_KEY"):
        if os.environ.get(name):
            return [_header_safe_key(os.environ[name], f"${name}")]
    return None


def _header_safe_key(key: str, source: str) -> str:
    """``key``, when a client can send it: it travels in an HTTP header,
    which holds ASCII without control characters and loses the spaces at its
    ends, so a key outside that could never be matched."""
    from engine.config import ConfigError

    if not (key.isascii() and key.isprintable() and key == key.strip()):
        raise ConfigError(f"{source}: a key must be printable ASCII without spaces at its "
                          "ends (it is sent in an HTTP header); this one could never match")
    return key


def _responses_store(given: bool | None) -> bool:
    """Whether /v1/responses keeps its answers: the flag, else vLLM's
    $VLLM_ENABLE_RESPONSES_API_STORE (0 or 1; unset or empty: 0)."""
    from engine.config import ConfigError

    if given:
        return True
    value = os.environ.get("VLLM_ENABLE_RESPONSES_API_STORE", "").strip()
    if value not in ("", "0", "1"):
        raise ConfigError(f"VLLM_ENABLE_RESPONSES_API_STORE must be 0 or 1, got {value!r}")
    return value == "1"


def _dev_mode() -> bool:
    """Whether the server's dev routes are on (``serving.http.dev_routes``):
    $TPRUN_SERVER_DEV_MODE, else vLLM's $VLLM_SERVER_DEV_MODE, read as vLLM
    reads its own (an integer, nonzero: on; unset or empty: off)."""
    from engine.config import ConfigError
    from serving.http.dev_routes import DEV_MODE_ENV

    for name in DEV_MODE_ENV:
        value = os.environ.get(name, "").strip()
        if not value:
            continue
        try:
            return int(value) != 0
        except ValueError:
            raise ConfigError(f"{name} must be an integer (1: on, 0: off), got {value!r}") from None
    return False


def _read_chat_template(value: str) -> str:
    """vLLM's --chat-template: a file's text, or else the template itself
    when it looks like one (a brace or a line break; backslash escapes such
    as \\n read as the characters they name), compiled here so that a broken
    one is refused before the model loads."""
    from checkpoint.chat_template import compile_template
    from engine.config import ConfigError

    try:
        with open(value, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        if not any(c in value for c in "{}\n"):
            raise ConfigError(f"--chat-template {value}: not a readable file ({e.strerror}) "
                              "nor a template") from None
        text = codecs.decode(value.encode("latin-1", "backslashreplace"), "unicode_escape")
    try:
        compile_template(text)
    except ValueError as e:
        detail = str(e).removeprefix("the chat template does not compile: ")
        raise ConfigError(f"--chat-template does not compile: {detail}") from None
    return text


def _lora_modules(args) -> tuple:
    """``--lora-modules`` as one ``LoRARequest`` each, ids 1, 2, ... in the
    order given: ``NAME=PATH`` or vLLM's JSON object with "name" and
    "path"; names unique and none a served name of the model."""
    from engine.config import ConfigError
    from ipc.lora_request import LoRARequest

    if args.lora_modules is None:
        return ()
    if not args.enable_lora:
        raise ConfigError("--lora-modules needs --enable-lora")
    modules = []
    for i, given in enumerate(args.lora_modules, start=1):
        if given.lstrip().startswith("{"):
            try:
                spec = json.loads(given)
                name, path = spec["name"], spec["path"]
            except (ValueError, KeyError, TypeError):
                raise ConfigError(f"--lora-modules: {given!r} is no JSON object with "
                                  "\"name\" and \"path\"") from None
        else:
            name, sep, path = given.partition("=")
            if not sep:
                raise ConfigError(f"--lora-modules takes NAME=PATH, got {given!r}")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise ConfigError(f"--lora-modules: {given!r} needs a name and a path")
        modules.append(LoRARequest(name, i, os.path.abspath(path)))
    names = [m.lora_name for m in modules]
    served = set(getattr(args, "served_model_name", None) or [getattr(args, "model", "tiny")])
    if len(set(names)) != len(names) or served & set(names):
        raise ConfigError(f"--lora-modules names {names} must differ from each other and "
                          f"from the model's served names {sorted(served)}")
    return tuple(modules)


def _check_tool_args(args) -> None:
    """--enable-auto-tool-choice and --tool-call-parser go together, and
    the parser is one this server has."""
    from engine.config import ConfigError
    from serving.http.tool_parsers import TOOL_CALL_PARSERS

    names = ", ".join(TOOL_CALL_PARSERS)
    if args.tool_call_parser is not None and args.tool_call_parser not in TOOL_CALL_PARSERS:
        raise ConfigError(f"--tool-call-parser must be one of {names}, got "
                          f"{args.tool_call_parser!r}")
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        raise ConfigError(f"--enable-auto-tool-choice needs --tool-call-parser ({names})")
    if args.tool_call_parser is not None and not args.enable_auto_tool_choice:
        raise ConfigError("--tool-call-parser needs --enable-auto-tool-choice")


def _start_http(args, engine, server, secret: bytes,
                other_replicas: tuple[tuple[str, bytes], ...] = ()):
    """The HTTP front end, a client of ``server`` through its in-process
    address (same process: no ZeroMQ I/O thread on the way), and of
    ``other_replicas``' endpoints (``start_http_server``)."""
    from engine.lora_checks import check_lora_modules
    from serving.http.http_server import engine_app_options, start_http_server

    if args.access_log:
        logging.getLogger("tprun.access").setLevel(logging.INFO)
    if args.chat_template is not None:  # the text _check_http_args read
        engine.tokenizer.chat_template = args.chat_template
    check_lora_modules(engine.lora_checks, args.lora_modules)
    http = start_http_server(server.inproc_address, secret, engine.tokenizer,
                             args.served_model_name or [args.model],
                             engine.max_model_len, args.host, args.http_port,
                             api_keys=args.api_key, access_log=args.access_log,
                             context=server.ctx, tool_call_parser=args.tool_call_parser,
                             allowed_origins=args.allowed_origins,
                             log_level=args.uvicorn_log_level or "warning",
                             enable_responses_api_store=args.enable_responses_api_store,
                             enable_server_load_tracking=args.enable_server_load_tracking,
                             stream_interval=args.stream_interval,
                             trust_request_chat_template=args.trust_request_chat_template,
                             chat_template=args.chat_template,
                             response_role=args.response_role,
                             other_replicas=other_replicas, lora_modules=args.lora_modules,
                             runtime_lora_check=(engine.lora_checks.check
                                                 if args.allow_runtime_lora_updating
                                                 else None),
                             dev_mode=args.dev_mode, **engine_app_options(engine))
    return http


def run_bench_serve(args) -> int:
    """``bench serve``: bad options are the user's input (exit code 2); a
    server that cannot be read, or a ready check that ran out, exit code
    1; failed requests are part of the result (exit code 0)."""
    from launch.bench_serve.run import BenchServeError, run_bench_serve, settings

    checked = _from_arguments(settings, args=args)
    try:
        return _from_arguments(run_bench_serve, args=args, s=checked)
    except BenchServeError as e:
        print(f"tprun: error: {e}", file=sys.stderr)
        return 1


def run_bench(args) -> int:
    if args.bench_mode == "serve":
        return run_bench_serve(args)
    from engine.bench import BenchConfig, format_summary, run_bench
    from engine.llm_engine import LLMEngine

    # BenchConfig reads the dataset, before the model loads: a bad line is the user's input.
    bench = _from_arguments(BenchConfig, num_prompts=args.num_prompts, input_len=args.input_len,
                            output_len=args.output_len, dataset=args.dataset, seed=args.seed,
                            temperature=args.temperature, warmup=not args.no_warmup)
    config = _engine_config(args)
    engine = LLMEngine(config)
    try:
        # A prompt the engine refuses (too long, ids outside the vocabulary)
        # is the user's input too: exit code 2, as in generate.
        summary = _from_arguments(run_bench, engine=engine, config=bench)
    finally:
        engine.shutdown()
    print(json.dumps(summary) if args.json else format_summary(summary), flush=True)
    return 0


def run_run_batch(args) -> int:
    """The batch file answered (``launch.batch_job``); its files, names and
    template checked before any process starts."""
    from engine.config import ConfigError
    from launch.batch_job import BatchFiles, run_batch_job

    _raise_if_interrupted()
    config = _engine_config(args)
    files = BatchFiles(args.input_file, args.output_file, args.output_tmp_dir)
    _from_arguments(files.check)
    metrics_address = _metrics_address(args)
    names = args.served_model_name or [args.model]
    if not all(name.strip() for name in names):
        raise ConfigError("--served-model-name takes non-empty names")
    chat_template = None if args.chat_template is None else _read_chat_template(
        args.chat_template)
    response_role = _response_role(args.response_role)
    lora_modules = _lora_modules(args)
    config.check_machine()
    files = _from_arguments(files.local)  # an http(s) input read, before any process starts
    try:
        _say(f"run-batch: loading {config.model} (TP={config.tensor_parallel_size}, "
             f"device {config.device}) ...")
        summary = run_batch_job(config, files, names, chat_template, response_role,
                                metrics_address, lora_modules)
    finally:
        files.close()
    files.upload()  # an http(s) output, once the engine has stopped
    _say(f"run-batch: {summary.written} lines "
         f"{'uploaded' if files.output_copy else 'written'} to {files.output_name()} "
         f"({summary.answered} answered with status 200)")
    if summary.not_requests:
        number, why = summary.not_requests[0]
        raise ConfigError(f"{files.input_name()}: {len(summary.not_requests)} line(s) are "
                          f"not batch requests (line {number}: {why}); each has an error line "
                          "in its place in the output")
    return 0


def _metrics_address(args) -> tuple[str, int] | None:
    """Where run-batch serves its metrics page (``--enable-metrics``; None
    without it): ``--url`` and ``--port``, checked as serve checks its HTTP
    address, before the model loads."""
    from engine.config import ConfigError
    from serving.endpoint import check_listen_address, is_loopback

    if not args.enable_metrics:
        return None
    if not 0 <= args.port < 65536:
        raise ConfigError(f"--port must be in [0, 65535], got {args.port}")
    try:  # bound once and released, before minutes of model loading
        check_listen_address(args.url, args.port, "--port")
    except ValueError as e:
        raise ConfigError(str(e).replace("--host ", "--url ")) from None
    if not is_loopback(args.url):
        _say(f"run-batch: warning: the metrics page listens on {args.url}, beyond this "
             "machine")
    return args.url, args.port


COMMANDS = {"generate": run_generate, "serve": run_serve, "bench": run_bench,
            "run-batch": run_run_batch}

# The signals that stop a launch; ``main`` handles both and gives back the handlers it found.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _exit_on_signal(signum, _frame) -> None:
    """SIGTERM as an exception, so ``finally`` blocks and context managers
    run: workers are shut down and socket directories removed; ``main``
    then says so (``_exit_stopped``)."""
    from executor import stop_signals

    stop_signals.note(signum)
    raise SystemExit(128 + signum)


def _terminated(error: SystemExit) -> bool:
    """Whether ``exit`` is ``_exit_on_signal``'s (not argparse's, say)."""
    from executor import stop_signals

    return stop_signals.first() == signal.SIGTERM and error.code == 128 + signal.SIGTERM


def _interrupt(signum, frame) -> None:
    """Ctrl-C: noted (``_note_interrupt``), then the usual KeyboardInterrupt."""
    _note_interrupt(signum, frame)
    raise KeyboardInterrupt


def _note_interrupt(signum, _frame) -> None:
    """Ctrl-C noted, not raised: the executor then stops workers without a
    grace period, and ``_raise_if_interrupted`` raises it where it is safe
    to (``_interrupts_deferred``)."""
    from executor import stop_signals

    stop_signals.note(signum)


@contextlib.contextmanager
def _lost_interrupts_quiet():
    """A KeyboardInterrupt that ``_interrupt`` raised where Python cannot
    pass an exception on (a weakref callback, importlib's module-lock one
    above all, or a ``__del__``) is reported by ``sys.unraisablehook`` as
    "Exception ignored in ...", a block of lines before the launch's one
    line. Inside this block that report is dropped once Ctrl-C is noted:
    the interrupt is not lost, ``_raise_if_interrupted`` and ``_interrupted``
    act on the note. Every other unraisable exception goes to the hook found,
    which is put back on leaving."""
    found = sys.unraisablehook

    def hook(unraisable) -> None:
        if issubclass(unraisable.exc_type, KeyboardInterrupt) and _ctrl_c_noted():
            return
        found(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = found


@contextlib.contextmanager
def _interrupts_deferred():
    """Ctrl-C inside the block is only noted (every press of it); leaving
    the block raises it. For imports that load native extensions, torch's
    first import above all: it runs Python code called from C++ (pybind11),
    and a KeyboardInterrupt raised there cannot unwind through the C++
    frames: the process aborts (SIGABRT, a C++ message) instead of ending
    with one line and exit code 130. The stop waits for the import to end.
    The SIGINT handler found (a Python one: ``main``'s) is put back on
    leaving, whatever way the block ends."""
    found = signal.signal(signal.SIGINT, _note_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, found)
    _raise_if_interrupted()


_TOP_LEVEL_FLAGS = ("--nproc-per-node", "--nproc_per_node", "--master-addr", "--master_addr",
                    "--master-port", "--master_port")


def _misplaced_flag(argv: list[str]) -> str | None:
    """A torchrun flag given after the subcommand, as a one-line hint."""
    command = next((i for i, a in enumerate(argv) if a in COMMANDS), None)
    if command is None:
        return None
    for arg in argv[command + 1:]:
        name = arg.split("=", 1)[0]
        if name in _TOP_LEVEL_FLAGS:
            return (f"{name} is a tprun option, not a {argv[command]} option: put it before "
                    f"the subcommand (tprun {name} N {argv[command]} ...)")
    return None


def main(argv: list[str] | None = None, parsed: argparse.Namespace | None = None) -> int:
    """Exit codes: 0 done; 1 a failure at run time (a worker that failed, a
    file the system refuses); 2 the user's input: the arguments, the model
    they name, the model's config, a prompt, a batch file's line that is no
    batch request (``run-batch``: the others still answered), or the machine
    rule the run out (one ``tprun: error:`` line, as argparse does); 130 Ctrl-C at any
    moment (one line, ``tprun: interrupted``), 143 SIGTERM (one line,
    ``tprun: stopped by SIGTERM``); either way the workers are stopped and
    nothing is left behind. ``serve`` that is serving takes either signal
    as its request to stop: exit code 0 (``run_serve``).

    Whatever way it ends, ``main`` leaves the SIGINT and SIGTERM handlers
    as it found them (a caller in the same process, a test or a Python
    program, keeps its own Ctrl-C); one not installed from Python
    (``signal.getsignal`` gives None) cannot be put back and stays as
    ``main`` left it. Each call judges only the signals it receives: what
    an earlier call in the process noted (``executor.stop_signals``) is
    forgotten first, so a run after a stopped one is not taken for
    stopped. ``parsed``: the arguments already parsed, in place of
    ``argv`` (a data-parallel replica's, ``launch.replica``)."""
    from executor import stop_signals

    found = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}
    try:
        stop_signals.reset()  # before its handlers can note anything of this call's
        signal.signal(signal.SIGINT, _interrupt)  # from the first moment: no import traceback
        with _lost_interrupts_quiet():
            return _main(sys.argv[1:] if argv is None else argv, parsed)
    except KeyboardInterrupt:
        return _exit_stopped(signal.SIGINT)
    except SystemExit as e:
        if not _terminated(e):
            raise
        return _exit_stopped(signal.SIGTERM)
    except Exception as e:
        if not _interrupted(e):
            raise
        return _exit_stopped(signal.SIGINT)
    finally:
        for sig, handler in found.items():
            if handler is not None:
                signal.signal(sig, handler)


def stopped_line(signum: int) -> str:
    """The one line a launch stopped by ``signum`` ends with."""
    if signum == signal.SIGINT:
        return "tprun: interrupted"
    return f"tprun: stopped by {signal.Signals(signum).name}"


def _exit_stopped(signum: int) -> int:
    """Say so, and remove what a cleanup cut short left: a second signal
    during the first one's shutdown can stop it before the socket
    directory goes (the workers die with this process). Both stop signals
    are ignored from here to ``main``'s return, so a further one cannot cut
    this cleanup short either; ``main`` then puts back the handlers it
    found."""
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    from ipc.endpoints import remove_own_directories

    remove_own_directories()
    print(stopped_line(signum), file=sys.stderr)
    return 128 + signum


def _interrupted(error: BaseException) -> bool:
    """Whether Ctrl-C lies behind ``error``: Python wraps an exception raised
    inside some of its own machinery (a class body's ``__set_name__`` while
    torch is imported, for one) in another, with the interrupt as its
    cause. An interrupt can also be lost on its way and leave only a
    consequence (a C extension's import cut short, then "cannot load module
    more than once"): once ``_interrupt`` has noted Ctrl-C, every error is
    taken for one."""
    if _ctrl_c_noted():
        return True
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def _main(argv: list[str], parsed: argparse.Namespace | None = None) -> int:
    if parsed is None and (hint := _misplaced_flag(argv)) is not None:
        print(f"tprun: error: {hint}", file=sys.stderr)
        return 2
    with _interrupts_deferred():  # torch's first import: the engine's package
        from engine.config import ConfigError
        from executor import stop_signals
        from executor.base import WorkerFailure
    args = parsed or build_parser().parse_args(argv)
    logging.basicConfig(level=os.environ.get("TPRUN_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    signal.signal(signal.SIGTERM, _exit_on_signal)  # serve replaces it once it serves
    try:
        return COMMANDS[args.command](args)
    except ConfigError as e:
        print(f"tprun: error: {e}", file=sys.stderr)
        return 2
    except WorkerFailure as e:
        if stop_signals.stopping():  # the workers were stopped with this process
            print(stopped_line(stop_signals.first()), file=sys.stderr)
            return 128 + stop_signals.first()
        print(f"tprun: error: {e}", file=sys.stderr)
        return 1
    except (ValueError, OSError, TimeoutError) as e:
        if _interrupted(e):
            raise  # main says it was interrupted
        print(f"tprun: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    from launch.entry import entry

    entry()
