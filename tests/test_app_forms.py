"""Issue #12 item 9: `--app X` works for `serve`, `gateway` and `worker` whatever form X has (an
App, agents alone as a list or an AgentRegistry, a Runtime, or a factory returning any of them).
`agentlog gateway --app <a Runtime>` used to crash with "'AgentRegistry' object is not iterable"
(the gateway lists the app's agent ids to refuse unknown agents before queueing)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentlog.api.connection import ConnectionOptions
from agentlog.cli.server import ServerConfig, serve
from agentlog.log.server import EmbeddedNatsServer
from tests.app_forms import FORMS


@pytest.mark.parametrize("form", FORMS)
async def test_every_app_form_for_every_command(form: str, tmp_path: Path, nats_server: EmbeddedNatsServer) -> None:
    connection = ConnectionOptions(nats_url=nats_server.url)
    async with asyncio.timeout(60):
        for role in ("gateway", "serve", "worker"):
            config = ServerConfig(role=role, app_spec=f"tests.app_forms:{form}", port=0, tokens="",
                                  connection=connection, nats_service=False)  # type: ignore[arg-type]
            async with serve(config) as server:
                if role == "gateway":
                    assert server.dispatcher.agents == {"echo"}, role
                else:
                    assert "echo" in server.runtime.agents and "nobody" not in server.runtime.agents, role
