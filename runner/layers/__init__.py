"""Tensor-parallel building blocks of the Llama-family models."""

from runner.layers.linear import ColumnParallelLinear, OutputPart, RowParallelLinear
from runner.layers.rms_norm import RMSNorm
from runner.layers.rotary import RotaryEmbedding
from runner.layers.vocab_parallel import ParallelLMHead, VocabParallelEmbedding
from runner.layers.weight_slice import WeightSlice

__all__ = [
    "ColumnParallelLinear",
    "OutputPart",
    "ParallelLMHead",
    "RMSNorm",
    "RotaryEmbedding",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "WeightSlice",
]
