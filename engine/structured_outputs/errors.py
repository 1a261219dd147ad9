"""``StructuredOutputsError``: one ``structured_outputs`` key's value is bad."""

from __future__ import annotations

from ipc.errors import InvalidRequestError


class StructuredOutputsError(InvalidRequestError):
    """The value of one ``structured_outputs`` key is bad: ``key`` names it
    (for a part of a structural tag, the part's path under the key:
    ``structural_tag.structures[0].begin``) and ``problem`` says what is
    wrong; the text is ``structured_outputs.KEY PROBLEM``."""

    def __init__(self, key: str, problem: str):
        super().__init__(f"structured_outputs.{key} {problem}")
        self.key = key
        self.problem = problem
