"""``tprun bench serve``: vLLM's online serving benchmark (``vllm bench
serve``) against any OpenAI-compatible HTTP server.

One concept per module: ``options`` (the command line, vLLM's names),
``datasets`` (which dataset, its file read before anything starts),
``random_dataset``, ``sharegpt_dataset``, ``custom_dataset`` and
``prefix_repetition_dataset`` (each dataset's prompts), ``sampling_order``
(a file dataset's shuffle and oversampling), ``arrivals`` (when each
request is sent), ``ramp_up`` (each request's rate under a ramp-up),
``probe`` (the probe requests beside the load), ``lora_assignment`` (the
adapter each request names), ``request`` (one streamed request and its timings),
``metrics`` (the summary statistics), ``report`` (the printed table and the
result JSON), ``run`` (the whole run, start to exit code).
"""
