"""Helpers for the worker tests (no tests here; `test_` only so it belongs to the worker suite): worker subprocesses, a log watcher, comparisons."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentlog.eventlog.events import StoredCommit
from agentlog.projections.fold import fold_commits

from tests.support import forkserver
from tests.support.topology import PYTHONPATH, REPO

APPROVE = {"target_id": "call_2_1", "decision_id": "approve-deploy", "action": "resume", "result": {"approved": True}}


#: A worker process: a child of this process, or of the fork server (tests/support/forkserver.py).
WorkerProcess = asyncio.subprocess.Process | forkserver.AsyncForkedProcess


async def spawn_worker(url: str, logdir: Path, name: str, *, env: dict[str, str] | None = None,
                       ack_wait: float = 1.0, concurrency: int = 4, args: Sequence[str] = ()) -> WorkerProcess:
    """An `agentlog worker` process (`python -m agentlog worker`, or the same forked from the
    fork server), with `args` added to its command line; its output goes to `<logdir>/<name>.log`."""
    argv = ["worker", "--nats", url, "--app", "tests.apps.worker_app:app", "--ack-wait", str(ack_wait),
            "--concurrency", str(concurrency), "--shutdown-timeout", "5", *args]
    full_env = {**os.environ, "PYTHONPATH": PYTHONPATH, **(env or {})}
    with open(logdir / f"{name}.log", "wb") as out:
        if forkserver.enabled():
            return forkserver.AsyncForkedProcess(
                forkserver.SERVER.spawn(argv, cwd=str(REPO), env=full_env, stdout=out, stderr=out))
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agentlog", *argv, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
            cwd=str(REPO), env=full_env,
        )


async def kill_all(procs: list[WorkerProcess]) -> None:
    for p in procs:
        if p.returncode is None:
            try:
                p.kill()
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            async with asyncio.timeout(10):
                await p.wait()
        except TimeoutError:
            pass


class Watch:
    """Follows one thread's log (live) and folds it; `until(pred)` waits for a condition."""

    def __init__(self, store: Any, thread_id: str) -> None:
        self.store = store
        self.thread_id = thread_id
        self.commits: list[StoredCommit] = []
        self._changed = asyncio.Condition()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        async for sc in self.store.follow(self.thread_id):
            self.commits.append(sc)
            async with self._changed:
                self._changed.notify_all()

    def run_status(self, run_id: str) -> str | None:
        runs = fold_commits(self.commits).runs
        return runs[run_id].status if run_id in runs else None

    async def until(self, pred: Callable[[Watch], bool]) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: pred(self) or self._task.done())
        if self._task.done() and not pred(self):
            self._task.result()
            raise AssertionError("the follow ended before the condition held")

    async def status_in(self, run_id: str, statuses: set[str]) -> str:
        await self.until(lambda w: w.run_status(run_id) in statuses)
        return self.run_status(run_id)  # type: ignore[return-value]

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def message_list(commits: list[StoredCommit], thread_id: str) -> list[tuple[Any, ...]]:
    """The thread's messages without their generated ids."""
    thread = fold_commits(commits).threads[thread_id]
    del thread
    out = []
    for sc in commits:
        for ev in sc.commit.events:
            if type(ev).__name__ == "MessageAppended":
                m = ev.message
                calls = tuple((c.id, c.name, repr(c.arguments)) for c in m.tool_calls or ())
                out.append((m.role, m.content, m.tool_call_id, calls))
    return out


def thread_state(commits: list[StoredCommit], thread_id: str) -> Any:
    return fold_commits(commits).threads[thread_id].state


def read_lines(path: Path) -> list[tuple[int, str]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        pid, _, rest = line.partition(" ")
        out.append((int(pid), rest))
    return out
