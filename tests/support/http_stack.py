"""Shared fixtures and helpers of the HTTP tests (no tests here).

`api(...)` builds the real stack: a JetStream store on the test's own nats-server, KV views, a
running ProjectionRunner, the aiohttp app on a real loopback server and an aiohttp client.

`remote` is an `Api`-like client of what users run (`agentlog serve`, and `agentlog gateway` +
`agentlog worker`, tests/support/topology.py; one deployment per topology shared by the session, see
`protocol_deployment` in conftest.py, so tests use their own ids): HTTP on its gateway, and the
log on its nats-server for raw appends and checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient, TestServer

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import (
    Commit,
    Message,
    MessageAppended,
    RunFinished,
    RunStarted,
    RunSuspended,
    StatePatched,
    StepStarted,
    SuspendTicket,
    Termination,
    ThreadCreated,
    ToolCallStarted,
    ToolCallSuspended,
)
from agentlog.eventlog.ids import new_id, now_ms
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.gateway.http import Settings, create_app
from agentlog.projections.kv import KVViewStore
from agentlog.projections.runner import ProjectionRunner

from tests.support.topology import Deployment

TIMEOUT = 60


@dataclass
class Api:
    client: TestClient
    store: JetStreamEventStore
    views: KVViewStore
    runner: ProjectionRunner
    server: EmbeddedNatsServer

    async def append(self, thread_id: str, run_id: str | None, events: list[Any]) -> int:
        version = await self.store.thread_version(thread_id)
        commit = Commit(commit_id=new_id(), thread_id=thread_id, run_id=run_id, ts=now_ms(), events=events)
        return (await self.store.append(commit, expected_version=version)).seq

    async def synced(self, seq: int) -> None:
        await self.runner.wait_for(seq, timeout=10)


@contextlib.asynccontextmanager
async def open_api(server: EmbeddedNatsServer, *, tokens: str = "", settings: Settings | None = None,
                   ) -> AsyncIterator[Api]:
    store = await JetStreamEventStore.connect(server.url, request_timeout=5.0, connect_timeout=5.0)
    views = await KVViewStore.open(store.nc)
    runner = ProjectionRunner(store.nc, views, fetch_timeout=0.2)
    await runner.start()
    app = create_app(store, views, runner, auth_tokens=tokens,
                     settings=settings or Settings(read_wait=5.0, sse_heartbeat=0.2))
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        yield Api(client, store, views, runner, server)
    finally:
        await client.close()
        await stop_runner(runner)
        # nats-py may raise "connection lost" while flushing on close after a server restart.
        with contextlib.suppress(ConnectionError):
            await store.close()


@dataclass
class Remote:
    """A deployment seen like `Api`: `client` takes paths relative to its gateway."""

    client: aiohttp.ClientSession
    store: JetStreamEventStore
    url: str = ""  # the gateway's

    async def append(self, thread_id: str, run_id: str | None, events: list[Any]) -> int:
        version = await self.store.thread_version(thread_id)
        commit = Commit(commit_id=new_id(), thread_id=thread_id, run_id=run_id, ts=now_ms(), events=events)
        return (await self.store.append(commit, expected_version=version)).seq


@contextlib.asynccontextmanager
async def open_remote(deployment: Deployment) -> AsyncIterator[Remote]:
    store = await JetStreamEventStore.connect(deployment.nats_url, request_timeout=5.0, connect_timeout=5.0)
    client = aiohttp.ClientSession(deployment.http_url, timeout=aiohttp.ClientTimeout(total=TIMEOUT))
    try:
        yield Remote(client, store, deployment.http_url.rstrip("/"))
    finally:
        await client.close()
        with contextlib.suppress(ConnectionError):
            await store.close()


@pytest.fixture
async def remote(protocol_deployment: Deployment) -> AsyncIterator[Remote]:
    """A client of the shared deployment of tests/apps/protocol_app.py (`protocol_deployment` in
    conftest.py: `agentlog serve`, and `agentlog gateway` + `agentlog worker`)."""
    async with open_remote(protocol_deployment) as value:
        yield value


def uid(prefix: str = "x") -> str:
    """A fresh id: tests sharing one deployment never meet each other's threads and runs."""
    return f"{prefix}{new_id()[-12:]}"


