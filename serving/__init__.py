"""The engine served to other processes: ``endpoint`` (the ZeroMQ engine
endpoint of ``tprun serve``), its clients (``client``: blocking,
``async_client``: asyncio), ``async_llm`` (vLLM's asyncio API: the serving
loop on a thread, one more client of it) and ``http`` (the OpenAI-compatible
server, one more client of the endpoint)."""
