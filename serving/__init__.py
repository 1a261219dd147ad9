"""The engine served to other processes: ``endpoint`` (the ZeroMQ engine
endpoint of ``tprun serve``), its clients (``client``: blocking,
``async_client``: asyncio) and ``http`` (the OpenAI-compatible server, one
more client of the endpoint)."""