async def stop_runner(runner: ProjectionRunner) -> None:
    """`runner.stop()`, robust to a lost cancel: nats-py's fetch (`next_msg` over `wait_for`)
    can swallow a cancellation that races a fetch timeout on Python 3.11, leaving the runner
    looping; cancelling again until the task is done ends it. (Reported to the projections
    owner; remove once `ProjectionRunner.stop` does this itself.)"""
    task = runner._task
    while task is not None and not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
    await runner.stop()


@pytest.fixture
async def api(nats_server: EmbeddedNatsServer) -> AsyncIterator[Api]:
    async with open_api(nats_server) as value:
        yield value


async def body(resp: ClientResponse, status: int) -> Any:
    data = await resp.json()
    assert resp.status == status, data
    return data


async def error(resp: ClientResponse, status: int, code: str | None = None) -> dict[str, Any]:
    data = await body(resp, status)
    assert set(data) >= {"error", "code"}, data
    if code is not None:
        assert data["code"] == code, data
    return data


@dataclass
class SseEvent:
    id: str | None
    event: str | None
    data: Any


async def sse_events(resp: ClientResponse, count: int | None = None, *, comments: list[str] | None = None
                     ) -> list[SseEvent]:
    """Parse SSE frames until `count` events (or the end of the stream)."""
    events: list[SseEvent] = []
    fields: dict[str, str] = {}
    while count is None or len(events) < count:
        raw = await resp.content.readline()
        if not raw:
            break
        line = raw.decode().rstrip("\n")
        if line.startswith(":"):
            if comments is not None:
                comments.append(line)
            continue
        if line == "":
            if fields:
                events.append(SseEvent(fields.get("id"), fields.get("event"), json.loads(fields.get("data", "null"))))
                fields = {}
            continue
        name, _, value = line.partition(":")
        fields[name] = value[1:] if value.startswith(" ") else value
    return events


#: The events per commit of `recorded_thread` (finished): positions fall mid-commit too.
RECORDED_SIZES = (1, 3, 2, 1, 2)


async def recorded_thread(api: Api | Remote, thread_id: str = "t1", run_id: str = "r1", *, finish: bool = True,
                          resource_id: str | None = None, agent_id: str = "helper",
                          seqs: list[int] | None = None) -> int:
    """A thread with single- and multi-event commits (so resume points fall mid-commit); the
    last commit's seq, and every commit's in `seqs` when given (on a shared deployment the
    thread's seqs are not 1, 2, 3...: other tests write to the same log)."""
    commits: list[tuple[str | None, list[Any]]] = [
        (None, [ThreadCreated(resource_id=resource_id, metadata={"k": 1})]),
        (run_id, [RunStarted(run_id=run_id, agent_id=agent_id),
                  MessageAppended(message=Message(id=new_id(), role="user", content="hi")),
                  StepStarted(step=1)]),
        (run_id, [MessageAppended(message=Message(id=new_id(), role="assistant", content="thinking",
                                                  visibility="internal")),
                  StatePatched(ops=[{"op": "add", "path": "/count", "value": 1}])]),
        (run_id, [StatePatched(ops=[{"op": "replace", "path": "/count", "value": 2}])]),
    ]
    if finish:
        commits.append((run_id, [MessageAppended(message=Message(id=new_id(), role="assistant", content="done")),
                                 RunFinished(termination=Termination(type="natural_end"))]))
    else:
        commits.append((run_id, [ToolCallStarted(call_id="c1", name="approve_me"),
                                 ToolCallSuspended(call_id="c1", ticket=SuspendTicket(id="tk1")),
                                 RunSuspended(call_ids=["c1"])]))
    out = seqs if seqs is not None else []
    for run, events in commits:
        out.append(await api.append(thread_id, run, events))
    return out[-1]


def event_ids(seqs: list[int], sizes: tuple[int, ...] = RECORDED_SIZES) -> list[str]:
    """The SSE ids (`seq:index`) of commits at `seqs` holding `sizes` events."""
    return [f"{seq}:{i}" for seq, size in zip(seqs, sizes, strict=True) for i in range(size)]


__all__ = ["Api", "RECORDED_SIZES", "Remote", "SseEvent", "TIMEOUT", "api", "body", "error", "event_ids",
           "open_api", "open_remote", "recorded_thread", "remote", "sse_events", "uid"]
