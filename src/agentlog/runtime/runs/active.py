"""The runs a `Runtime` drives in this process: each run's loop and handle, from its start (or
resume) until its loop returns."""

from __future__ import annotations

import asyncio
from typing import Any

from agentlog.runtime.loop.driver import RunLoop
from agentlog.runtime.runs.handle import RunHandle


class ActiveRuns:
    """Run id -> (its loop, its handle) for the loops of this process. An entry stays until its
    loop's task ends (`forget`); `handle` answers only while the loop runs."""

    def __init__(self) -> None:
        self._runs: dict[str, tuple[RunLoop, RunHandle]] = {}

    def add(self, loop: RunLoop, handle: RunHandle) -> None:
        self._runs[handle.run_id] = (loop, handle)

    def forget(self, handle: RunHandle) -> None:
        """Drop `handle`'s entry (not a newer one of the same run)."""
        entry = self._runs.get(handle.run_id)
        if entry is not None and entry[1] is handle:
            del self._runs[handle.run_id]

    def entry(self, run_id: str) -> RunHandle | None:
        """The handle of the last loop of `run_id` here, whether or not it still runs."""
        entry = self._runs.get(run_id)
        return entry[1] if entry is not None else None

    def handle(self, run_id: str) -> RunHandle | None:
        """The handle of `run_id` while its loop runs here, else None."""
        entry = self._runs.get(run_id)
        return entry[1] if entry is not None and not entry[1].done else None

    def loop(self, run_id: str) -> RunLoop | None:
        """The loop of `run_id` while it runs here, else None."""
        entry = self._runs.get(run_id)
        return entry[0] if entry is not None and not entry[1].done else None

    def handles(self) -> list[RunHandle]:
        """Every handle whose loop runs here."""
        return [handle for _loop, handle in self._runs.values() if not handle.done]

    def fence(self) -> None:
        """Fence every run that runs here (`RunLoop.fence`: it writes nothing more)."""
        for loop, handle in list(self._runs.values()):
            if not handle.done:
                loop.fence()

    def abandon(self) -> list[asyncio.Task[Any]]:
        """Fence every run and cancel its task; returns the tasks cancelled, to be awaited."""
        tasks = []
        for loop, handle in list(self._runs.values()):
            task = handle.task
            if task is not None and not task.done():
                loop.fence()
                task.cancel()
                tasks.append(task)
        return tasks


__all__ = ["ActiveRuns"]
