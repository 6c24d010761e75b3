"""Whether this process's writes to the log are going through, for `/health` and `/metrics`.

A full disk (or a stream at its `max_bytes` with `discard: new`) leaves NATS connected and reads
working while every write fails: a readiness check that only looks at the connection says `ok`
throughout. The store records the outcome of each append here (and the gateway each command it
queues), so health can say `degraded` with the last error, and goes back to `ok` by itself at
the next write that succeeds: nothing is latched on this side.

A failure only counts for `window` seconds without a later success: a process that wrote
nothing since cannot tell whether the cause is gone, and the stream checks of `/health` cover
the case that outlives it (a stream at its byte limit).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import nats.errors

from agentlog.eventlog.errors import NoAnswer


class WriteHealth:
    """The last write outcome of one process's store (cheap enough for every append)."""

    def __init__(self, window: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self.clock = clock
        self.failures = 0
        self.last_error: str | None = None
        #: The last failure was a request nobody answered (not a refusal such as a byte limit).
        self.unanswered = False
        self._failed_at: float | None = None

    def succeeded(self) -> None:
        self._failed_at = None

    def failed(self, what: str, error: BaseException) -> None:
        self.failures += 1
        self.last_error = f"{what}: {error or type(error).__name__}"
        self.unanswered = isinstance(error, (NoAnswer, nats.errors.TimeoutError))
        self._failed_at = self.clock()

    @property
    def failing(self) -> bool:
        failed_at = self._failed_at
        return failed_at is not None and self.clock() - failed_at < self.window

    def problem(self) -> str | None:
        """A `/health` reason if the last write failed (recently) and none succeeded since."""
        return f"log writes failing: {self.last_error}" if self.failing else None


__all__ = ["WriteHealth"]
