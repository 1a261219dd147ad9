"""``tprun bench serve``: vLLM's online serving benchmark (``vllm bench
serve``) against any OpenAI-compatible HTTP server.

One concept per module: ``options`` (the command line, vLLM's names),
``random_dataset`` (the prompts), ``arrivals`` (when each request is sent),
``request`` (one streamed request and its timings), ``metrics`` (the
summary statistics), ``report`` (the printed table and the result JSON),
``run`` (the whole run, start to exit code).
"""
