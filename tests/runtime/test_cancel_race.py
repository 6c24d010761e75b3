"""A cancel that races the run's own suspension is never lost.

`Runtime.cancel` decides between two ways: a run that is running gets a `RunCancelRequested` (the
loop takes it at its next commit or signal), a run that waits for decisions runs nowhere and is
cancelled from the log in one commit. The run can move from the first state to the second while
the cancel is on its way (the loop commits its suspension and stops): the answer "cancelled"
must then still mean the run ends `cancelled`, not a waiting run holding a request nobody reads.
The test cancels right after the start, at every yield point of the way to the suspension,
many times over, on a real nats-server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentlog.eventlog.events import RunFinished
from agentlog.runtime import AgentSpec, PermissionPlugin, Runtime, tool
from agentlog.runtime.models import ScriptedModel, Turn

from tests.support.runtime import store  # noqa: F401  (fixture)

pytestmark = pytest.mark.asyncio

YIELDS = 60  # cancel after 0..YIELDS-1 event-loop turns: past the suspension commit on this machine


@tool
def deploy(env: str) -> str:
    """Deploy (asks a human first)."""
    return f"deployed to {env}"


async def test_a_cancel_racing_the_suspension_always_finishes_the_run(store: Any) -> None:
    outcomes: dict[str, int] = {}
    for turns in range(YIELDS):
        agent = AgentSpec(id="agent", model=ScriptedModel([Turn.tool("deploy", {"env": "prod"}), "done"]),
                          tools=["deploy"], plugins=[PermissionPlugin(ask=["deploy"])])
        rt = Runtime(store, agents=[agent], tools=[deploy])
        handle = await rt.start("agent", "ship it")
        for _ in range(turns):
            await asyncio.sleep(0)  # a yield point, not a wait: where the cancel lands varies
        cancelled = await rt.cancel(handle.run_id, reason="stop")
        assert cancelled is True  # the run had not finished: a cancel was recorded
        async with asyncio.timeout(10):  # a lost cancel leaves the run waiting forever
            async for sc in store.follow(handle.thread_id, after=0):
                finished = [e for e in sc.commit.events if type(e) is RunFinished and sc.commit.run_id == handle.run_id]
                if finished:
                    assert finished[0].termination.type == "cancelled", (turns, finished)
                    break
        view = (await rt.run_view(handle.run_id))
        outcomes[view.status] = outcomes.get(view.status, 0) + 1
    assert outcomes == {"done": YIELDS}
