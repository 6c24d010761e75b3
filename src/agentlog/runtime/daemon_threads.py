"""Daemon threads for blocking calls (sync tools), each running one call at a time and kept
for a while after it for the next one.

    DAEMON_THREADS.submit(job, name="agentlog-tool-search")   # job() runs in a daemon thread

Every call gets a thread of its own while it runs: when no kept thread is idle a new one is
started, so a call that blocks for an hour holds up no other. Threads are daemons (not the
default executor's, which the interpreter joins at exit): one stuck in a call never keeps a
stopping process alive. A thread idle for `idle` seconds ends. Why keep them at all: starting
a thread costs the event loop a wait for the new thread to be scheduled (`Thread.start` blocks
until it runs), on the path of every sync tool call.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable


class DaemonThreads:
    """The pool (module docstring). `submit` never blocks on a busy thread."""

    def __init__(self, *, idle: float = 60.0) -> None:
        self.idle = idle
        self._lock = threading.Lock()
        #: Kept threads blocked on `_jobs`, waiting for a call.
        self._waiting = 0
        self._jobs: queue.SimpleQueue[tuple[Callable[[], None], str]] = queue.SimpleQueue()

    def submit(self, job: Callable[[], None], *, name: str) -> None:
        """Run `job()` in an idle kept thread, else in a new one (named `name` while it runs).
        `job` must not raise: what it raises is dropped with its thread."""
        with self._lock:
            if self._waiting > 0:
                self._waiting -= 1
                self._jobs.put((job, name))  # under the lock: a waiter timing out finds it
                return
        threading.Thread(target=self._serve, args=(job, name), name=name, daemon=True).start()

    def _serve(self, job: Callable[[], None], name: str) -> None:
        thread = threading.current_thread()
        while True:
            thread.name = name
            try:
                job()
            except BaseException:  # noqa: BLE001 - a job reports through its own callback; the thread goes on
                pass
            thread.name = "agentlog-idle"
            with self._lock:
                self._waiting += 1
            try:
                job, name = self._jobs.get(timeout=self.idle)
            except queue.Empty:
                with self._lock:
                    try:  # submitted between the timeout and this lock: counted off for us already
                        job, name = self._jobs.get_nowait()
                    except queue.Empty:
                        self._waiting -= 1
                        return

    @property
    def idle_threads(self) -> int:
        """Kept threads waiting for a call now."""
        with self._lock:
            return self._waiting


#: The process's pool (sync tools: `agentlog.runtime.tools.in_daemon_thread`).
DAEMON_THREADS = DaemonThreads()


__all__ = ["DAEMON_THREADS", "DaemonThreads"]
