"""Test app for `tests/e2e/test_large_views_deployed.py` (`--app tests.apps.large_results_app:app`).

- `reader` calls `read_blob` four times, then answers. Each result (`BLOB` characters) fits a
  commit, but the four do not fit one KV value: the run's view must be written without the
  oldest of them, not stop the projections.
- `noter` calls `note` four times: each sets one `BLOB`-sized key of the thread state (a
  commit holds one), so the state outgrows one KV value: the thread's view is written without
  it, and the routes fold it from the log.
- `greeter` answers at once: a run whose reads show whether the projections still move.
"""

from __future__ import annotations

from typing import Any

from agentlog.runtime import AgentSpec, App, ToolContext, tool
from agentlog.runtime.models import ScriptedModel, Turn

#: Characters of one `read_blob` result: a commit holds one (and the tool message that mirrors
#: it), a 1 MB KV value not four.
BLOB = 300_000
READS = 4


@tool
def read_blob(part: int) -> str:
    """A large result (a file's contents, say)."""
    return str(part) * BLOB


@tool
def note(part: int, ctx: ToolContext) -> str:
    """Keep a large note in the thread state."""
    ctx.set(f"/note{part}", str(part) * BLOB)
    return "noted"


def app(_store: Any) -> App:
    reader = ScriptedModel([*(Turn.tool("read_blob", {"part": i}, id=f"read{i}") for i in range(READS)),
                            Turn.text("read them all")], loop=True, position="conversation")
    noter = ScriptedModel([*(Turn.tool("note", {"part": i}, id=f"note{i}") for i in range(READS)),
                           Turn.text("noted them all")], loop=True, position="conversation")
    return App(
        agents=[AgentSpec(id="reader", model="reader", tools=["read_blob"], max_rounds=READS + 2),
                AgentSpec(id="noter", model="noter", tools=["note"], max_rounds=READS + 2),
                AgentSpec(id="greeter", model="greeter", max_rounds=2)],
        tools=[read_blob, note],
        models={"reader": reader, "noter": noter, "greeter": ScriptedModel([Turn.text("hello")], loop=True)},
    )
