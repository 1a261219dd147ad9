"""The sampler's parts, one concept per file.

- ``states``: per-slot sampling parameters (device tables + host mirrors).
- ``penalties``: repetition / presence / frequency penalties and the per-slot
  prompt presence and output counts they read.
- ``filters``: min-p, top-k and top-p as logit thresholds.
- ``noise``: stateless Gumbel noise, a hash of (seed, position, token id);
  ``triton_noise`` draws it (and the greedy argmax) in Triton on CUDA.
- ``logprobs``: top-N logprobs of the raw distribution, the sampled token's
  logprob and rank; ``prompt_logprobs``: the same for prompt positions.
- ``logit_bias`` (allowed ids and biases), ``bad_words``, ``min_tokens``:
  per-slot lists applied to the logits; ``slot_users`` is the host side
  they share (which slots use a table, how large it must be; ``with_width``
  resizes a left-aligned table).
- ``triton_filters``, ``triton_logprobs``, ``triton_penalties``: the Triton
  kernels of filters, logprobs and penalties, beside their torch forms.

``runner.sampler.Sampler`` puts them together.
"""
