"""Fixtures of the adapter route tests (no tests here): the real stack (nats-server, JetStream
store, KV views + runner, an in-process Runtime behind the Dispatcher with live deltas on core
NATS, the aiohttp app with the adapter routes, the NATS adapter service) and one `Transport`
interface over HTTP and NATS so every scenario runs on both."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import nats
from aiohttp.test_utils import TestClient, TestServer

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.gateway.adapters import nats_routes, routes
from agentlog.gateway.adapters.session import Backend
from agentlog.gateway.http import Settings, create_app
from agentlog.projections.kv import KVViewStore
from agentlog.projections.runner import ProjectionRunner
from agentlog.runtime import AgentSpec, NatsLiveSink, Runtime
from agentlog.runtime.models import ScriptedModel

from tests.support.adapters import ALL_TOOLS
from tests.support.http_stack import stop_runner
from tests.support.inprocess import InProcessDispatcher
from tests.support.protocol_verify.agui import parse_sse
from tests.support.protocol_verify.aisdk import parse_ui_sse

TIMEOUT = 30
#: The backend tools. Frontend tools are not declared here: AG-UI requests list them (`tools`),
#: and the run records them (`RunStarted.frontend_tools`).
TOOLS = list(ALL_TOOLS)


@dataclass
class Stack:
    client: TestClient
    store: JetStreamEventStore
    runtime: Runtime
    nc: Any  # a separate client connection for NATS requests

    async def last_seq(self) -> int:
        return await self.store.last_seq()

    async def events_of(self, thread_id: str) -> list[Any]:
        return [e async for sc in self.store.read_thread(thread_id) for e in sc.commit.events]


@contextlib.asynccontextmanager
async def open_stack(server: EmbeddedNatsServer, turns: list[Any], *, mode: str = "sequential",
                     plugins: tuple[Any, ...] = (), tools: list[Any] | None = None,
                     tokens: str = "", agents: list[AgentSpec] | None = None) -> AsyncIterator[Stack]:
    """`tools`: the backend tools (default `TOOLS`); `tokens`: the API tokens of HTTP and the
    adapters' NATS subjects (`AGENTLOG_TOKENS` syntax, "" = no auth); `agents`: instead of the
    one scripted agent `agent` built from `turns`/`mode`/`plugins`."""
    tools = TOOLS if tools is None else tools
    store = await JetStreamEventStore.connect(server.url, request_timeout=5.0, connect_timeout=5.0)
    views = await KVViewStore.open(store.nc)
    runner = ProjectionRunner(store.nc, views, fetch_timeout=0.2)
    await runner.start()
    live = NatsLiveSink(store.nc)
    live.start()
    if agents is None:
        agents = [AgentSpec(id="agent", model=ScriptedModel(turns, chunk_words=2), tools=[t.name for t in tools],
                            tool_execution_mode=mode, plugins=list(plugins))]
    rt = Runtime(store, agents=agents, tools=tools, live=live)
    dispatcher = InProcessDispatcher(rt)
    app = create_app(store, views, runner, auth_tokens=tokens, dispatcher=dispatcher, extra_routes=routes.ROUTES,
                     settings=Settings(read_wait=5.0, sse_heartbeat=5.0))
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    service = nats_routes.AdapterService(store.nc, Backend(store, dispatcher, store.nc), default_agent="agent",
                                         auth_tokens=tokens)
    await service.start()
    nc = await nats.connect(server.url)
    try:
        yield Stack(client, store, rt, nc)
    finally:
        await nc.close()
        await service.stop()
        await client.close()
        await rt.aclose()
        await live.close()
        await stop_runner(runner)
        with contextlib.suppress(ConnectionError):
            await store.close()


@dataclass
class Deployed:
    """A running deployment (tests/support/topology.py) as the transports see a `Stack`: an HTTP client
    on its gateway (relative paths), its log, a NATS connection for adapter requests."""

    client: aiohttp.ClientSession
    store: JetStreamEventStore
    nc: Any
    base: str  # the gateway's URL

    async def last_seq(self) -> int:
        return await self.store.last_seq()

    async def events_of(self, thread_id: str) -> list[Any]:
        return [e async for sc in self.store.read_thread(thread_id) for e in sc.commit.events]

    async def run_of(self, thread_id: str) -> str:
        """The thread's last run (an AG-UI run id is the client's, not the log's)."""
        runs = [sc.commit.run_id async for sc in self.store.read_thread(thread_id) if sc.commit.run_id]
        return runs[-1]


