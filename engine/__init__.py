"""The engine: scheduler, KV block pool, tokenizer, and the ``LLM`` API."""

from engine.beam_search import BeamSearchOutput, BeamSearchParams, BeamSearchSequence
from engine.llm import LLM
from engine.outputs import CompletionOutput, RequestOutput
from engine.sampling_params import RequestOutputKind, SamplingParams
from engine.structured_outputs import StructuredOutputsParams
from ipc.lora_request import LoRARequest

__all__ = ["LLM", "SamplingParams", "RequestOutputKind", "StructuredOutputsParams",
           "RequestOutput", "CompletionOutput", "BeamSearchParams", "BeamSearchOutput", "BeamSearchSequence",
           "LoRARequest"]
