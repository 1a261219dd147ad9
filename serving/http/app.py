"""The FastAPI app: routes, API-key check, error shapes.

Routes (as vLLM's OpenAI server): ``POST /v1/completions``, ``POST
/v1/chat/completions``, ``POST /v1/responses`` with ``GET
/v1/responses/{id}``, ``DELETE /v1/responses/{id}``, ``GET
/v1/responses/{id}/input_items`` and ``POST /v1/responses/{id}/cancel``
(answered from the response store, when it is on; the responses run in
the background are cancelled when the app shuts down, before its link to
the engine closes), ``GET /v1/models``
(one entry a served name),
``POST /tokenize``, ``POST /detokenize``, ``GET /tokenizer_info``, ``GET
/health`` (and ``/ping``), ``GET /version``, ``GET /metrics``; with runtime
LoRA updates on, ``POST /v1/load_lora_adapter`` and ``POST
/v1/unload_lora_adapter`` (``lora_updates.py``; off, they are not routes);
with a profiler (``profiler_config``), ``POST /start_profile`` and ``POST
/stop_profile`` (off, they are not routes); in dev mode, ``POST /sleep``,
``POST /wake_up``, ``GET /is_sleeping`` and ``POST /reset_prefix_cache``
(``dev_routes.py``; off, they are not routes).
With ``access_log`` each request is logged (``access_log.AccessLog``). The
generation routes' valid JSON bodies take ``fast_lane.FastLane``, past
FastAPI's request machinery; every error still comes from FastAPI's route.
Every route reads its body with the lane's JSON parser
(``json_body.JsonBodyRoute``): a string that is not Unicode text (a lone
surrogate) is a malformed body, never a failure further on.
With API keys, every ``/v1`` and ``/v2`` route needs ``Authorization:
Bearer KEY`` with one of them (compared in constant time), else 401. With
``allowed_origins`` (CORS) pages of those origins may call the API from a
browser; their preflights are answered before the key is asked for. Every error, including
a malformed body, an unknown route or a body over the size limit, has
OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``: 400 for
a bad request (an ``InvalidRequestError``, whichever layer found it: its
own message; code ``context_length_exceeded`` when the prompt does not
fit), 401 without the key, 404 for a model, a stored response or a LoRA
adapter this server does not hold, 413 for a body too large, 415 for a body sent as another
media type than JSON (``text/plain``, a form), 500 for a failure of the
server itself, whatever its exception type (a plain ``ValueError`` too:
logged with its traceback, its text not sent), 503 once the engine has
stopped (the reason's first line; the rest is logged by the engine). The
rule is ``errors.py``'s, for whole answers and streams alike.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import logging
from collections.abc import Callable, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, Response

from checkpoint.tokenizer import Tokenizer
from engine.prometheus_metrics import CONTENT_TYPE, Metrics
from ipc import trace
from ipc.lora_request import LoRARequest
from serving.async_client import AsyncEngineClient
from serving.http.access_log import AccessLog
from serving.http.dev_routes import add_dev_routes
from serving.http.errors import error_answer
from serving.http.fast_lane import FastLane, LaneRoute
from serving.http.guards import ApiKeyCheck, BodySizeLimit, JsonContentType
from serving.http.invocations import INVOCATIONS_ROUTE, Invocations, InvocationType
from serving.http.json_body import JsonBodyRoute
from serving.http.logprobs import LogprobsFormatter
from serving.http.lora_updates import (
    LOAD_ROUTE,
    UNLOAD_ROUTE,
    LoadLoRAAdapterRequest,
    LoRAUpdates,
    UnloadLoRAAdapterRequest,
)
from serving.http.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    IdsFirstCompletionRequest,
    ResponsesRequest,
    TokenizeRequest,
    error_body,
)
from serving.http.reasoning import ReasoningParser
from serving.http.response_store import ResponseStore
from serving.http.server_load import (
    SERVER_LOAD_ROUTE,
    TRACKED_ROUTES,
    LoadTracking,
    ServerLoad,
)
from serving.http.serving_chat import create_chat_completion
from serving.http.serving_classification import ClassificationRequest, create_classification
from serving.http.serving_completion import create_completion
from serving.http.serving_embedding import EmbeddingRequest, create_embedding
from serving.http.serving_pooling import PoolingRequest, create_pooling
from serving.http.serving_rerank import RerankRequest, create_rerank
from serving.http.serving_responses import (
    cancel_response,
    create_response,
    delete_response,
    list_input_items,
    retrieve_response,
)
from serving.http.serving_score import ScoreRequest, create_score
from serving.http.serving_tokenize import detokenize, tokenize, tokenizer_info
from serving.http.state import ServerState
from serving.http.streaming import ClientDisconnected
from serving.http.tool_parsers import TOOL_CALL_PARSERS
from serving.http.trace_marks import TracedApp
from serving.http.validation_errors import explain
from serving.protocol_core import EngineStoppedError

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
# The routes whose body is a JSON object (refused with 415 under another media type).
# The routes of an embedding model, which a generating one does not serve (404);
# a classifier serves all but the first (/score and /rerank, as a cross-encoder).
EMBEDDING_ROUTES = ("/v1/embeddings", "/score", "/v1/score", "/rerank", "/v1/rerank",
                    "/v2/rerank")
# The routes of a classifier (the pooling "classify" task), which no other model serves.
CLASSIFY_ROUTES = ("/classify",)
# The routes of every pooling model, whatever its task (vLLM's generic pooling API).
POOLING_ROUTES = ("/pooling",)
JSON_BODY_ROUTES = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/responses",
                              "/tokenize", "/detokenize", *EMBEDDING_ROUTES,
                              *CLASSIFY_ROUTES, *POOLING_ROUTES, INVOCATIONS_ROUTE})
# The routes of a generating model, which a pooling one does not serve (404),
# as vLLM registers each task's routes only for a model that does the task.
GENERATION_ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/responses")


def error_response(status: int, message: str, type: str = "invalid_request_error",
                   param: str | None = None, code: str | int | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type, param, code), status_code=status)


async def _answer(work) -> Response:
    """Run a route's work; its failure is answered by ``errors.error_answer``'s
    rule: an ``InvalidRequestError`` is the client's error (400, or 404 for
    a model or response not held), anything else, a plain ``ValueError``
    too, the server's own (500, logged with its traceback)."""
    try:
        return await work
    except ClientDisconnected:
        return Response(status_code=499)
    except Exception as e:
        return error_json(e)