@contextlib.asynccontextmanager
async def open_deployed(deployment: Any) -> AsyncIterator[Deployed]:
    store = await JetStreamEventStore.connect(deployment.nats_url, request_timeout=5.0, connect_timeout=5.0)
    nc = await nats.connect(deployment.nats_url)
    client = aiohttp.ClientSession(deployment.http_url, timeout=aiohttp.ClientTimeout(total=TIMEOUT))
    try:
        yield Deployed(client, store, nc, deployment.http_url)
    finally:
        await client.close()
        await nc.close()
        with contextlib.suppress(ConnectionError):
            await store.close()


@dataclass
class Answer:
    """What a client received: the events/parts, whether the body was rejected before any
    stream (HTTP 400 JSON / NATS exactly one error event), and for AI SDK whether it ended
    with `[DONE]` (HTTP) or the end marker (NATS)."""

    events: list[dict[str, Any]]
    rejected: dict[str, Any] | None = None
    done: bool = True


class Transport:
    name = "?"

    async def agui(self, stack: Stack, body: Any, agent: str = "agent") -> Answer:
        raise NotImplementedError

    async def aisdk(self, stack: Stack, body: Any, agent: str = "agent") -> Answer:
        raise NotImplementedError


class Http(Transport):
    name = "http"

    async def _post(self, stack: Stack | Deployed, path: str, body: Any) -> tuple[int, dict[str, str], str]:
        async with asyncio.timeout(TIMEOUT):
            resp = await stack.client.post(path, data=json.dumps(body))
            return resp.status, dict(resp.headers), await resp.text()

    async def agui(self, stack: Stack, body: Any, agent: str = "agent") -> Answer:
        status, headers, text = await self._post(stack, f"/v1/ag-ui/agents/{agent}/runs", body)
        if status != 200:
            return Answer([], json.loads(text) | {"status": status})
        assert headers["Content-Type"].startswith("text/event-stream")
        return Answer(parse_sse(text))

    async def aisdk(self, stack: Stack, body: Any, agent: str = "agent") -> Answer:
        status, headers, text = await self._post(stack, f"/v1/ai-sdk/agents/{agent}/runs", body)
        if status != 200:
            return Answer([], json.loads(text) | {"status": status})
        assert headers["x-vercel-ai-ui-message-stream"] == "v1"
        parts, done = parse_ui_sse(text)
        return Answer(parts, done=done)


async def nats_request(stack: Stack, subject: str, body: Any, agent: str = "agent",
                       token: str | None = None) -> list[Any]:
    """One adapter request over NATS: the reply messages up to (without) the empty end marker."""
    inbox = stack.nc.new_inbox()
    sub = await stack.nc.subscribe(inbox)
    out: list[Any] = []
    headers = {nats_routes.AGENT_HEADER: agent} | ({"Authorization": f"Bearer {token}"} if token else {})
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()  # bytes: sent as they are
        await stack.nc.publish(subject, data, reply=inbox, headers=headers)
        async with asyncio.timeout(TIMEOUT):
            async for msg in sub.messages:
                if not msg.data:
                    break
                out.append(msg)
    finally:
        await sub.unsubscribe()
    return out


class Nats(Transport):
    name = "nats"

    async def _request(self, stack: Stack, subject: str, body: Any, agent: str) -> list[dict[str, Any]]:
        return [json.loads(m.data) for m in await nats_request(stack, subject, body, agent)]

    @staticmethod
    def _answer(events: list[dict[str, Any]], error_type: str) -> Answer:
        if len(events) == 1 and events[0]["type"] == error_type:
            return Answer(events, rejected=events[0])
        return Answer(events)

    async def agui(self, stack: Stack, body: Any, agent: str = "agent") -> Answer:
        return self._answer(await self._request(stack, nats_routes.AGUI_SUBJECT, body, agent), "RUN_ERROR")

    async def aisdk(self, stack: Stack, body: Any, agent: str = "agent") -> Answer:
        return self._answer(await self._request(stack, nats_routes.AISDK_SUBJECT, body, agent), "error")


TRANSPORTS = [Http(), Nats()]

__all__ = ["Answer", "Deployed", "Http", "Nats", "nats_request", "open_deployed", "Stack", "TIMEOUT", "TRANSPORTS", "Transport", "open_stack"]
