"""vLLM's development routes, served only in dev mode (``TPRUN_SERVER_DEV_MODE=1``,
or vLLM's ``VLLM_SERVER_DEV_MODE=1``); otherwise they are not routes (404),
as in vLLM:

- ``POST /sleep?level=1|2``: the engine sleeps (``LLM.sleep``: its
  unfinished requests are aborted, its prefix cache reset); 200, no body.
- ``POST /wake_up[?tags=weights&tags=kv_cache]``: restore what sleep freed,
  the tags given (none: all); 200, no body.
- ``GET /is_sleeping``: ``{"is_sleeping": bool}``.
- ``POST /reset_prefix_cache``: forget the cached prefixes; 200, no body
  (as vLLM, the answer does not say whether it was reset: it is not while
  a request runs).

With data-parallel replicas each call goes to every replica; ``is_sleeping``
is true while any sleeps. While the engine sleeps, generation requests wait
in its queue and run once it is woken. A call the engine refuses (sleep mode
off: start it with ``--enable-sleep-mode``; a bad level or tag) is a 500
with the engine's reason, where vLLM's engine fails the call too.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from serving.http.protocol import error_body
from serving.protocol_core import EngineStoppedError

# Where dev mode is asked for: tprun's name first, then vLLM's.
DEV_MODE_ENV = ("TPRUN_SERVER_DEV_MODE", "VLLM_SERVER_DEV_MODE")


def add_dev_routes(app: FastAPI, link, error_json) -> None:
    """Add the routes above to ``app``; ``link`` reaches the engine
    (``AsyncEngineClient`` or ``DataParallelClient``: ``controls_by_engine``),
    ``error_json`` answers an engine that stopped."""

    async def control(method: str, level: int = 1, tags: list[str] | None = None):
        try:
            answers = await link.controls_by_engine(method, level, tags)
        except EngineStoppedError as e:
            return error_json(e)
        errors = [a.error for a in answers if a.error is not None]
        if errors:
            return JSONResponse(error_body(errors[0], "server_error", code=500),
                                status_code=500)
        return answers

    @app.post("/sleep")
    async def sleep(raw: Request) -> Response:
        level = raw.query_params.get("level", "1")
        if not level.lstrip("-").isdigit():
            return JSONResponse(error_body(f"level must be an integer, got {level!r}",
                                           param="level", code=400), status_code=400)
        answer = await control("sleep", level=int(level))
        return answer if isinstance(answer, Response) else Response(status_code=200)

    @app.post("/wake_up")
    async def wake_up(raw: Request) -> Response:
        tags = raw.query_params.getlist("tags") or None
        answer = await control("wake_up", tags=tags)
        return answer if isinstance(answer, Response) else Response(status_code=200)

    @app.get("/is_sleeping")
    async def is_sleeping() -> Response:
        answer = await control("is_sleeping")
        if isinstance(answer, Response):
            return answer
        return JSONResponse({"is_sleeping": any(a.value for a in answer)})

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> Response:
        answer = await control("reset_prefix_cache")
        return answer if isinstance(answer, Response) else Response(status_code=200)
