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
and input items, and a streamed background response's events), the oldest
finished ones are dropped first; the newest is always kept.

A background response (``responses_background.py``) is stored when it is
created, "queued", and stored again as its status changes: "in_progress",
then finished ("completed", "incomplete", "failed" or "cancelled"), each
time as the newest. Until it has finished, eviction passes it over: a
running response stays until it finishes (or is cancelled or deleted), and
only then counts as any other, so the bounds can be exceeded by running
responses alone, as many as run at once.

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
from dataclasses import dataclass, replace

from serving.http.protocol import FieldError
from serving.http.responses_background import EventLog

MAX_RESPONSES = 1024
MAX_CHARS = 64 * 1024 * 1024
RUNNING = ("queued", "in_progress")  # the statuses of a response not yet finished


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
    # A background response that streams: its events (None: not one).
    events: EventLog | None = None

    @property
    def running(self) -> bool:
        """Whether it is a background response that has not finished."""
        return self.body["status"] in RUNNING


class ResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES, max_chars: int = MAX_CHARS) -> None:
        if max_responses < 1 or max_chars < 1:
            raise ValueError(f"a response store holds at least one response and one "
                             f"character, got {max_responses} and {max_chars}")
        self.max_responses = max_responses
        self.max_chars = max_chars
        self.entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self.chars = 0

    def put(self, body: dict, conversation: list[dict], input_items: list[dict],
            events: EventLog | None = None) -> None:
        """Keep ``body`` (under its ``id``, as the newest entry), its
        conversation, its input items and its events, dropping the oldest
        finished entries past the bounds."""
        self.delete(body["id"])
        entry = StoredResponse(body, conversation, input_items, 0, events)
        self._keep(replace(entry, chars=_size(entry)))

    def put_cancelled(self, response_id: str) -> dict:
        """Store ``response_id``'s entry again (as the newest) with status
        "cancelled", all else as it was; the cancelled body. ``KeyError``
        for an id not held."""
        entry = self.entries[response_id]
        cancelled = {**entry.body, "status": "cancelled"}
        self.put(cancelled, entry.conversation, entry.input_items, entry.events)
        return cancelled

    def recount(self, response_id: str) -> None:
        """Count ``response_id``'s entry again, in its place, for the events
        logged since it was put (a streamed background response's last
        ones come after its finished body is stored); then the bounds hold
        as after a ``put``. Nothing for an id not held."""
        entry = self.entries.get(response_id)
        if entry is not None:
            self.chars -= entry.chars
            self._keep(replace(entry, chars=_size(entry)))

    def _keep(self, entry: StoredResponse) -> None:
        """Hold ``entry`` (where its id is, else as the newest) and count
        it; drop the oldest finished entries, never it, past the bounds."""
        response_id = entry.body["id"]
        self.entries[response_id] = entry
        self.chars += entry.chars
        while len(self.entries) > self.max_responses or self.chars > self.max_chars:
            oldest = self._oldest_finished(response_id)
            if oldest is None:
                break
            self.delete(oldest)

    def _oldest_finished(self, kept: str) -> str | None:
        """The oldest entry that may be dropped: finished, not ``kept``."""
        return next((response_id for response_id, entry in self.entries.items()
                     if not entry.running and response_id != kept), None)

    def get(self, response_id: str) -> StoredResponse | None:
        return self.entries.get(response_id)

    def delete(self, response_id: str) -> StoredResponse | None:
        """Drop ``response_id``'s entry (None: there was none)."""
        dropped = self.entries.pop(response_id, None)
        if dropped is not None:
            self.chars -= dropped.chars
        return dropped


def _size(entry: StoredResponse) -> int:
    """What ``entry`` counts against ``max_chars``: the JSON text of its
    body, conversation and input items, and its events' text."""
    parts = (entry.body, entry.conversation, entry.input_items)
    chars = sum(len(json.dumps(part)) for part in parts)
    return chars + (0 if entry.events is None else entry.events.chars())


def stored(store: ResponseStore | None, response_id: str, param: str | None) -> StoredResponse:
    """The stored response ``response_id``; ``UnknownResponseError`` (404)
    when there is none, or no store (``param``: the request field that
    named it, None for a path)."""
    found = None if store is None else store.get(response_id)
    if found is None:
        raise UnknownResponseError(param, response_id, store is not None)
    return found
