"""The runtime's and the gateway's public seams: the retry-on-conflict helper every OCC write
uses, the `Runtime`'s surface for workers (`active`, `active_handles`, `abandon_runs`), and what
the `Dispatcher` tells the adapters (`runtime`, `agent_catalog`) instead of being probed with
`hasattr`. Against a real nats-server; no sleeps (the tests follow the run's committed events)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentlog.eventlog.errors import VersionConflict
from agentlog.eventlog.events import RunFinished
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.gateway.operations.dispatch import QueueDispatcher
from agentlog.runtime import AgentSpec, Runtime, ToolContext, agent_catalog, tool
from agentlog.runtime.errors import CONFLICT_ATTEMPTS, RunConflict, retry_on_conflict
from agentlog.runtime.models.scripted import ScriptedCall, ScriptedModel, Turn

from tests.support.runtime import store, thread_log  # noqa: F401  (fixture)

pytestmark = pytest.mark.asyncio


async def test_retry_on_conflict_retries_only_conflicts_and_names_what_gave_up() -> None:
    seen: list[int] = []

    async def settles_third(i: int) -> str:
        seen.append(i)
        if i < 2:
            raise VersionConflict("t1", 1, 2)
        return "written"

    assert await retry_on_conflict(settles_third, "write") == "written"
    assert seen == [0, 1, 2], "each attempt gets its index (the first may trust a cached snapshot)"

    calls: list[int] = []

    async def always(i: int) -> None:
        calls.append(i)
        raise VersionConflict("t1", 1, 2)

    with pytest.raises(RunConflict, match="could not cancel run 'r1': the thread keeps moving"):
        await retry_on_conflict(always, "cancel run 'r1'")
    assert len(calls) == CONFLICT_ATTEMPTS == 20

    async def refuses(_i: int) -> None:
        raise ValueError("bad input")

    with pytest.raises(ValueError):  # anything but a conflict is the caller's answer, at once
        await retry_on_conflict(refuses, "write")


class BlockingApp:
    """One agent whose tool blocks until the test releases it: the run stays driven here."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

        @tool
        async def hold(ctx: ToolContext) -> str:
            """Blocks until released."""
            self.entered.set()
            await self.release.wait()
            return "released"

        def script(req: Any) -> Turn:
            if req.messages[-1].role != "user":
                return Turn.text("done")
            return Turn.tools(ScriptedCall("hold", {}, id="c1"))

        self.tool = hold
        self.spec = AgentSpec(id="holder", description="holds", model=ScriptedModel([script], loop=True),
                              tools=["hold"])

    def runtime(self, store: JetStreamEventStore) -> Runtime:
        return Runtime(store, agents=[self.spec], tools=[self.tool])


async def test_runtime_active_surface_tracks_the_runs_it_drives(store: JetStreamEventStore) -> None:
    app = BlockingApp()
    rt = app.runtime(store)
    async with asyncio.timeout(30):
        handle = await rt.start("holder", "go")
        await app.entered.wait()
        assert rt.active(handle.run_id) is handle
        assert rt.active_handles() == [handle]
        assert rt.active("unknown-run") is None
        app.release.set()
        assert (await handle.result()).status == "done"
    assert rt.active(handle.run_id) is None, "a finished run is driven by nobody"
    assert rt.active_handles() == []


async def test_abandon_runs_stops_them_without_committing(store: JetStreamEventStore) -> None:
    app = BlockingApp()
    rt = app.runtime(store)
    async with asyncio.timeout(30):
        handle = await rt.start("holder", "go")
        await app.entered.wait()
        before = await thread_log(store, handle.thread_id)
        tasks = rt.abandon_runs()
        assert len(tasks) == 1
        await asyncio.gather(*tasks, return_exceptions=True)
    after = await thread_log(store, handle.thread_id)
    assert [sc.seq for sc in after] == [sc.seq for sc in before], "nothing committed: the next process resumes it"
    assert not any(type(e) is RunFinished for sc in after for e in sc.commit.events)
    assert rt.active(handle.run_id) is None


async def test_catalogs_say_what_an_app_and_a_gateway_can_start(store: JetStreamEventStore) -> None:
    rt = BlockingApp().runtime(store)
    assert [a["id"] for a in agent_catalog(rt)] == ["holder"]
    assert agent_catalog(rt)[0]["tools"][0]["name"] == "hold"

    queue = QueueDispatcher(store.nc, store, agents=["b", "a"], descriptions={"a": "first"})
    assert queue.agent_catalog() == [{"id": "a", "description": "first", "tools": None},
                                     {"id": "b", "description": "", "tools": None}]
    assert QueueDispatcher(store.nc, store).agent_catalog() == [], "agents unknown to this gateway"
