"""Test app for `agentlog serve --app serve_app:app` subprocesses (tests/test_serve_crash.py,
scripts/bench_reliability.py).

Agent `held`: one `hold` call, then a text answer (any run on a thread continues the script).
`hold` returns at once when the file `$SERVE_APP_HOLD_DIR/<thread_id>` exists, and otherwise
blocks until cancelled: the test decides, per thread and before a process starts, whether that
process can finish the run. No polling, no timing.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from agentlog.runtime import AgentSpec, Runtime, ToolContext, tool
from agentlog.runtime.models.scripted import ScriptedModel, Turn


@tool
async def hold(ctx: ToolContext) -> str:
    """Finish if this thread is released, else block (until the run is cancelled or the process stops)."""
    released = Path(os.environ["SERVE_APP_HOLD_DIR"]) / ctx.thread_id
    if not released.exists():
        await asyncio.Event().wait()
    return "released"


def app(store: Any) -> Runtime:
    spec = AgentSpec(id="held", model="held", tools=["hold"], max_rounds=5)
    model = ScriptedModel([Turn.tool("hold"), Turn.text("after hold")], loop=True, position="conversation")
    return Runtime(store, agents=[spec], tools=[hold], models={"held": model})
