"""`--app X` works for `serve`, `gateway` and `worker` whatever form X has (an App, agents alone
as a list or an AgentRegistry, a Runtime, or a factory returning any of them). The gateway lists
the app's agent ids to refuse unknown agents before queueing, so it must find them in every form:
`agentlog gateway --app <a Runtime>` that iterated the Runtime's registry would crash with
"'AgentRegistry' object is not iterable"."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from agentlog.cli.assembly import Server, ServerConfig
from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.gateway.operations.connection import ConnectionOptions

from tests.apps.app_forms import FORMS
from tests.support.steps import within

#: Per step (a start, a stop, a request, a stream): a failure names the step that hung.
STEP = 30


async def _run_finishes(http_url: str, where: str) -> None:
    """Start an `echo` run over HTTP and follow its SSE stream to its natural end."""
    async with aiohttp.ClientSession(http_url) as http:
        async with within(f"{where}: POST /v1/runs", STEP):
            async with http.post("/v1/runs", json={"agent_id": "echo", "messages": "hi"}) as r:
                assert r.status == 202, await r.text()
                run_id = (await r.json())["run_id"]
        async with within(f"{where}: GET /v1/runs/{run_id}/events?follow=true to the run's end", STEP):
            async with http.get(f"/v1/runs/{run_id}/events", params={"follow": "true"}) as events:
                frames = (await events.read()).decode()  # the stream ends when the run finishes
    assert "event: RunFinished" in frames and '"natural_end"' in frames, frames


@contextlib.asynccontextmanager
async def _served(config: ServerConfig) -> AsyncIterator[Server]:
    """`cli.assembly.serve`, its start and its stop each a step of their own."""
    server = Server(config)
    try:
        async with within(f"starting the {config.role}", STEP):
            await server.start()
        yield server
    finally:
        async with within(f"stopping the {config.role}", STEP):
            await server.stop()


@pytest.mark.parametrize("form", FORMS)
async def test_every_app_form_for_every_command(form: str, tmp_path: Path, nats_server: EmbeddedNatsServer) -> None:
    """Each form loads in each role, and a run started through it runs to its end: in `serve`,
    and through a `gateway` to a `worker` (both given the same form)."""
    connection = ConnectionOptions(nats_url=nats_server.url)

    def config(role: str) -> ServerConfig:
        return ServerConfig(role=role, app_spec=f"tests.apps.app_forms:{form}", port=0, tokens="",  # type: ignore[arg-type]
                            connection=connection, nats_service=False)

    async with _served(config("serve")) as server:
        assert "echo" in server.runtime.agents and "nobody" not in server.runtime.agents
        await _run_finishes(server.http_url, "serve")
    async with _served(config("worker")) as worker, _served(config("gateway")) as gateway:
        assert "echo" in worker.runtime.agents and "nobody" not in worker.runtime.agents
        assert gateway.dispatcher.agents == {"echo"}
        await _run_finishes(gateway.http_url, "gateway + worker")
