"""agentlog's agents as an MCP server, driven by the official `mcp` client against what users run:
`agentlog serve`, and `agentlog gateway` + `agentlog worker` (the shared `protocol_deployment` of
tests/apps/protocol_app.py, whose scenarios are named by the first word of the message), over
streamable HTTP at `/v1/mcp`; and `agentlog mcp --app ...` over stdio.

Both protocol eras of the client are covered where they differ (approvals): the default client
speaks 2026-07-28 (elicitation as `InputRequiredResult` + retry), `mode="legacy"` the initialize
handshake (elicitation as a server request inside the call).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.support.topology import PYTHONPATH, REPO, Deployment, deploy

TIMEOUT = 60


def uid(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


def approve_all(answers: list[str], approve: bool = True) -> Any:
    """An elicitation callback answering every approval, noting each question."""

    async def callback(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        answers.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": approve})

    return callback


async def run_doc(base: str, run_id: str) -> dict[str, Any]:
    """`GET /v1/runs/{id}`: the run as the gateway answers it."""
    async with aiohttp.ClientSession() as http, http.get(f"{base}/v1/runs/{run_id}") as resp:
        assert resp.status == 200, await resp.text()
        doc: dict[str, Any] = await resp.json()
    return doc


@pytest.fixture
def mcp_url(protocol_deployment: Deployment) -> str:
    return f"{protocol_deployment.http_url}/v1/mcp"


@contextlib.asynccontextmanager
async def connect(url: Any, **kw: Any) -> AsyncIterator[Client]:
    """An official client session, bounded (entered and left in the test's own task: the SDK's
    task groups must be)."""
    async with asyncio.timeout(TIMEOUT), Client(url, **kw) as c:
        yield c


async def test_mcp_server_lists_each_agent_as_a_tool(mcp_url: str) -> None:
    async with connect(mcp_url) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert {"open", "sequential", "parallel_batch_approval"} <= set(tools)
        assert tools["open"].input_schema["properties"]["message"]["type"] == "string"


async def test_mcp_server_call_runs_the_agent_and_records_the_run(mcp_url: str,
                                                                   protocol_deployment: Deployment) -> None:
    async with connect(mcp_url) as client:
        result = await client.call_tool("open", {"message": "text: hi"})
        assert not result.is_error, result
        doc = result.structured_content
        assert doc is not None and doc["status"] == "done"
        assert doc["text"] == "Hello from agentlog, streamed live."
        assert result.content[0].text == doc["text"]
        run = await run_doc(protocol_deployment.http_url, doc["run_id"])
        assert run["thread_id"] == doc["thread_id"] and run["status"] == "done"


async def test_mcp_server_continues_a_thread(mcp_url: str) -> None:
    async with connect(mcp_url) as client:
        thread = uid("t")
        first = await client.call_tool("open", {"message": "add: 1 and 2", "thread_id": thread})
        assert first.structured_content["thread_id"] == thread
        assert first.structured_content["text"] == "The sum is three."
        second = await client.call_tool("open", {"message": "text: again", "thread_id": thread})
        assert second.structured_content["thread_id"] == thread
        assert second.structured_content["run_id"] != first.structured_content["run_id"]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_mcp_server_approval_is_an_elicitation(mcp_url: str, mode: str) -> None:
    """The run asks before `echo`: the client is asked (elicitation), its yes is recorded as the
    decision and the run finishes inside the same call, in both protocol eras."""
    asked: list[str] = []
    async with connect(mcp_url, mode=mode, elicitation_callback=approve_all(asked)) as c:
        result = await c.call_tool("sequential", {"message": "approval: deploy it"})
    assert not result.is_error, result
    assert result.structured_content["status"] == "done"
    assert result.structured_content["text"] == "All done."
    assert len(asked) == 1 and "echo" in asked[0]


async def test_mcp_server_denied_elicitation_cancels_the_call(mcp_url: str, protocol_deployment: Deployment
                                                               ) -> None:
    """A "no" is recorded as a denial: the call is not executed, the run goes on without it."""
    asked: list[str] = []
    async with connect(mcp_url, elicitation_callback=approve_all(asked, False)) as c:
        result = await c.call_tool("sequential", {"message": "approval: deploy it"})
    assert result.structured_content["status"] == "done", result
    assert len(asked) == 1
    run = await run_doc(protocol_deployment.http_url, result.structured_content["run_id"])
    (call,) = run["calls"].values()
    assert call["ticket"]["parameters"]["tool"] == "echo"
    assert call["status"] == "cancelled", call


async def test_mcp_server_without_elicitation_returns_pending_run_id(mcp_url: str) -> None:
    """A client without elicitation gets a pending result carrying the run id; answering it
    (same tool, run_id + approve) finishes the run."""
    async with connect(mcp_url) as client:
        pending = await client.call_tool("sequential", {"message": "approval: deploy it"})
        doc = pending.structured_content
        assert not pending.is_error and doc["status"] == "waiting", pending
        assert doc["pending"][0]["tool"] == "echo" and doc["pending"][0]["call_id"]
        assert doc["run_id"] in pending.content[0].text
        done = await client.call_tool("sequential", {"run_id": doc["run_id"], "approve": True})
        assert done.structured_content["status"] == "done", done
        assert done.structured_content["run_id"] == doc["run_id"]
        assert done.structured_content["text"] == "All done."
        again = await client.call_tool("sequential", {"run_id": doc["run_id"], "approve": True})
        assert again.is_error and again.structured_content["error"]["code"] == "invalid_arguments"


@pytest.mark.parametrize("args", [{}, {"message": ""}, {"message": "x", "thread_id": "bad id!"},
                                  {"run_id": "nope", "approve": True}, {"run_id": "r1"}])
async def test_mcp_server_bad_arguments_are_tool_errors(mcp_url: str, args: dict[str, Any]) -> None:
    async with connect(mcp_url) as client:
        result = await client.call_tool("open", args)
        assert result.is_error and result.structured_content["status"] == "failed", result
        assert result.structured_content["error"]["code"] in ("invalid_arguments", "invalid_id")


async def test_mcp_server_unknown_agent_is_a_tool_error(mcp_url: str) -> None:
    async with connect(mcp_url) as client:
        result = await client.call_tool("nobody", {"message": "hi"})
        assert result.is_error and result.structured_content["error"]["code"] == "agent_not_found"


async def test_mcp_server_stdio(protocol_deployment: Deployment) -> None:
    """`agentlog mcp --app X` on stdio, on the deployment's log: the same tools and runs."""
    if protocol_deployment.kind != "serve":
        pytest.skip("one stdio process is enough: it drives its own runs")
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "agentlog", "mcp", "--app", "tests.apps.protocol_app:app",
                                      "--nats", protocol_deployment.nats_url],
        env={"PYTHONPATH": PYTHONPATH, "PATH": "/usr/bin:/bin"}, cwd=str(REPO))
    asked: list[str] = []
    errlog = open(protocol_deployment.tmp / "mcp-stdio.log", "w")
    try:
        async with asyncio.timeout(TIMEOUT), Client(stdio_client(params, errlog=errlog),
                                                    elicitation_callback=approve_all(asked)) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            assert "sequential" in names
            result = await c.call_tool("sequential", {"message": "approval: deploy it"})
            assert result.structured_content["status"] == "done", result
            assert len(asked) == 1
    finally:
        errlog.close()
    run = await run_doc(protocol_deployment.http_url, result.structured_content["run_id"])
    assert run["status"] == "done" and run["agent_id"] == "sequential"


