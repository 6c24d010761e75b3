"""Stacks for the bad-input tests (tests/gateway/test_input_*.py), and helpers that send raw bytes over
every JSON route: HTTP, the NATS micro service and the adapters' NATS subjects.

- `open_deployed(deployment)`: what users run (tests/support/topology.py: `agentlog serve`, or `agentlog
  gateway` + `agentlog worker`), with tests/apps/protocol_app.py (its `sequential` agent waits for
  approval of `echo`); for everything a client can send.
- `open_stack(url, mode)`: the same server assembly in this process (`serve`, or `gateway` +
  `worker` parts), with the demo app (its run suspends for approval of `deploy`); only for the
  checks that call the dispatcher's Python API directly."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from agentlog.cli.assembly import Server, ServerConfig, serve
from agentlog.cli.demo import DEMO_AGENT
from agentlog.eventlog.events import RunSuspended
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.gateway.operations.connection import ConnectionOptions
from agentlog.runtime.workers.commands import COMMANDS_STREAM, ensure_commands_stream

from tests.support.adapters_routes import Nats

TIMEOUT = 30.0
AGENT = DEMO_AGENT
#: protocol_app's agent that asks before `echo`, and the message that makes it call `echo`.
DEPLOYED_AGENT, DEPLOYED_ASK = "sequential", "approval: ship it"


@dataclass
class Stack:
    front: Server | None  # in process: the server with HTTP + NATS service (serve or gateway)
    http: aiohttp.ClientSession
    mode: str
    agent: str = AGENT
    ask: str = "ship it"  # a message that makes `agent` wait for an approval
    log: JetStreamEventStore | None = None  # deployed: a connection to the deployment's log

    @property
    def store(self) -> Any:
        if self.log is not None:
            return self.log
        assert self.front is not None
        return self.front.store

    @property
    def nc(self) -> Any:
        return self.store.nc


@contextlib.asynccontextmanager
async def open_deployed(deployment: Any) -> AsyncIterator[Stack]:
    """A client of a running deployment (tests/support/topology.py) of tests/apps/protocol_app.py."""
    log = await JetStreamEventStore.connect(deployment.nats_url, request_timeout=5.0, connect_timeout=5.0)
    try:
        async with aiohttp.ClientSession(deployment.http_url) as http:
            yield Stack(None, http, deployment.kind, agent=DEPLOYED_AGENT, ask=DEPLOYED_ASK, log=log)
    finally:
        with contextlib.suppress(ConnectionError):
            await log.close()


@contextlib.asynccontextmanager
async def open_stack(nats_url: str, mode: str = "serve", tokens: str = "", **config: Any) -> AsyncIterator[Stack]:
    connection = ConnectionOptions(nats_url=nats_url)

    def cfg(role: str) -> ServerConfig:
        return ServerConfig(role=role, app_spec="agentlog.cli.demo:app", port=0, tokens=tokens,  # type: ignore[arg-type]
                            connection=connection, worker_shutdown_timeout=2.0, **config)

    async with contextlib.AsyncExitStack() as stack:
        if mode == "gateway":
            await stack.enter_async_context(serve(cfg("worker")))
        front = await stack.enter_async_context(serve(cfg("gateway" if mode == "gateway" else "serve")))
        http = await stack.enter_async_context(aiohttp.ClientSession(front.http_url))
        yield Stack(front, http, mode)


async def commands_queued(s: Stack) -> int:
    """How many commands were ever queued: the command stream's last sequence. The stream is a work
    queue, so a worker's ack removes a message; its message count can drop while a test watches,
    and only a new command raises this."""
    js = s.nc.jetstream()
    await ensure_commands_stream(js)
    return (await js.stream_info(COMMANDS_STREAM)).state.last_seq


async def waiting_run(s: Stack, headers: dict[str, str] | None = None, **body: Any) -> tuple[str, str, str]:
    """Start a demo run and wait until it suspends: (thread_id, run_id, suspended call id)."""
    async with s.http.post("/v1/runs", json={"agent_id": s.agent, "messages": s.ask, **body},
                           headers=headers or {}) as r:
        assert r.status == 202, await r.text()
        started = await r.json()
    async with asyncio.timeout(TIMEOUT), contextlib.aclosing(s.store.follow(started["thread_id"], 0)) as commits:
        async for sc in commits:
            for e in sc.commit.events:
                if isinstance(e, RunSuspended):
                    return started["thread_id"], started["run_id"], e.call_ids[0]
    raise AssertionError("the run never suspended")


async def http_call(s: Stack, method: str, path: str, data: bytes | None = None,
                    headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    async with s.http.request(method, path, data=data, headers=hdrs) as r:
        return r.status, await r.read()


async def nats_call(s: Stack, subject: str, data: bytes, headers: dict[str, str] | None = None
                    ) -> tuple[str | None, str | None, bytes]:
    """A micro service request: (error code header, error header, body)."""
    msg = await s.nc.request(subject, data, timeout=TIMEOUT, headers=headers)
    h = msg.headers or {}
    return h.get("Nats-Service-Error-Code"), h.get("Nats-Service-Error"), msg.data


async def adapter_call(s: Stack, subject: str, data: bytes, agent: str | None = None) -> list[dict[str, Any]]:
    """An adapter request over NATS: every event streamed back until the end marker."""
    return await Nats()._request(s, subject, data, agent or s.agent)  # type: ignore[arg-type]  # noqa: SLF001


__all__ = ["AGENT", "DEPLOYED_AGENT", "Stack", "TIMEOUT", "adapter_call", "http_call", "nats_call", "open_deployed",
           "open_stack", "waiting_run"]


async def codes_of(calls: Sequence[Callable[[], Awaitable[Any]]]) -> list[str]:
    """The typed error code each call ends with ("accepted" when it returns), in order."""
    codes = []
    for call in calls:
        try:
            await call()
            codes.append("accepted")
        except Exception as exc:  # noqa: BLE001 - the code is what is checked
            codes.append(getattr(exc, "code", type(exc).__name__))
    return codes