try:
    TPRUN_VERSION = importlib.metadata.version("tprun")
except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
    TPRUN_VERSION = "unknown"


def error_json(e: Exception) -> JSONResponse:
    """``e`` answered as ``errors.error_answer`` says."""
    status, body = error_answer(e)
    return JSONResponse(body, status_code=status)


def create_app(link: AsyncEngineClient, tokenizer: Tokenizer, served_names: Sequence[str],
               max_model_len: int, api_keys: Sequence[str] = (),
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, access_log: bool = False,
               tool_call_parser: str | None = None, sampling_defaults: dict | None = None,
               allowed_origins: Sequence[str] = (), eos_token_ids: Sequence[int] = (),
               enable_responses_api_store: bool = False, max_logprobs: int = -1,
               vocab_size: int | None = None, reasoning_parser: str | None = None,
               stream_interval: int = 1, trust_request_chat_template: bool = False,
               chat_template: str | None = None, response_role: str = "assistant",
               pooling: bool = False, pooling_task: str = "embed",
               labels: Sequence[str] = (), lora_modules: Sequence[LoRARequest] = (),
               runtime_lora_check: Callable[[LoRARequest], None] | None = None,
               max_loras: int = 0, profiling: bool = False,
               enable_server_load_tracking: bool = False, dev_mode: bool = False):
    """The ASGI app; ``link`` is started and closed with the app's lifespan.
    ``served_names``: the names requests may give the model (at least one).
    ``api_keys``: any of them opens the ``/v1`` and ``/v2`` routes (none: no
    key asked).
    ``tool_call_parser``: a name in ``TOOL_CALL_PARSERS``, with which
    tool_choice "auto" is served (None: refused); ``sampling_defaults``:
    the model's recommended sampling (``LLMEngine.sampling_defaults``);
    ``allowed_origins``: the web origins whose pages may call the API
    (CORS; none by default, so a page of another site cannot);
    ``eos_token_ids``: the model's end-of-sequence ids (beam search ends a
    sequence at one; none given: the tokenizer's);
    ``enable_responses_api_store``: keep finished Responses API responses
    (in memory, bounded: ``response_store.py``), as vLLM's
    ``VLLM_ENABLE_RESPONSES_API_STORE``; ``max_logprobs``: the engine's
    limit on top logprobs per token (-1: any; the engine checks it too),
    checked before a request reaches the engine so that the 400 names
    the field the client sent (``top_logprobs`` in a chat request);
    ``vocab_size``: the model's vocabulary, what a -1 (the whole
    vocabulary) asks for in that check (None: unknown, so a -1 under a
    limit is refused); ``reasoning_parser``: a name in
    ``REASONING_PARSERS``, whose parser splits each chat and Responses
    answer's reasoning off (None: none; ValueError for a tokenizer
    without its tags); ``stream_interval``: vLLM's ``--stream-interval``,
    the least tokens a completion or chat stream's chunk groups
    (``stream_interval.py``); ``trust_request_chat_template``: vLLM's
    ``--trust-request-chat-template``, a request's own chat template served
    (``request_template.py``; refused without it); ``chat_template``: vLLM's
    ``--chat-template``, the chat routes' template in place of the
    tokenizer's (None: the tokenizer's); ``response_role``: vLLM's
    ``--response-role``, a chat answer's role after a generation prompt;
    ``pooling``: the engine is a pooling model (``runner="pooling"``):
    ``EMBEDDING_ROUTES`` (/v1/embeddings, /score, /rerank and their other
    paths) and ``POOLING_ROUTES`` (/pooling, of either task) are served
    and the generation routes (``GENERATION_ROUTES``, those below them
    too) are not, so they answer 404, as vLLM's server of a pooling model;
    a generating model's server answers 404 at ``EMBEDDING_ROUTES`` and
    ``POOLING_ROUTES`` the same way. ``pooling_task``: a pooling model's
    task, "embed" (the routes above) or "classify" (``CLASSIFY_ROUTES``,
    /classify, instead of /v1/embeddings; /score and /rerank score as a
    cross-encoder); ``labels``: a classifier's
    label names by class index (/classify's ``label``). ``lora_modules``: vLLM's
    ``--lora-modules``, adapters a request runs with by naming one as its
    model, each listed in /v1/models. ``runtime_lora_check``: the engine's
    check of an adapter (``LoRAChecks.check``); given, runtime LoRA updates
    are on: ``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``
    are served (``lora_updates.py``; None: they are not routes, 404).
    ``max_loras``: the engine's adapter slots, with LoRA on (0: off), which
    ``/metrics`` reports in vLLM's ``lora_requests_info`` (``engine.prometheus_metrics``).
    ``profiling``: the engine has a profiler (``profiler_config``):
    ``POST /start_profile`` and ``POST /stop_profile`` are served, as
    vLLM's server registers them only then (off: they are not routes, 404);
    each answers 200 with no body once every worker has started, or
    written its trace.
    ``enable_server_load_tracking``: vLLM's; count the requests in flight of
    the routes that use the engine, which ``GET /load`` answers
    (``server_load.py``; off, it answers 0).
    ``dev_mode``: vLLM's development routes are served (``/sleep``,
    ``/wake_up``, ``/is_sleeping``, ``/reset_prefix_cache``:
    ``dev_routes.py``; off, they are not routes, 404)."""
    if isinstance(served_names, str) or not served_names:
        raise ValueError(f"served_names must be a non-empty list of names, got {served_names!r}")
    served_names = tuple(served_names)
    state = ServerState(link, tokenizer, served_names, max_model_len,
                        Metrics(served_names[0], max_loras),
                        LogprobsFormatter(tokenizer),
                        tool_call_parser=(None if tool_call_parser is None
                                          else TOOL_CALL_PARSERS[tool_call_parser]),
                        reasoning_parser=(None if reasoning_parser is None
                                          else ReasoningParser.named(reasoning_parser, tokenizer)),
                        sampling_defaults=dict(sampling_defaults or {}),
                        eos_token_ids=tuple(eos_token_ids) or (
                            () if tokenizer.eos_token_id is None
                            else (tokenizer.eos_token_id,)),
                        response_store=ResponseStore() if enable_responses_api_store else None,
                        max_logprobs=max_logprobs, vocab_size=vocab_size,
                        stream_interval=stream_interval,
                        trust_request_chat_template=trust_request_chat_template,
                        chat_template=chat_template, response_role=response_role,
                        lora_modules={lora.lora_name: lora for lora in lora_modules},
                        labels=tuple(labels), pooling_task=pooling_task)

    @asynccontextmanager
    async def lifespan(_app):
        await link.start()
        try:
            yield
        finally:
            await state.background.shutdown()  # their engine requests aborted while it can
            await link.close()

    app = FastAPI(title="tprun", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.router.route_class = JsonBodyRoute  # bodies read as the lane reads them
    _add_error_handlers(app)

    async def completion(body: CompletionRequest, raw: Request) -> Response:
        return await _answer(create_completion(state, body, raw))

    async def chat_completion(body: ChatCompletionRequest, raw: Request) -> Response:
        return await _answer(create_chat_completion(state, body, raw))

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, raw: Request) -> Response:
        return await completion(body, raw)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, raw: Request) -> Response:
        return await chat_completion(body, raw)

    async def response(body: ResponsesRequest, raw: Request) -> Response:
        return await _answer(create_response(state, body, raw))

    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest, raw: Request) -> Response:
        return await response(body, raw)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, stream: bool = False,
                           starting_after: int | None = None) -> Response:
        return await _answer(_on_loop(retrieve_response, state, response_id, stream,
                                      starting_after))

    @app.delete("/v1/responses/{response_id}")
    async def delete(response_id: str) -> Response:
        return await _answer(_on_loop(delete_response, state, response_id))

    @app.get("/v1/responses/{response_id}/input_items")
    async def input_items(response_id: str, raw: Request) -> Response:
        query = raw.query_params  # include: repeated, as include or include[]
        include = [*query.getlist("include"), *query.getlist("include[]")]
        return await _answer(_on_loop(list_input_items, state, response_id, query, include))

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel(response_id: str) -> Response:
        return await _answer(_on_loop(cancel_response, state, response_id))

    @app.post("/tokenize")
    async def tokenize_route(body: TokenizeRequest) -> Response:
        return await _answer(_json(tokenize, state, body))

    @app.post("/detokenize")
    async def detokenize_route(body: DetokenizeRequest) -> Response:
        return await _answer(_json(detokenize, state, body))

    @app.get("/tokenizer_info")
    async def tokenizer_info_route() -> dict:
        return tokenizer_info(state)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": name, "object": "model", "created": state.created, "owned_by": "tprun",
            "max_model_len": max_model_len} for name in served_names] + [{
            "id": lora.lora_name, "object": "model", "created": state.created,
            "owned_by": "tprun", "root": lora.lora_path, "parent": served_names[0],
            "max_model_len": max_model_len} for lora in state.lora_modules.values()]}

    json_routes = JSON_BODY_ROUTES
    if runtime_lora_check is not None:
        updates = LoRAUpdates(state.lora_modules, served_names, runtime_lora_check)
        json_routes = json_routes | {LOAD_ROUTE, UNLOAD_ROUTE}

        @app.post(LOAD_ROUTE)
        async def load_lora_adapter(body: LoadLoRAAdapterRequest) -> Response:
            return await _answer(updates.load(body))

        @app.post(UNLOAD_ROUTE)
        async def unload_lora_adapter(body: UnloadLoRAAdapterRequest) -> Response:
            return await _answer(updates.unload(body))

    if profiling:
        logger.warning("the profiler's routes /start_profile and /stop_profile are served: "
                       "for local development only")

        @app.post("/start_profile")
        async def start_profile() -> Response:
            return await _answer(_profiled(link, True))

        @app.post("/stop_profile")
        async def stop_profile() -> Response:
            return await _answer(_profiled(link, False))

    if dev_mode:
        add_dev_routes(app, link, error_json)

    @app.get("/health")
    @app.get("/ping")  # vLLM's other name for it (also POST)
    @app.post("/ping")
    async def health() -> Response:
        try:
            await link.stats_by_engine()  # every replica's answer
        except EngineStoppedError as e:
            return error_json(e)
        return Response(status_code=200)

    load = ServerLoad(enable_server_load_tracking)

    @app.get(SERVER_LOAD_ROUTE)
    async def server_load() -> dict:
        return load.answer()

    @app.get("/version")
    async def version() -> dict:
        return {"version": TPRUN_VERSION}

    @app.get("/metrics")
    async def metrics() -> Response:
        try:
            stats = await link.stats_by_engine()
        except EngineStoppedError as e:
            return error_json(e)
        return Response(state.metrics.render(stats), media_type=CONTENT_TYPE)

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest) -> Response:
        return await _answer(create_embedding(state, body))

    @app.post("/classify")
    async def classify(body: ClassificationRequest) -> Response:
        return await _answer(create_classification(state, body))

    @app.post("/pooling")
    async def pooling_route(body: PoolingRequest) -> Response:
        return await _answer(create_pooling(state, body))

    @app.post("/score")
    @app.post("/v1/score")
    async def score(body: ScoreRequest) -> Response:
        return await _answer(create_score(state, body))

    @app.post("/rerank")
    @app.post("/v1/rerank")
    @app.post("/v2/rerank")
    async def rerank(body: RerankRequest) -> Response:
        return await _answer(create_rerank(state, body))

    unserved = _unserved_routes(pooling, pooling_task)
    invocations = Invocations(_invocation_table(pooling, pooling_task, {
        ChatCompletionRequest: chat_completion, CompletionRequest: completion,
        EmbeddingRequest: lambda body, _raw: _answer(create_embedding(state, body)),
        ClassificationRequest: lambda body, _raw: _answer(create_classification(state, body)),
        RerankRequest: lambda body, _raw: _answer(create_rerank(state, body)),
        ScoreRequest: lambda body, _raw: _answer(create_score(state, body)),
        PoolingRequest: lambda body, _raw: _answer(create_pooling(state, body))}))
    app.post(INVOCATIONS_ROUTE)(invocations.__call__)

    lanes = {
        "/v1/completions": LaneRoute(IdsFirstCompletionRequest, completion),
        "/v1/chat/completions": LaneRoute(ChatCompletionRequest, chat_completion),
        "/v1/responses": LaneRoute(ResponsesRequest, response)}
    app.router.routes[:] = [r for r in app.router.routes
                            if not _under(getattr(r, "path", ""), unserved)]
    lane = FastLane(app, {path: lane for path, lane in lanes.items()
                          if not _under(path, unserved)})
    if load.enabled:
        lane = LoadTracking(lane, load, [r for r in TRACKED_ROUTES if not _under(r, unserved)])
    guarded = BodySizeLimit(lane, max_body_bytes)
    guarded = JsonContentType(guarded, json_routes)
    guarded = ApiKeyCheck(guarded, api_keys) if api_keys else guarded
    if allowed_origins:  # outside the key check: a browser's preflight carries no key
        guarded = CORSMiddleware(guarded, allow_origins=list(allowed_origins),
                                 allow_methods=["*"], allow_headers=["*"])
    logged = AccessLog(guarded) if access_log else guarded
    return TracedApp(logged) if trace.enabled else logged


