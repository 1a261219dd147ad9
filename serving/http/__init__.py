"""An OpenAI-compatible HTTP front end (FastAPI + uvicorn) for ``tprun serve``.

It reaches the engine over the engine endpoint (``ipc.engine_messages``,
sealed with the launch's secret), as ``serving.client.EngineClient`` does:
``serving.async_client`` is its asyncio client, ``app`` the routes, ``protocol`` the
request and response bodies, ``generation`` one request's choices,
``chat_template`` the prompt of a chat, ``stop_strings`` where text stops,
``metrics`` the Prometheus page, ``http_server`` uvicorn in a thread.
"""
