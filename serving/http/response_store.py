"""``ResponseStore``: the Responses API's stored responses, in memory and
bounded.

As vLLM's server keeps them: off unless the server is started with it
(``tprun serve --enable-responses-api-store``); then every response whose
request leaves ``store`` true is kept once it is finished, with the
conversation that led to it and its input items, so that ``GET
/v1/responses/{id}`` answers it again, ``GET
/v1/responses/{id}/input_items`` lists what it was generated from and
``previous_response_id`` continues it; ``DELETE /v1/responses/{id}``
removes it. Unlike vLLM's, the store is bounded: past ``max_responses``
responses or ``max_chars`` characters (their JSON text: body, conversation
and input items), the oldest are dropped first; the newest is always kept.

A conversation is the list of chat messages up to and including the
response's own answer, without its ``instructions`` (OpenAI's rule: a
response's instructions do not carry over to the next). Input items are
the same context before the answer as OpenAI lists it
(``responses_input_items.py``). Each entry holds its whole context, so a
response that continued one removed later goes on being continued.

All calls come from the HTTP server's event loop: no lock.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass

from serving.http.protocol import FieldError

MAX_RESPONSES = 1024
MAX_CHARS = 64 * 1024 * 1024


class UnknownResponseError(FieldError):
    """A response id this server does not hold (HTTP 404)."""

    def __init__(self, param: str | None, response_id: str, store_on: bool) -> None:
        why = "" if store_on else (" (this server stores no responses: start it with "
                                   "--enable-responses-api-store)")
        super().__init__(param, f"Response with id {response_id!r} not found{why}")


@dataclass(frozen=True)
class StoredResponse:
    body: dict  # the Response object as it was answered
    conversation: list[dict]  # chat messages, its answer last, without its instructions
    input_items: list[dict]  # the items it was generated from, as OpenAI lists them
    chars: int


class ResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES, max_chars: int = MAX_CHARS) -> None:
        if max_responses < 1 or max_chars < 1:
            raise ValueError(f"a response store holds at least one response and one "
                             f"character, got {max_responses} and {max_chars}")
        self.max_responses = max_responses
        self.max_chars = max_chars
        self.entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self.chars = 0

    def put(self, body: dict, conversation: list[dict], input_items: list[dict]) -> None:
        """Keep ``body`` (under its ``id``), its conversation and its input
        items, dropping the oldest entries past the bounds."""
        chars = sum(len(json.dumps(part)) for part in (body, conversation, input_items))
        self.delete(body["id"])
        self.entries[body["id"]] = StoredResponse(body, conversation, input_items, chars)
        self.chars += chars
        while len(self.entries) > 1 and (len(self.entries) > self.max_responses
                                         or self.chars > self.max_chars):
            _, dropped = self.entries.popitem(last=False)
            self.chars -= dropped.chars

    def get(self, response_id: str) -> StoredResponse | None:
        return self.entries.get(response_id)

    def delete(self, response_id: str) -> StoredResponse | None:
        """Drop ``response_id``'s entry (None: there was none)."""
        dropped = self.entries.pop(response_id, None)
        if dropped is not None:
            self.chars -= dropped.chars
        return dropped


def stored(store: ResponseStore | None, response_id: str, param: str | None) -> StoredResponse:
    """The stored response ``response_id``; ``UnknownResponseError`` (404)
    when there is none, or no store (``param``: the request field that
    named it, None for a path)."""
    found = None if store is None else store.get(response_id)
    if found is None:
        raise UnknownResponseError(param, response_id, store is not None)
    return found
