"""Test app for `agentlog serve --app tests.apps.serve_app:app` subprocesses (tests/e2e/test_serve_crash.py,
scripts/bench_reliability.py).

Agent `held`: one `hold` call, then a text answer (any run on a thread continues the script);
`held_sync` the same with `hold_sync`, a sync tool (it runs in a thread, which no stop can cancel).
`hold` returns at once when the file `$SERVE_APP_HOLD_DIR/<thread_id>` exists and does not name
the calling run, and otherwise blocks until cancelled: the test decides, per thread and before a
process starts, whether that process can finish the run. A file naming run ids (one per line)
releases the thread's other runs only: a test can release a continuation while the run it
interrupts stays held, however late that run's `hold` looks. No polling, no timing.

Agent `paying`: one `pay` call, then a text answer. `pay` is declared not idempotent: it appends
one line (`<run_id> <call_id>`) to `$SERVE_APP_HOLD_DIR/executions` (O_APPEND: outside the log,
so a test counts its executions across processes), then holds as `hold` does. A process killed
during it leaves the call in doubt.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

from agentlog.runtime import AgentSpec, Runtime, ToolContext, tool
from agentlog.runtime.models.scripted import ScriptedModel, Turn


def _held(ctx: ToolContext) -> bool:
    release = Path(os.environ["SERVE_APP_HOLD_DIR"]) / ctx.thread_id
    try:
        still_held = release.read_text().split()
    except FileNotFoundError:
        still_held = [ctx.run_id]
    return ctx.run_id in still_held


@tool
async def hold(ctx: ToolContext) -> str:
    """Finish if this thread is released for this run, else block (until the run is cancelled or
    the process stops)."""
    if _held(ctx):
        await asyncio.Event().wait()
    return "released"


@tool
def hold_sync(ctx: ToolContext) -> str:
    """`hold` as a sync tool (it runs in a thread): when held it blocks for good, and a thread
    cannot be cancelled: the tool that ignores a stop."""
    if _held(ctx):
        threading.Event().wait()
    return "released"


def record_execution(ctx: ToolContext) -> None:
    """Append `<run_id> <call_id>` to the executions file, in one write (O_APPEND)."""
    path = Path(os.environ["SERVE_APP_HOLD_DIR"]) / "executions"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, f"{ctx.run_id} {ctx.call_id}\n".encode())
    finally:
        os.close(fd)


@tool(idempotent=False)
async def pay(ctx: ToolContext) -> str:
    """Pay (once: not idempotent), then finish if this thread is released for this run, else
    block."""
    record_execution(ctx)
    if _held(ctx):
        await asyncio.Event().wait()
    return "paid"


def release_all_but(hold_dir: Path, thread_id: str, run_id: str) -> None:
    """Release the thread's runs except `run_id` (written whole: a `hold` never reads half a file)."""
    staged = hold_dir / f".{thread_id}.staged"
    staged.write_text(run_id)
    staged.replace(hold_dir / thread_id)


def app(store: Any) -> Runtime:
    spec = AgentSpec(id="held", model="held", tools=["hold"], max_rounds=5)
    model = ScriptedModel([Turn.tool("hold"), Turn.text("after hold")], loop=True, position="conversation")
    sync_spec = AgentSpec(id="held_sync", model="held_sync", tools=["hold_sync"], max_rounds=5)
    sync_model = ScriptedModel([Turn.tool("hold_sync"), Turn.text("after hold")], loop=True,
                               position="conversation")
    paying_spec = AgentSpec(id="paying", model="paying", tools=["pay"], max_rounds=5)
    paying_model = ScriptedModel([Turn.tool("pay"), Turn.text("after pay")], loop=True, position="conversation")
    return Runtime(store, agents=[spec, sync_spec, paying_spec], tools=[hold, hold_sync, pay],
                   models={"held": model, "held_sync": sync_model, "paying": paying_model})
