"""A start no worker takes in time is answered as refused AND never runs; a start the answer
reports as accepted does run; a client's retry of a start runs it once (`agentlog.runtime.workers.claims`,
`QueueDispatcher.start_run`, `agentlog.client`'s `runs.create`).

Against what users run (tests/support/topology.py), with tests/apps/serve_app.py (its `held`
agent holds in `hold` until its thread is released by a file) and a gateway that waits 3 s for a worker
(`AGENTLOG_DISPATCH_TIMEOUT`). "No worker takes it": in `serve`, its one worker (`--concurrency
1`) busy with a held run; in `gateway` + `worker`, the worker stopped. Its commands of a thread
are taken in order, so once a worker is back, a start sent then runs only after every earlier
start of its thread was handled: if a withdrawn one ran, it shows in the log by then.

The race a gateway can lose (a worker takes the start just as the gateway gives up) is played
in process, on a real nats-server: the answer is then "accepted, queued", and the run runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest

from agentlog.client import Conflict, Unavailable, get_client
from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import RunFinished, RunStarted
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.gateway.operations.dispatch import QueueDispatcher
from agentlog.gateway.operations.operations import accepted
from agentlog.runtime import AgentSpec, RunRequest, Runtime
from agentlog.runtime.models import ScriptedModel
from agentlog.runtime.workers.claims import StartClaims, Withdrawal
from agentlog.runtime.workers.worker import Worker

from tests.support.http_stack import uid
from tests.support.topology import TOPOLOGIES, Deployment, deploy

TIMEOUT = 120


@pytest.fixture(scope="module", params=TOPOLOGIES)
def starts(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    hold = tmp_path_factory.mktemp("hold")
    args = ["--concurrency", "1"] if request.param == "serve" else []
    with deploy(request.param, tmp_path_factory.mktemp(f"starts-{request.param}"), app="tests.apps.serve_app:app",
                env={"SERVE_APP_HOLD_DIR": str(hold), "AGENTLOG_DISPATCH_TIMEOUT": "3"}, args=args) as d:
        yield d


def release(d: Deployment, thread: str) -> None:
    """Every run of `thread` finishes its `hold` at once."""
    (Path(d.env["SERVE_APP_HOLD_DIR"]) / thread).write_text("")


@contextlib.asynccontextmanager
async def no_worker(d: Deployment, http: aiohttp.ClientSession) -> AsyncIterator[None]:
    """No worker takes a new command inside: `serve`'s one worker slot is held by a run (cancelled
    on the way out), or the worker process is stopped (started again on the way out)."""
    if d.kind == "split":
        await asyncio.to_thread(d.stop, "worker-0")
        try:
            yield
        finally:
            await asyncio.to_thread(d.start, "worker-0")
        return
    async with http.post("/v1/runs", json={"agent_id": "held", "messages": "hold the slot"}) as resp:
        assert resp.status == 202, await resp.text()
        holder = (await resp.json())["run_id"]
    async with get_client(d.http_url) as client:  # held in `hold`: its worker slot is taken
        async with contextlib.aclosing(client.runs.stream(holder)) as events:
            async for event in events:
                if event.type == "ToolCallStarted":
                    break
    try:
        yield
    finally:
        async with http.post(f"/v1/runs/{holder}/cancel", json={}) as resp:
            assert resp.status == 202, await resp.text()


async def runs_of(d: Deployment, thread: str) -> list[str]:
    store = await JetStreamEventStore.connect(d.nats_url)
    try:
        return [e.run_id async for sc in store.read_thread(thread) for e in sc.commit.events if type(e) is RunStarted]
    finally:
        await store.close()


async def test_a_start_no_worker_takes_is_refused_and_never_runs(starts: Deployment) -> None:
    """Three starts with no worker to take them: each a 503 `dispatch_timeout` naming its run
    (Retry-After), withdrawn. Once a worker is back, none of them runs; a start sent then does."""
    d = starts
    thread = uid("t")
    release(d, thread)
    body = {"agent_id": "held", "messages": "go", "thread_id": thread}
    async with asyncio.timeout(TIMEOUT), aiohttp.ClientSession(d.http_url) as http:
        async with no_worker(d, http):
            async def attempt() -> tuple[int, dict[str, Any], str | None]:
                async with http.post("/v1/runs", json=body) as resp:
                    return resp.status, await resp.json(), resp.headers.get("Retry-After")

            answers = await asyncio.gather(attempt(), attempt(), attempt())
        for status, answer, retry_after in answers:
            assert (status, answer["code"], retry_after) == (503, "dispatch_timeout", "1"), answer
            assert "will not run" in answer["error"], answer
        refused = {answer["run_id"] for _, answer, _ in answers}
        assert len(refused) == 3
        async with get_client(d.http_url) as client:
            later = await client.runs.create("held", "go", thread_id=thread)
            assert (await client.runs.wait(later["run_id"], timeout=TIMEOUT))["status"] == "done"
    assert await runs_of(d, thread) == [later["run_id"]], d.outputs()


async def test_the_clients_create_is_idempotent(starts: Deployment) -> None:
    """`runs.create` chooses the run id: a refused start names it, and creating with it again
    runs the run once; a start sent again once it ran is `duplicate: true`; the same run id for
    another start is a 409 naming it."""
    d = starts
    thread = uid("t")
    release(d, thread)
    async with asyncio.timeout(TIMEOUT), aiohttp.ClientSession(d.http_url) as http, get_client(d.http_url) as client:
        async with no_worker(d, http):
            with pytest.raises(Unavailable) as refused:
                await client.runs.create("held", "go", thread_id=thread, retries=0)
        run_id = refused.value.run_id
        assert refused.value.code == "dispatch_timeout" and run_id, refused.value
        first = await client.runs.create("held", "go", thread_id=thread, run_id=run_id)
        assert first["run_id"] == run_id and not first.get("duplicate"), first
        again = await client.runs.create("held", "go", thread_id=thread, run_id=run_id)
        assert again == {**first, "duplicate": True}
        with pytest.raises(Conflict) as other:
            await client.runs.create("held", "something else", thread_id=thread, run_id=run_id)
        assert other.value.code == "run_conflict" and other.value.run_id == run_id
        assert (await client.runs.wait(run_id, timeout=TIMEOUT))["status"] == "done"
    assert await runs_of(d, thread) == [run_id]


async def test_errors_about_a_run_name_it(starts: Deployment) -> None:
    """HTTP and the NATS API answer an error about a run with its id as a field (a malformed id
    names no run)."""
    d, unknown = starts, uid("r")
    decision = {"target_id": "c1", "decision_id": "d1", "action": "resume", "result": {"approved": True}}
    async with asyncio.timeout(TIMEOUT), aiohttp.ClientSession(d.http_url) as http:
        for method, path, body in (("GET", f"/v1/runs/{unknown}", None), ("GET", f"/v1/runs/{unknown}/events", None),
                                   ("POST", f"/v1/runs/{unknown}/cancel", {}),
                                   ("POST", f"/v1/runs/{unknown}/inputs", {"decisions": [decision]})):
            async with http.request(method, path, json=body) as resp:
                answer = await resp.json()
            assert (resp.status, answer["code"], answer.get("run_id")) == (404, "run_not_found", unknown), (path, answer)
        async with http.post("/v1/runs/bad!id/cancel", json={}) as resp:
            answer = await resp.json()
        assert resp.status == 400 and "run_id" not in answer, answer
        nc = await nats.connect(d.nats_url)
        try:
            for op, body in (("runs.cancel", {"run_id": unknown}), ("runs.inputs", {"run_id": unknown,
                                                                                   "decisions": [decision]})):
                msg = await nc.request(f"agentlog.api.{op}", json.dumps(body).encode(), timeout=10)
                answer = json.loads(msg.data)
                assert (msg.headers or {}).get("Nats-Service-Error-Code") == "404", answer
                assert answer["run_id"] == unknown, answer
        finally:
            await nc.close()


class WorkerWinsTheRace(StartClaims):
    """A worker takes the offer just as the gateway gives up on it (what `withdraw` then meets)."""

    async def withdraw(self, run_id: str, command_id: str, revision: int) -> Withdrawal:
        assert await self.take(run_id, command_id)
        return await super().withdraw(run_id, command_id, revision)


async def test_a_start_a_worker_took_is_answered_queued_and_runs(nats_server: EmbeddedNatsServer) -> None:
    store = await JetStreamEventStore.connect(nats_server.url)
    worker = None
    try:
        async with asyncio.timeout(TIMEOUT):
            gateway = QueueDispatcher(store.nc, store, timeout=0.2)
            gateway.claims = WorkerWinsTheRace(gateway.client.js)
            answer = await gateway.start_run(RunRequest(agent_id="a", messages="hi", thread_id="t-raced", run_id="r-raced"))
            assert answer.queued and not answer.duplicate
            assert accepted(answer) == {"thread_id": "t-raced", "run_id": "r-raced", "seq": 0, "status": "queued"}
            # the client's retry: the start is taken, so it is answered from it, nothing new queued
            retried = await gateway.start_run(RunRequest(agent_id="a", messages="hi", thread_id="t-raced", run_id="r-raced"))
            assert retried.queued and retried.duplicate
            rt = Runtime(store, agents=[AgentSpec(id="a", model=ScriptedModel(["hello"]))])
            worker = Worker(store, runtime=rt, concurrency=1)
            await worker.start()
            async with contextlib.aclosing(store.follow("t-raced")) as commits:
                async for sc in commits:
                    if any(type(e) is RunFinished for e in sc.commit.events):
                        break
            events = [e async for sc in store.read_run("r-raced") for e in sc.commit.events]
            assert sum(type(e) is RunStarted for e in events) == 1
            assert worker.stats["withdrawn"] == 0
    finally:
        if worker is not None:
            await worker.stop()
        await store.close()

