"""What a ``--model`` argument names, made ready to load (``resolve``):
``tiny`` written once (``tiny_model``), a HF directory, a GGUF file or a
``pkg:`` file (``gguf_model``, ``gguf_metadata``, ``gguf_tokenizer``), into
the cache (``cache_dir``); the model's description (``description``) and its
tokenizer (``tokenizer``)."""