async def test_mcp_server_tenant_tokens(tmp_path: Path) -> None:
    """Behind the gateway's bearer auth: no token is a 401; a tenant's run is invisible to
    another tenant (its run id answers like an unknown one) and answerable by its own."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    def as_tenant(url: str, token: str) -> Any:
        return streamable_http_client(url, http_client=httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT))

    with deploy("serve", tmp_path, app="tests.apps.protocol_app:app", tokens="tok-a:tenantA,tok-b:tenantB") as d:
        url = f"{d.http_url}/v1/mcp"
        async with aiohttp.ClientSession() as http, http.post(url, json={}) as resp:
            assert resp.status == 401
        async with connect(as_tenant(url, "tok-a")) as a:
            pending = (await a.call_tool("sequential", {"message": "approval: x"})).structured_content
            assert pending["status"] == "waiting", pending
        async with connect(as_tenant(url, "tok-b")) as b:
            stolen = await b.call_tool("sequential", {"run_id": pending["run_id"], "approve": True})
            assert stolen.is_error and "not found" in stolen.structured_content["error"]["message"]
        async with connect(as_tenant(url, "tok-a")) as a:
            done = await a.call_tool("sequential", {"run_id": pending["run_id"], "approve": True})
            assert done.structured_content["status"] == "done", done
