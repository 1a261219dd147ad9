"""Responses run in the background (``background: true``), as vLLM runs
them: ``BackgroundRuns`` holds each one's task, and ``EventLog`` the
events of one that streams.

A background response's create call returns at once; its task goes on
generating and stores the finished response (``serving_responses._Run``).
The event loop keeps only weak references to tasks, so ``BackgroundRuns``
holds a strong one from ``start`` until the task is done, when it lets it
go and calls the task's ``ended``. That callback, not a ``finally`` in the
task's coroutine, is where a run's cleanup belongs: a task cancelled
before its first step never runs its coroutine at all, ``finally``
included, yet ``ended`` is called however the task ended. ``cancel``
cancels a task and waits for it to end, ``ended`` called: its engine
requests are then aborted, so their KV blocks are freed; ``shutdown``
does so for every task, before the server's link to the engine closes.
Nothing else ends a task: a client that leaves a background response's
stream stops following it, and the response runs on.

An ``EventLog`` keeps every server-sent event of a streamed background
response, in order: the event with ``sequence_number`` n is ``events[n]``
(a stream numbers its events from 0, one by one). ``follow`` gives the
events after a sequence number, those logged and then each new one as it
comes, until the log is closed (the run ended: finished, failed or
cancelled) and all are given. The log is kept with the stored response
(``response_store.py``), so its events can be streamed again after the
run.

All calls come from the HTTP server's event loop: no lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine


class EventLog:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.closed = False
        self._changed = asyncio.Event()

    def append(self, event: str) -> None:
        self.events.append(event)
        self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def chars(self) -> int:
        return sum(map(len, self.events))

    def _wake(self) -> None:
        """Wake every follower waiting now; later ones wait on a fresh event."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def follow(self, starting_after: int | None = None) -> AsyncIterator[str]:
        """The events after sequence number ``starting_after`` (None: all),
        logged and to come, until the log is closed."""
        index = 0 if starting_after is None else starting_after + 1
        while True:
            while index < len(self.events):
                yield self.events[index]
                index += 1
            if self.closed:
                return
            await self._changed.wait()


class BackgroundRuns:
    def __init__(self) -> None:
        self.tasks: dict[str, asyncio.Task] = {}  # by response id, until done

    def start(self, response_id: str, work: Coroutine,
              ended: Callable[[asyncio.Task], None]) -> None:
        """Run ``work`` as ``response_id``'s task, held until it is done;
        then ``ended(task)`` is called, whether ``work`` returned, raised or
        was cancelled (even before it began)."""
        task = asyncio.get_running_loop().create_task(work, name=f"response {response_id}")
        self.tasks[response_id] = task

        def done(task: asyncio.Task) -> None:
            self.tasks.pop(response_id, None)
            ended(task)

        task.add_done_callback(done)

    def running(self, response_id: str) -> bool:
        return response_id in self.tasks

    async def cancel(self, response_id: str) -> None:
        """Cancel ``response_id``'s task (if it runs) and wait until it has
        ended and its ``ended`` has been called (a done task's callbacks
        all run before a waiter on it wakes); its own failures were its to
        handle."""
        task = self.tasks.get(response_id)
        if task is None:
            return
        task.cancel()
        await asyncio.wait({task})  # unlike ``await task``, raises nothing

    async def shutdown(self) -> None:
        """Cancel every task and wait until all have ended (``ended``
        called for each)."""
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
