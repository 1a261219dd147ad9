"""vLLM's ``stream_interval``: how many new tokens a choice's stream groups
into one event.

As vLLM's output processor sends a request's outputs: a choice's first
event goes out at once (the time to its first token is unchanged), then
its events are held and joined until they hold at least ``interval``
tokens since the last one sent, and its last event (the one with its
``finish_reason``) goes out with whatever is held. Tokens count, not
engine steps: a step that brings several tokens counts them all, and
tokens whose text is held back (a stop string's start, an incomplete
character) count as well. Joining loses nothing: the events sent, joined,
are the events produced (text, token ids, logprobs), so a stream's text is
the same at any interval. Interval 1 sends every event as it comes.

A stream's interval is the server's (``--stream-interval``, 1 by default)
or the request's ``stream_interval`` where that is larger: as in vLLM, a
request may raise the server's interval, never lower it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from serving.http.generation import ChoiceEvent


def joined(events: list[ChoiceEvent]) -> ChoiceEvent:
    """One event for successive events of a choice: their text, token ids
    and logprobs in order, the first's prompt logprobs (only a choice's
    first event has any), the last's finish. Each is copied once, however
    many there are."""
    if len(events) == 1:
        return events[0]
    first, last = events[0], events[-1]
    logprobs = (None if all(e.logprobs is None for e in events)
                else [lp for e in events for lp in e.logprobs or []])
    prompt_logprobs = next((e.prompt_logprobs for e in events if e.prompt_logprobs is not None),
                           None)
    return ChoiceEvent(first.index, "".join(e.text for e in events),
                       [t for e in events for t in e.token_ids], logprobs, last.finish_reason,
                       prompt_logprobs, last.stop_reason)


class StreamInterval:
    """Holds each choice's events until they are due (module docstring),
    as a list with their tokens' count, joined once when they go out: an
    interval of many tokens costs its length, not the square of it.
    Invariant: a choice has events held only between its first and its
    last event; once its last is given to ``add``, nothing of it is held."""

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self.held: dict[int, list[ChoiceEvent]] = {}
        self.held_tokens: dict[int, int] = {}
        self.started: set[int] = set()  # choices whose first event went out

    def add(self, event: ChoiceEvent) -> ChoiceEvent | None:
        """The event to send now (``event`` joined after what its choice
        holds), or None while it is held."""
        held = self.held.pop(event.index, [])
        held.append(event)
        tokens = self.held_tokens.pop(event.index, 0) + len(event.token_ids)
        if (event.finish_reason is not None or event.index not in self.started
                or tokens >= self.interval):
            self.started.add(event.index)
            return joined(held)
        self.held[event.index], self.held_tokens[event.index] = held, tokens
        return None


def interval_of(server: int, requested: int | None) -> int:
    """A stream's interval: the ``server``'s, or ``requested`` where it is
    set and larger (module docstring)."""
    return server if requested is None else max(server, requested)


async def grouped(events: AsyncIterator[ChoiceEvent],
                  interval: int | None) -> AsyncIterator[ChoiceEvent]:
    """A stream's ``events`` grouped by ``interval`` (None or 1: as they
    come)."""
    if interval is None or interval <= 1:
        async for event in events:
            yield event
        return
    grouping = StreamInterval(interval)
    async for event in events:
        if (due := grouping.add(event)) is not None:
            yield due
