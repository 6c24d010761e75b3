"""The order of a thread's commands inside one worker ("Per-thread order" in
`agentlog.runtime.workers.worker`): which of them may run now. No I/O of its own: the one question
it asks the queue (is an earlier command of the thread still there?) comes in as a callable.

- `lock(thread)`: the thread's commands run in this worker one at a time; the one holding the
  lock is acked under it, so the thread's next command here finds it gone from the queue.
- `proven(msg, thread)`: the command's `PREDECESSOR` header proves that no earlier command of
  its thread is queued: it was stored alone, or right after the command this worker carried out
  last for the thread, in its turn, and acked (`took`).
- `wait(msg, thread, seq)`: otherwise, wait until no earlier command is queued, asking at
  growing intervals (`FIRST_PAUSE` to `MAX_PAUSE`) for at most `hold` seconds, and at once when
  this worker carries a command of the thread out (the earlier one may have reached this worker
  after this one: a redelivery). A waiting command does not hold the thread's lock, which the
  earlier one needs; of a thread's commands waiting here only the earliest asks the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from agentlog.runtime.workers.commands import PREDECESSOR

#: Pauses between a waiting command's questions to the queue.
FIRST_PAUSE = 0.002
MAX_PAUSE = 0.032
#: Threads whose last command carried out here in its turn (and acked) a worker remembers.
TURNS_KEPT = 10_000

#: Is a command of the thread earlier than the queue seq still queued? (thread id, seq)
EarlierQueued = Callable[[str, int], Awaitable[bool]]


def predecessor(msg: Any) -> int | None:
    """The queue seq of the command of its thread the server stored this one right after (`0`:
    none was queued), if it was published with `PREDECESSOR`."""
    value = msg.headers.get(PREDECESSOR) if msg.headers else None
    return int(value) if value is not None and value.isdigit() else None


class ThreadOrder:
    """The order of one worker's commands, by thread (module doc)."""

    def __init__(self, earlier_queued: EarlierQueued, *, hold: float, stopping: asyncio.Event) -> None:
        self.earlier_queued = earlier_queued
        #: Seconds a command waits for an earlier one before it is given up (and nak'ed).
        self.hold = hold
        self.stopping = stopping
        self._locks: dict[str, asyncio.Lock] = {}
        #: By thread: the queue seq of the last command carried out here in its turn and acked.
        self._turns_taken: OrderedDict[str, int] = OrderedDict()
        #: By thread: set when a command of it is carried out here, or an earlier one stops waiting.
        self._wakes: dict[str, asyncio.Event] = {}
        #: By thread: the queue seqs of its commands waiting here.
        self._waiting: dict[str, set[int]] = {}
        #: Commands waiting now; commands that waited, and the seconds they waited in all.
        self.waiting = 0
        self.waits = 0
        self.wait_seconds = 0.0

    @contextlib.asynccontextmanager
    async def lock(self, thread_id: str) -> AsyncIterator[None]:
        """Hold the thread's lock in this worker."""
        lock = self._locks.setdefault(thread_id, asyncio.Lock())
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and not lock._waiters and self._locks.get(thread_id) is lock:
                del self._locks[thread_id]

    def proven(self, msg: Any, thread_id: str) -> bool:
        """Does the command's `PREDECESSOR` prove that no earlier command of its thread is queued?"""
        before = predecessor(msg)
        return before is not None and (before == 0 or self._turns_taken.get(thread_id) == before)

    def took(self, thread_id: str, seq: int) -> None:
        """The command at `seq` was carried out here in its turn, and its ack confirmed."""
        self._turns_taken[thread_id] = seq
        self._turns_taken.move_to_end(thread_id)
        if len(self._turns_taken) > TURNS_KEPT:
            self._turns_taken.popitem(last=False)
        self._wake(thread_id)

    def _wake(self, thread_id: str) -> None:
        woken = self._wakes.pop(thread_id, None)
        if woken is not None:
            woken.set()

    async def wait(self, msg: Any, thread_id: str, seq: int) -> bool:
        """Wait until no earlier command of the thread is queued (module doc); False if one still
        is after `hold` seconds, or the worker stops."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        pause = FIRST_PAUSE
        waited = False
        here = self._waiting.setdefault(thread_id, set())
        here.add(seq)
        try:
            while not self.proven(msg, thread_id) and (
                    any(other < seq for other in here) or await self.earlier_queued(thread_id, seq)):
                if self.stopping.is_set() or loop.time() + pause > began + self.hold:
                    return False
                if not waited:
                    waited = True
                    self.waiting += 1
                    self.waits += 1
                woken = self._wakes.setdefault(thread_id, asyncio.Event())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), pause)  # the pacing of the questions
                pause = min(pause * 2, MAX_PAUSE)
            return True
        finally:
            if waited:
                self.waiting -= 1
                self.wait_seconds += loop.time() - began
            here.discard(seq)
            if not here and self._waiting.get(thread_id) is here:
                del self._waiting[thread_id]
            if any(other > seq for other in here):
                self._wake(thread_id)  # a later one waiting behind this one asks the queue itself now
            left = self._wakes.get(thread_id)
            if left is not None and not left._waiters:
                del self._wakes[thread_id]


__all__ = ["FIRST_PAUSE", "MAX_PAUSE", "TURNS_KEPT", "EarlierQueued", "ThreadOrder", "predecessor"]
