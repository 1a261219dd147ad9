"""The sampler's parts, one concept per file.

- ``states``: per-slot sampling parameters (device tables + host mirrors).
- ``penalties``: repetition / presence / frequency penalties and the per-slot
  prompt presence and output counts they read.
- ``filters``: min-p, top-k and top-p as logit thresholds.
- ``noise``: stateless Gumbel noise, a hash of (seed, position, token id);
  ``triton_noise`` draws it (and the greedy argmax) in Triton on CUDA.
- ``logprobs``: top-N logprobs of the raw distribution, the sampled token's
  logprob and rank.

``runner.sampler.Sampler`` puts them together.
"""
