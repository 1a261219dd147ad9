"""Structured outputs: constrain a request's tokens to a JSON schema, a
regex, a list of choices or a grammar, through a token bitmask the workers
apply to the logits (see docs/architecture.md, "Structured outputs")."""

from engine.structured_outputs.backend import GrammarError
from engine.structured_outputs.grammar import Grammar
from engine.structured_outputs.manager import StructuredOutputManager
from engine.structured_outputs.params import StructuredOutputsParams

__all__ = ["Grammar", "GrammarError", "StructuredOutputManager", "StructuredOutputsParams"]
