"""Speculative decoding inside the runner: drafts proposed on the device
(``ngram``), verified by the rejection sampler (``rejection``)."""
