"""What a ``--model`` argument names, made ready to load: ``tiny`` written
once (``tiny_model``), a HF directory, a GGUF file or a ``pkg:`` file
(``gguf_model``, ``gguf_metadata``, ``gguf_tokenizer``); the model's
description (``model_info``) and its tokenizer (``tokenizer``)."""
