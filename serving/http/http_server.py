"""``HttpServer``: uvicorn serving the app on its own thread and event loop.

The engine loop keeps the main thread (and its signal handlers); the HTTP
front end talks to it only through the engine endpoint, so the two share
nothing but the process. ``start`` returns once uvicorn accepts
connections (or raises if it could not bind); ``port`` is the bound port
(the real one when 0 was asked for). ``stop`` asks uvicorn to finish:
it stops accepting, gives open responses ``grace_s`` seconds, runs the
app's shutdown (closing the engine client) and the thread ends. A request
uvicorn cannot parse as HTTP is answered in OpenAI's error shape
(``protocol_errors.py``).
"""

from __future__ import annotations

import threading
import time

import uvicorn

from serving.http.protocol_errors import JsonErrorsProtocol


class HttpServer:
    def __init__(self, app, host: str, port: int, grace_s: float = 5.0,
                 log_level: str = "warning") -> None:
        """``log_level``: uvicorn's own log, from its start-up lines on."""
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                lifespan="on", timeout_graceful_shutdown=grace_s,
                                access_log=False, backlog=4096, http=JsonErrorsProtocol)
        self.server = uvicorn.Server(config)
        self.host = host
        self.asked_port = port
        self.thread = threading.Thread(target=self.server.run, name="http", daemon=True)

    def start(self, timeout_s: float = 60.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive():
                raise OSError(f"the HTTP server could not start on {self.host}:"
                              f"{self.asked_port} (the reason is logged above)")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the HTTP server did not start within {timeout_s} s")
            time.sleep(0.02)

    @property
    def port(self) -> int:
        return self.server.servers[0].sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Whether the server's thread has ended (within ``timeout_s``)."""
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout_s)
        return not self.thread.is_alive()


def engine_app_options(engine) -> dict:
    """``create_app``'s options that the engine (an ``LLMEngine``) decides:
    its sampling defaults, end-of-sequence ids, logprobs limit, vocabulary,
    reasoning parser, pooling task and labels, LoRA adapter slots, and
    whether it has a profiler (``/start_profile`` and ``/stop_profile``).
    ``serve``'s HTTP server and ``run-batch`` both build their app with
    them, so both answer alike."""
    return dict(sampling_defaults=engine.sampling_defaults,
                eos_token_ids=list(engine.model_config.eos_token_ids),
                max_logprobs=engine.config.max_logprobs,
                vocab_size=engine.model_config.vocab_size,
                reasoning_parser=engine.config.resolved_reasoning_parser,
                pooling=engine.pooler is not None,
                pooling_task="embed" if engine.pooler is None else engine.pooler.task,
                labels=list(engine.model_config.labels),
                max_loras=(0 if engine.config.lora_config is None
                           else engine.config.lora_config.max_loras),
                profiling=engine.config.profiler is not None)


def start_http_server(engine_address: str, secret: bytes, tokenizer, served_names: list[str],
                      max_model_len: int, host: str, port: int,
                      api_keys: list[str] | None = None, access_log: bool = False,
                      context=None, tool_call_parser: str | None = None,
                      sampling_defaults: dict | None = None,
                      allowed_origins: list[str] | None = None,
                      log_level: str = "warning",
                      eos_token_ids: list[int] | None = None,
                      enable_responses_api_store: bool = False,
                      max_logprobs: int = -1, vocab_size: int | None = None,
                      reasoning_parser: str | None = None,
                      stream_interval: int = 1,
                      trust_request_chat_template: bool = False,
                      chat_template: str | None = None,
                      response_role: str = "assistant",
                      pooling: bool = False,
                      pooling_task: str = "embed",
                      labels: list[str] | None = None,
                      other_replicas: tuple[tuple[str, bytes], ...] = (),
                      lora_modules: tuple = (),
                      runtime_lora_check=None, max_loras: int = 0,
                      profiling: bool = False,
                      enable_server_load_tracking: bool = False,
                      dev_mode: bool = False) -> HttpServer:
    """The OpenAI front end for the engine endpoint at ``engine_address``,
    started and accepting connections on ``host:port``, serving the model
    under ``served_names``. ``context``: the
    ZeroMQ context that an ``inproc://`` ``engine_address`` lives in;
    ``tool_call_parser``: the parser of tool_choice "auto" (None: refused);
    ``sampling_defaults``: what unset sampling fields take; ``allowed_origins``:
    the web origins allowed to call it from a browser (CORS); ``log_level``:
    uvicorn's; ``eos_token_ids``: the model's end-of-sequence ids;
    ``enable_responses_api_store``: keep /v1/responses answers;
    ``max_logprobs``: the engine's limit on top logprobs and ``vocab_size``
    the model's vocabulary; ``reasoning_parser``: the name of the parser
    that splits answers' reasoning off (None: none); ``stream_interval``:
    the least tokens a stream's chunk groups; ``trust_request_chat_template``:
    a request's own chat template served; ``chat_template``: the server's
    ``--chat-template``; ``response_role``: vLLM's ``--response-role``
    (``create_app``); ``other_replicas``: the (address, secret) of each
    further data-parallel replica's engine endpoint, ``engine_address``
    being replica 0's (none: one engine, one ``AsyncEngineClient``; else a
    ``DataParallelClient`` over them all); ``lora_modules``: the
    ``LoRARequest`` of each adapter served by its name; ``runtime_lora_check``:
    the engine's adapter check, given when adapters may be loaded and
    unloaded over HTTP (``create_app``); ``pooling``, ``pooling_task`` and
    ``labels``: a pooling model's routes; ``max_loras``: the engine's
    adapter slots (0: LoRA off) for ``/metrics``; ``profiling``: the
    engines have a profiler, served at ``/start_profile`` and
    ``/stop_profile``; ``enable_server_load_tracking``:
    the in-flight count ``/load`` answers; ``dev_mode``: vLLM's dev
    routes, /sleep among them (all ``create_app``)."""
    from serving.async_client import AsyncEngineClient
    from serving.data_parallel_client import DataParallelClient
    from serving.http.app import create_app

    link = AsyncEngineClient(engine_address, secret, context=context)
    if other_replicas:
        link = DataParallelClient([link, *(AsyncEngineClient(address, key)
                                           for address, key in other_replicas)])
    app = create_app(link, tokenizer,
                     served_names, max_model_len, api_keys=api_keys or (),
                     access_log=access_log,
                     tool_call_parser=tool_call_parser, sampling_defaults=sampling_defaults,
                     allowed_origins=allowed_origins or (),
                     eos_token_ids=eos_token_ids or (),
                     enable_responses_api_store=enable_responses_api_store,
                     max_logprobs=max_logprobs, vocab_size=vocab_size,
                     reasoning_parser=reasoning_parser, stream_interval=stream_interval,
                     trust_request_chat_template=trust_request_chat_template,
                     chat_template=chat_template, response_role=response_role,
                     pooling=pooling, pooling_task=pooling_task, labels=labels or (),
                     lora_modules=lora_modules,
                     runtime_lora_check=runtime_lora_check, max_loras=max_loras,
                     profiling=profiling,
                     enable_server_load_tracking=enable_server_load_tracking,
                     dev_mode=dev_mode)
    server = HttpServer(app, host, port, log_level=log_level)
    server.start()
    return server
