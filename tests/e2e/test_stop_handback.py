"""A stopped process hands its unfinished runs back at once, and the next one takes them.

Both topologies (`agentlog serve`; `agentlog gateway` + `agentlog worker`), stopping the process
that drives the runs while their tools block: the async `hold` (it honours cancellation) and the
sync `hold_sync` (a thread: it ignores it). The command lease is 600 s, far past the test's bound,
so a run the next process finishes was handed back, not redelivered after its lease. Between the
stop and the next start the nats-server restarts, as the embedded one does when its last process
leaves: a hand-back JetStream kept only in memory would be lost there.

- SIGTERM with `--shutdown-timeout` shorter than the tools: the process says `handing 2 runs back
  (runs ...)`, exits, and the next process finishes both (a `hold_sync` thread does not keep it
  alive; a bare NAK would leave both leased for 600 s after the restart).
- Ctrl-C with a long shutdown timeout says it is waiting and that Ctrl-C again hands the run back;
  the second Ctrl-C does, at once.

And, in one process on a real nats-server: a fenced run (what a stopping worker does before it
hands the command back) writes nothing more when its tool answers; another process resumes it.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections import Counter
from contextlib import aclosing
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import RunFinished, StoredCommit, ToolCallCompleted, ToolCallStarted
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.runtime import AgentSpec, Runtime, ToolContext, tool
from agentlog.runtime.models.scripted import ScriptedModel, Turn

from tests.support.topology import Deployment

TIMEOUT = 90
#: The command lease of every process here: longer than any bound of the test.
LEASE_S = "600"
NAKED = "$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED.AGENTLOG_COMMANDS.>"


@pytest.fixture
def deployment_options(tmp_path: Path) -> dict[str, object]:
    (tmp_path / "hold").mkdir()
    return {"app": "tests.apps.serve_app:app", "env": {"SERVE_APP_HOLD_DIR": str(tmp_path / "hold"),
                                            "AGENTLOG_WORKER_ACK_WAIT": LEASE_S,
                                            "AGENTLOG_SHUTDOWN_TIMEOUT": "0.2"}}


def driver(d: Deployment) -> str:
    """The process that drives the runs."""
    return "serve" if d.kind == "serve" else "worker-0"


async def start_run(d: Deployment, agent_id: str, thread_id: str) -> str:
    async with aiohttp.ClientSession(d.http_url) as http:
        async with http.post("/v1/runs", json={"agent_id": agent_id, "messages": "go", "thread_id": thread_id}) as r:
            assert r.status == 202, await r.text()
            run_id: str = (await r.json())["run_id"]
            return run_id


async def until(store: JetStreamEventStore, thread_id: str, event: type) -> StoredCommit:
    """The first commit of the thread holding an `event`, waiting for it on the live log."""
    async with aclosing(store.follow(thread_id, 0)) as commits:
        async for sc in commits:
            if any(isinstance(e, event) for e in sc.commit.events):
                return sc
    raise AssertionError("the log follow ended")


async def finished_once(store: JetStreamEventStore, thread_id: str, run_id: str) -> None:
    """The run ended naturally, each of its calls completed once, no commit was written twice."""
    end = await until(store, thread_id, RunFinished)
    assert end.commit.run_id == run_id
    assert [e.termination.type for e in end.commit.events if isinstance(e, RunFinished)] == ["natural_end"]
    commits = [sc async for sc in store.read_thread(thread_id)]
    ids = [sc.commit.commit_id for sc in commits]
    assert len(ids) == len(set(ids)), "a commit was written twice"
    completed = Counter(e.call_id for sc in commits for e in sc.commit.events if isinstance(e, ToolCallCompleted))
    assert list(completed.values()) == [1], completed


class Naks:
    """Counts the NAKs the server applied to the workers' commands (its advisories)."""

    def __init__(self) -> None:
        self.count = 0
        self.changed = asyncio.Condition()

    async def on_advisory(self, msg: Any) -> None:
        assert json.loads(msg.data)["stream"] == "AGENTLOG_COMMANDS"
        async with self.changed:
            self.count += 1
            self.changed.notify_all()

    async def reach(self, n: int) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: self.count >= n)


