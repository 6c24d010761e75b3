"""Test app for `tests/test_large_views_deployed.py` (`--app large_results_app:app`).

- `reader` calls `read_blob` four times, then answers. Each result (`BLOB` characters) fits a
  commit, but the four do not fit one KV value: the run's view must be written without the
  oldest of them, not stop the projections.
- `greeter` answers at once: a run whose reads show whether the projections still move.
"""

from __future__ import annotations

from typing import Any

from agentlog.gateway.operations.app_loader import App
from agentlog.runtime import AgentSpec, tool
from agentlog.runtime.models import ScriptedModel, Turn

#: Characters of one `read_blob` result: a commit holds one (and the tool message that mirrors
#: it), a 1 MB KV value not four.
BLOB = 300_000
READS = 4


@tool
def read_blob(part: int) -> str:
    """A large result (a file's contents, say)."""
    return str(part) * BLOB


def app(_store: Any) -> App:
    reader = ScriptedModel([*(Turn.tool("read_blob", {"part": i}, id=f"read{i}") for i in range(READS)),
                            Turn.text("read them all")], loop=True, position="conversation")
    return App(
        agents=[AgentSpec(id="reader", model="reader", tools=["read_blob"], max_rounds=READS + 2),
                AgentSpec(id="greeter", model="greeter", max_rounds=2)],
        tools=[read_blob],
        models={"reader": reader, "greeter": ScriptedModel([Turn.text("hello")], loop=True)},
    )
