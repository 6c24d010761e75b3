"""The MCP client through what users run: an app whose agents use a real MCP server (tests/apps/mcp_app.py
on tests/fakes/mcp_server.py, official SDK, stdio), deployed as `agentlog serve` and as `agentlog
gateway` + `agentlog worker`. An agent calls an MCP tool, reads a resource and gets a prompt in a
run; a tool that changes the server's tool list (`unlock`, the server says so) makes the new tool
usable by the next run, with no restart and no explicit refresh. Driven over HTTP with
`agentlog.client`; `runs.wait` follows the log.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentlog.client import ApiError, SyncClient, get_sync_client

from tests.support.topology import TOPOLOGIES, Deployment, deploy

WAIT = 90


@pytest.fixture(scope="module", params=TOPOLOGIES)
def mcp_deployment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    where: Path = tmp_path_factory.mktemp(f"mcp-{request.param}")
    with deploy(request.param, where, app="tests.apps.mcp_app:app") as running:
        yield running


@pytest.fixture
def client(mcp_deployment: Deployment) -> Iterator[SyncClient]:
    with get_sync_client(mcp_deployment.http_url) as value:
        yield value


def run(client: SyncClient, agent: str, message: str = "go") -> dict[str, Any]:
    started = client.runs.create(agent, message)
    return client.runs.wait(started["run_id"], min_seq=started["seq"], timeout=WAIT)


def results(view: dict[str, Any]) -> dict[str, Any]:
    return {call["name"]: call["result"] for call in view["calls"].values()}


def test_mcp_tool_resource_and_prompt_in_a_deployed_run(client: SyncClient, mcp_deployment: Deployment) -> None:
    done = run(client, "mcp-user")
    assert done["status"] == "done" and done["termination"]["type"] == "natural_end", mcp_deployment.outputs()
    assert results(done) == {
        "mcp__calc__add": {"sum": 5},
        "mcp__calc__read_resource": "1.4.2: faster resume",
        "mcp__calc__get_prompt": [{"role": "user", "text": "Please review a.py."}],
    }, done["calls"]


def test_list_changed_reaches_the_next_run_in_a_deployment(client: SyncClient, mcp_deployment: Deployment) -> None:
    """`late` names a tool the server does not list yet: refused. `unlock` adds it and says so;
    the very next run of `late` calls it."""
    with pytest.raises(ApiError) as refused:
        run(client, "late")
    assert refused.value.status == 400 and refused.value.code == "command_rejected", refused.value
    assert "mcp__calc__later" in refused.value.message, refused.value
    unlocked = run(client, "unlocker")
    assert results(unlocked) == {"mcp__calc__unlock": {"result": "unlocked"}}, unlocked["calls"]
    late = run(client, "late")
    assert late["status"] == "done" and late["termination"]["type"] == "natural_end", mcp_deployment.outputs()
    assert results(late) == {"mcp__calc__later": {"result": "late"}}, late["calls"]