def _unserved_routes(pooling: bool, task: str) -> tuple[str, ...]:
    """The routes this server does not serve (404): a generating model's,
    the pooling ones (/pooling among them); a pooling model's, generation
    and the other task's (a classifier scores pairs: of the embedding
    routes it lacks only /v1/embeddings)."""
    if not pooling:
        return (*EMBEDDING_ROUTES, *CLASSIFY_ROUTES, *POOLING_ROUTES)
    other = CLASSIFY_ROUTES if task == "embed" else EMBEDDING_ROUTES[:1]
    return (*GENERATION_ROUTES, *other)


# The request types whose model takes either prompt form (every field
# optional, so it validates any body): vLLM's two request types, one of
# ``input`` and one of ``messages``; /invocations takes a body as one only
# when it holds one of them.
PROMPT_FORM_TYPES = (ClassificationRequest, PoolingRequest)


def _invocation_table(pooling: bool, task: str, handlers: dict) -> list:
    """``/invocations``' (request model, handler) pairs, in vLLM's order, of
    the routes this server serves (``invocations.py``)."""
    if not pooling:
        order = (ChatCompletionRequest, CompletionRequest)
    else:
        first = EmbeddingRequest if task == "embed" else ClassificationRequest
        order = (first, RerankRequest, ScoreRequest, PoolingRequest)
    return [InvocationType(model, handlers[model],
                           ("input", "messages") if model in PROMPT_FORM_TYPES else ())
            for model in order]


