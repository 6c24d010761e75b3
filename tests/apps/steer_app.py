"""Test app for steering (tests/runtime/test_steer.py): in process and as `agentlog serve|worker --app tests.apps.steer_app:app`.

Agent `steered`: a user message starting with "hold" makes it call `wait`; any other turn answers
`heard: <the last user message>`, so the log shows which messages the model saw and when.

`wait` blocks until one byte can be read from the FIFO `$STEER_APP_DIR/<thread_id>` (the test
makes it and keeps a write end open, so a byte written before the call, or before a restarted
worker calls it again, waits in the pipe). No polling, no timing.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from agentlog.runtime import AgentSpec, Runtime, Tool, ToolContext, tool
from agentlog.runtime.models.base import ModelRequest
from agentlog.runtime.models.scripted import ScriptedModel, Turn


def answer(request: ModelRequest) -> Turn:
    last = request.messages[-1]
    if last.role == "user" and last.content.startswith("hold"):
        return Turn.tool("wait")
    user = [m.content for m in request.messages if m.role == "user"][-1]
    return Turn.text(f"heard: {user}")


@tool
async def wait(ctx: ToolContext) -> str:
    """Block until the test releases this thread (one byte on its FIFO)."""
    fd = os.open(Path(os.environ["STEER_APP_DIR"]) / ctx.thread_id, os.O_RDONLY | os.O_NONBLOCK)
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
    try:
        await ready
        os.read(fd, 1)
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    return "released"


def spec() -> AgentSpec:
    return AgentSpec(id="steered", model="steered", tools=["wait"], max_rounds=8)


def model() -> ScriptedModel:
    return ScriptedModel([answer], loop=True, position="conversation")


def build(store: Any, wait_tool: Tool = wait) -> Runtime:
    return Runtime(store, agents=[spec()], tools=[wait_tool], models={"steered": model()})


def app(store: Any) -> Runtime:
    return build(store)
