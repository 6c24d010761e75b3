"""Fixtures of the write-side tests (no tests here): a small scripted app, and the gateway stack
with either dispatcher (in-process runtime, or queue + an in-process `Worker`).

Agents of `write_app(store)`:
- `approver`: calls `deploy` (PermissionPlugin ask -> suspends), then answers "deployed"; loops,
  so every run on a thread plays the script again from the conversation.
- `quick`: answers "hi" at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.gateway.http import Settings, create_app
from agentlog.gateway.http.inspector import REPLAY_APP
from agentlog.gateway.http.write import write_routes
from agentlog.gateway.operations.dispatch import Dispatcher, QueueDispatcher
from agentlog.projections.kv import KVViewStore
from agentlog.projections.runner import ProjectionRunner
from agentlog.runtime import AgentSpec, PermissionPlugin, Runtime, ToolContext, tool
from agentlog.runtime.models.scripted import ScriptedModel, Turn
from agentlog.runtime.workers.worker import Worker

from tests.support.http_stack import Api, stop_runner
from tests.support.inprocess import InProcessDispatcher

AGENTS = ("approver", "quick")


@tool
async def deploy(env: str, ctx: ToolContext) -> str:
    """Deploy to an environment (needs approval)."""
    return f"deployed {env}"


def write_app(store: Any) -> Runtime:
    agents = [
        AgentSpec(id="approver", model="approver", tools=["deploy"], max_rounds=5,
                  plugins=[PermissionPlugin(ask=["deploy"])]),
        AgentSpec(id="quick", model="quick", tools=[], max_rounds=3),
    ]
    models = {
        "approver": ScriptedModel([Turn.tool("deploy", {"env": "prod"}), Turn.text("deployed")], loop=True,
                                  position="conversation"),
        "quick": ScriptedModel([Turn.text("hi")], loop=True, position="conversation"),
    }
    return Runtime(store, agents=agents, tools=[deploy], models=models)


@dataclass
class Stack(Api):
    dispatcher: Dispatcher = None  # type: ignore[assignment]
    runtime: Runtime | None = None
    worker: Worker | None = None
    mode: str = "inprocess"


@contextlib.asynccontextmanager
async def open_stack(server: EmbeddedNatsServer, mode: str = "inprocess", *, tokens: str = "",
                     timeout: float = 10.0, more_routes: Any = None,
                     make_app: Callable[[Any], Runtime] | None = None,
                     agents: tuple[str, ...] = AGENTS, request_timeout: float = 5.0) -> AsyncIterator[Stack]:
    """The whole gateway on one connection: store, views, runner, dispatcher (+ worker), app
    (`make_app(store)` builds the runtime; `write_app` by default). `more_routes(dispatcher,
    runtime)`: extra routes (e.g. the A2A server)."""
    store = await JetStreamEventStore.connect(server.url, request_timeout=request_timeout, connect_timeout=5.0)
    views = await KVViewStore.open(store.nc)
    runner = ProjectionRunner(store.nc, views, fetch_timeout=0.2)
    await runner.start()
    runtime = (make_app or write_app)(store)
    worker: Worker | None = None
    dispatcher: Dispatcher
    if mode == "inprocess":
        dispatcher = InProcessDispatcher(runtime)
    else:
        worker = Worker(store, runtime=runtime, ack_wait=5.0, fetch_timeout=0.2, shutdown_timeout=2.0)
        await worker.start()
        dispatcher = QueueDispatcher(store.nc, store, agents=agents, timeout=timeout)
    # the adapters' routes and verified replay use the runtime in this process in both modes
    app = create_app(store, views, runner, auth_tokens=tokens, dispatcher=InProcessDispatcher(runtime),
                     extra_routes=[*write_routes(dispatcher), *(more_routes(dispatcher, runtime) if more_routes else ())],
                     settings=Settings(read_wait=5.0, sse_heartbeat=0.2, max_body=64 * 1024))
    app[REPLAY_APP] = runtime
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        yield Stack(client, store, views, runner, server, dispatcher=dispatcher, runtime=runtime,
                    worker=worker, mode=mode)
    finally:
        await client.close()
        if worker is not None:
            await worker.stop(timeout=2.0)
        with contextlib.suppress(Exception):
            await runtime.aclose()
        await stop_runner(runner)
        with contextlib.suppress(ConnectionError):
            await store.close()


async def last_seq(store: JetStreamEventStore) -> int:
    return await store.last_seq()


def suspended_call(run: dict[str, Any]) -> str:
    """The one suspended call of a run view (JSON)."""
    calls = [cid for cid, call in run["calls"].items() if call["status"] == "suspended"]
    assert len(calls) == 1, run["calls"]
    return calls[0]


__all__ = ["AGENTS", "Stack", "last_seq", "open_stack", "suspended_call", "write_app"]