def restart_nats(d: Deployment) -> None:
    """As the embedded nats-server does when its last process stops: down, then up on its data."""
    d.nats.stop()
    d.nats.start()


async def test_sigterm_and_ctrl_c_hand_the_runs_to_the_next_process(deployment: Deployment, tmp_path: Path) -> None:
    d, hold = deployment, tmp_path / "hold"
    name = driver(d)
    store = await JetStreamEventStore.connect(d.nats_url)
    naks = Naks()
    await store.nc.subscribe(NAKED, cb=naks.on_advisory)
    try:
        async with asyncio.timeout(TIMEOUT):
            # SIGTERM, the shutdown timeout (0.2 s) shorter than the tools
            run_a, run_b = await start_run(d, "held", "ta"), await start_run(d, "held_sync", "tb")
            for thread in ("ta", "tb"):
                await until(store, thread, ToolCallStarted)
            await asyncio.to_thread(d.stop, name)
            assert d.procs[name].returncode == 0, d.output(name)
            a, b = sorted([run_a, run_b])
            assert f"handing 2 runs back (runs {a}, {b})" in d.output(name), d.output(name)
            await naks.reach(2)  # both commands given back to the queue before the process ended
            await store.close()
            await asyncio.to_thread(restart_nats, d)
            (hold / "ta").touch()
            (hold / "tb").touch()
            d.env = {**d.env, "AGENTLOG_SHUTDOWN_TIMEOUT": "600"}  # the next start: Ctrl-C's turn
            await asyncio.to_thread(d.start, name)
            store = await JetStreamEventStore.connect(d.nats_url)
            await finished_once(store, "ta", run_a)  # taken over although its lease has 600 s to go
            await finished_once(store, "tb", run_b)

            # Ctrl-C waits up to the shutdown timeout (600 s); a second Ctrl-C hands the run back now
            run_c = await start_run(d, "held", "tc")
            await until(store, "tc", ToolCallStarted)
            d.procs[name].send_signal(signal.SIGINT)
            await asyncio.to_thread(d.wait_output, name, "Ctrl-C again hands it back now")
            d.procs[name].send_signal(signal.SIGINT)
            await asyncio.to_thread(d.procs[name].wait)
            assert d.procs[name].returncode == 0, d.output(name)
            assert f"handing 1 run back (run {run_c})" in d.output(name), d.output(name)
            (hold / "tc").touch()
            await asyncio.to_thread(d.start, name)
            await finished_once(store, "tc", run_c)
    finally:
        await store.close()


class Gate:
    """A tool that answers once the test opens the gate."""

    def __init__(self) -> None:
        self.open = asyncio.Event()

    async def __call__(self, ctx: ToolContext) -> str:
        """Wait for the test to open the gate."""
        await self.open.wait()
        return "done"

    def app(self, store: Any) -> Runtime:
        spec = AgentSpec(id="gated", model="m", tools=["gated"], max_rounds=3)
        model = ScriptedModel([Turn.tool("gated"), Turn.text("finished")], loop=True, position="conversation")
        return Runtime(store, agents=[spec], tools=[tool(self.__call__, name="gated")], models={"m": model})


async def test_a_fenced_run_writes_nothing_more_when_its_tool_returns(nats_server: EmbeddedNatsServer) -> None:
    """What a stopping worker does before it hands a command back: fence the run. Its loop goes
    on (the tool answers) and ends without writing; another process resumes it from the log."""
    gate = Gate()
    store = await JetStreamEventStore.connect(nats_server.url)
    try:
        async with asyncio.timeout(TIMEOUT):
            stopping = gate.app(store)
            handle = await stopping.start("gated", "go", thread_id="tf")
            started = await until(store, "tf", ToolCallStarted)
            stopping.fence_runs()
            gate.open.set()
            with pytest.raises(asyncio.CancelledError):
                await handle.result()
            assert await store.thread_version("tf") == started.seq, "the fenced run wrote"
            resumed = await gate.app(store).resume(handle.run_id, thread_id="tf")
            assert resumed is not None
            await finished_once(store, "tf", handle.run_id)
    finally:
        await store.close()