def _under(path: str, roots: Sequence[str]) -> bool:
    """Whether ``path`` is one of ``roots`` or below one."""
    return any(path == root or path.startswith(root + "/") for root in roots)


async def _profiled(link: AsyncEngineClient, start: bool) -> Response:
    """Start or stop the engines' profilers (``AsyncEngineClient.profile``):
    200 with no body, as vLLM's."""
    logger.info("%s the profiler...", "starting" if start else "stopping")
    await link.profile(start)
    logger.info("profiler %s", "started" if start else "stopped")
    return Response(status_code=200)


async def _json(work, state: ServerState, body) -> Response:
    """A tokenizer route's answer, computed off the event loop."""
    return JSONResponse(await asyncio.to_thread(work, state, body))


async def _on_loop(work, *args) -> Response:
    """An answer computed on the event loop (the response store is the
    loop's alone): ``work``'s response, or its JSON body (awaited when it
    must wait, as a cancel waits for the task it ends)."""
    answer = work(*args)
    if inspect.isawaitable(answer):
        answer = await answer
    return answer if isinstance(answer, Response) else JSONResponse(answer)


def _body_model(request: Request, errors: list[dict]) -> type | None:
    """The model the route reads its body into, when the errors are the
    body's (None: the types are unknown)."""
    body_field = getattr(request.scope.get("route"), "body_field", None)
    if body_field is None or any(tuple(e.get("loc", ()))[:1] != ("body",) for e in errors):
        return None
    return body_field.field_info.annotation


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        if errors and errors[0].get("type") == "json_invalid":
            error = errors[0].get("ctx", {}).get("error", "?")
            return error_response(400, f"the body is not valid JSON ({error})")
        model = _body_model(request, errors)
        below = [{**e, "loc": tuple(e.get("loc", ()))[1:]} for e in errors]  # past body/query
        explained = explain(below, model)
        return error_response(400, explained.message, param=explained.param)

    @app.exception_handler(HTTPException)
    async def http_error(_request, exc: HTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))
