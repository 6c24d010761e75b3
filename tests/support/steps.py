"""`within(what, seconds)`: a test step bounded in time whose failure names the step.

A bare `asyncio.timeout` around a whole test fails with `TimeoutError` and the traceback of
whatever the cancel unwound, which is often not what hung (a shutdown waiting on a background task
shows the shutdown, and the task it waited on is gone by the time the traceback is printed).
`within` fails with an `AssertionError` naming the step and listing where every task of the loop
waited at the deadline, taken before the cancel moved anything."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

#: Innermost frames shown per task.
DEPTH = 3


def _awaiting(task: asyncio.Task[object]) -> list[str]:
    """The frames of a pending task's await chain, outermost first (`Task.get_stack` gives only
    the outermost of a suspended task)."""
    out = []
    awaited: object = task.get_coro()
    while awaited is not None:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
        if frame is None:
            break
        path = "/".join(frame.f_code.co_filename.rsplit("/", 2)[-2:])
        out.append(f"{path}:{frame.f_lineno} {frame.f_code.co_name}")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
    return out


def where_tasks_wait(depth: int = DEPTH) -> str:
    """One line per pending task of the running loop: its name and the innermost `depth` frames
    of what it awaits (innermost first). Callable from a plain callback (no current task needed)."""
    lines = []
    for task in asyncio.all_tasks():
        if not task.done():
            chain = _awaiting(task)
            lines.append(f"  {task.get_name()}: {' <- '.join(reversed(chain[-depth:])) or '(not started)'}")
    return "\n".join(sorted(lines))


@contextlib.asynccontextmanager
async def within(what: str, seconds: float) -> AsyncIterator[None]:
    """Run the body within `seconds`, or fail saying that `what` did not finish, with where
    every task waited at the deadline."""
    loop = asyncio.get_running_loop()
    when = loop.time() + seconds
    # due in the same loop step as the timeout's cancel, and a cancel only takes effect in a
    # later step: this sees every task where it waited
    seen: list[str] = []
    snapshot = loop.call_at(when, lambda: seen.append(where_tasks_wait()))
    try:
        async with asyncio.timeout_at(when):
            yield
    except TimeoutError as exc:
        waiting = seen[0] if seen else where_tasks_wait()
        raise AssertionError(f"{what} did not finish within {seconds:g} s; the tasks waited in:\n{waiting}") from exc
    finally:
        snapshot.cancel()
