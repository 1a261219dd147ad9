"""vLLM's ``return_token_ids`` on /v1/completions and /v1/chat/completions:
an answer also carries the token ids behind it.

A choice's ids are the raw output's: every token the engine generated for
it, as they came, also those whose text the answer does not show (a stop
token's, an incomplete character's, a reasoning tag a reader drops, a tool
call's markup), as vLLM gives them. The prompt's are the ids the engine
took (after ``truncate_prompt_tokens``, a chat's after its template).
Whole, a choice's ids are all its events' ids. Streamed, each chunk carries
its event's ids, and an event with ids gets its chunk even where no text
comes out of it, so the chunks' ids add up to the whole answer's; a
choice's prompt ids come once, on its first chunk. Where they go is the
route's: a completion's choice carries both, a chat answer the prompt's at
its top (streamed, on each choice's role chunk).
"""

from __future__ import annotations

from serving.http.generation import ChoiceEvent, Generation


class ReturnedTokenIds:
    """One answer's ids under ``return_token_ids``: the prompts' where
    ``prompts`` is set, the choices' where ``outputs`` is (a chat answer
    that hides its reasoning shows its prompt's ids but not its own, as
    vLLM's); what is not shown is None, or no chunk field."""

    def __init__(self, generation: Generation, prompts: bool, outputs: bool) -> None:
        self.prompts, self.outputs = prompts, outputs
        self._prompt_ids = generation.prompts_by_choice()
        self._generated: dict[int, list[int]] = {i: [] for i in self._prompt_ids}
        self._prompt_sent: set[int] = set()

    def add(self, event: ChoiceEvent) -> None:
        """Gather ``event``'s ids into its choice's (a whole answer's)."""
        if self.outputs:
            self._generated[event.index] += event.token_ids

    def of_choice(self, index: int) -> list[int] | None:
        """A whole answer's choice ``index``: every id its events brought."""
        return self._generated[index] if self.outputs else None

    def prompt_of(self, index: int) -> list[int] | None:
        """The prompt ids of choice ``index``."""
        return self._prompt_ids[index] if self.prompts else None

    def first_prompt_of(self, index: int) -> list[int] | None:
        """``prompt_of``, the first time it is asked for choice ``index``
        only (a stream's first chunk of it); None after."""
        if not self.prompts or index in self._prompt_sent:
            return None
        self._prompt_sent.add(index)
        return self._prompt_ids[index]

    def needs_chunk(self, event: ChoiceEvent) -> bool:
        """Whether a stream sends ``event`` for its ids, whatever text it has."""
        return self.outputs and bool(event.token_ids)

    def chunk_fields(self, event: ChoiceEvent) -> dict:
        """A stream chunk's choice fields for ``event``: its ``token_ids``."""
        return {"token_ids": event.token_ids} if self.outputs else {}
