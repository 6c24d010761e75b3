"""`agentlog acp --app X`: an agent over the Agent Client Protocol on stdio, driven by the
`agent-client-protocol` package's client side (`spawn_agent_process`), on the log of a real
`agentlog serve` (the shared `protocol_deployment`, tests/apps/protocol_app.py scenarios): text
streams as message chunks, tool calls as tool call updates, approvals as permission requests
whose answers are the run's decisions.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any

import aiohttp
import pytest

from tests.support.topology import PYTHONPATH, REPO, TESTS, Deployment

acp = pytest.importorskip("acp")

TIMEOUT = 60


class EditorClient:
    """What an editor does: show updates, answer permission requests (allow or reject)."""

    def __init__(self, allow: bool = True) -> None:
        self.allow = allow
        self.updates: list[Any] = []
        self.asked: list[Any] = []

    async def request_permission(self, session_id: str, tool_call: Any, options: list[Any], **kw: Any) -> Any:
        from acp.schema import AllowedOutcome, RequestPermissionResponse

        self.asked.append((tool_call, [o.option_id for o in options]))
        option = next(o.option_id for o in options if o.kind == ("allow_once" if self.allow else "reject_once"))
        return RequestPermissionResponse(outcome=AllowedOutcome(option_id=option, outcome="selected"))

    async def session_update(self, session_id: str, update: Any, **kw: Any) -> None:
        self.updates.append(update)

    def text(self) -> str:
        return "".join(u.content.text for u in self.updates if u.session_update == "agent_message_chunk")

    def kinds(self) -> list[str]:
        return [u.session_update for u in self.updates]


@asynccontextmanager
async def acp_agent(d: Deployment, client: Any, *extra: str) -> AsyncIterator[Any]:
    """`agentlog acp` on the deployment's NATS, driven by `client`: the initialized connection."""
    from acp import PROTOCOL_VERSION, spawn_agent_process

    log = open(d.tmp / "acp.log", "ab")
    try:
        async with asyncio.timeout(TIMEOUT), spawn_agent_process(
                client, sys.executable, "-m", "agentlog", "acp", "--app", "tests.apps.protocol_app:app", "--nats", d.nats_url,
                *extra, env={"PYTHONPATH": PYTHONPATH, "PATH": "/usr/bin:/bin"}, cwd=str(REPO),
                # The client closes the agent's stdin and waits this long for it to exit (the
                # SDK's default, 2 s, is short for a loaded machine, and on expiry the SDK
                # signals a process that may have exited meanwhile: ProcessLookupError).
                transport_kwargs={"stderr": log, "shutdown_timeout": TIMEOUT}) as (conn, _proc):
            init = await conn.initialize(protocol_version=PROTOCOL_VERSION)
            assert init.protocol_version == PROTOCOL_VERSION
            yield conn
    finally:
        log.close()


async def drive(d: Deployment, client: EditorClient, text: str, *extra: str) -> tuple[str, Any]:
    from acp import text_block

    async with acp_agent(d, client, *extra) as conn:
        sess = await conn.new_session(cwd=str(TESTS), mcp_servers=[])
        answer = await conn.prompt(session_id=sess.session_id, prompt=[text_block(text)])
        return sess.session_id, answer


async def run_of(d: Deployment, thread: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{d.http_url}/v1/runs", params={"thread_id": thread}) as resp:
            assert resp.status == 200, await resp.text()
            (run,) = (await resp.json())["runs"]
        async with http.get(f"{d.http_url}/v1/runs/{run['run_id']}") as resp:
            assert resp.status == 200, await resp.text()
            doc: dict[str, Any] = await resp.json()
    return doc


@pytest.fixture
def serve_only(protocol_deployment: Deployment) -> Deployment:
    if protocol_deployment.kind != "serve":
        pytest.skip("the ACP process runs its own worker: one log is enough")
    return protocol_deployment


async def test_acp_prompt_streams_text_and_tool_calls(serve_only: Deployment) -> None:
    client = EditorClient()
    thread, answer = await drive(serve_only, client, "add: 1 and 2", "--agent", "open")
    assert answer.stop_reason == "end_turn"
    assert client.text() == "Let me add those numbersThe sum is three."
    assert "tool_call" in client.kinds() and "tool_call_update" in client.kinds(), client.kinds()
    run = await run_of(serve_only, thread)  # session id = thread id; the run is in the log
    assert run["status"] == "done" and run["agent_id"] == "open"


@pytest.mark.parametrize("allow", [True, False], ids=["allowed", "rejected"])
async def test_acp_permission_request_is_the_runs_approval(serve_only: Deployment, allow: bool) -> None:
    client = EditorClient(allow=allow)
    thread, answer = await drive(serve_only, client, "approval: deploy it")  # the first agent: sequential
    assert answer.stop_reason == "end_turn"
    ((tool_call, options),) = client.asked
    assert options == ["allow", "reject"] and "echo" in tool_call.title
    run = await run_of(serve_only, thread)
    (call,) = run["calls"].values()
    assert run["status"] == "done" and call["status"] == ("succeeded" if allow else "cancelled"), call


class CancellingEditor(EditorClient):
    """Asked for a permission, the user cancels the turn instead: `session/cancel`, then the
    open permission request answered `cancelled` (as the protocol asks of a client)."""

    conn: Any = None

    async def request_permission(self, session_id: str, tool_call: Any, options: list[Any], **kw: Any) -> Any:
        from acp.schema import DeniedOutcome, RequestPermissionResponse

        self.asked.append((tool_call, [o.option_id for o in options]))
        await self.conn.cancel(session_id=session_id)
        return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))


async def test_acp_refuses_unknown_sessions_and_a_cancel_during_a_permission_ends_the_turn(
        protocol_deployment: Deployment) -> None:
    """One ACP process per topology (the ACP process's worker or the deployment's drive the runs):

    - a prompt on a session id this connection neither created nor loaded: -32602, nothing
      written (no run, no thread);
    - a cancel while a permission request is open: the turn answers `cancelled` (not `refusal`),
      and the run is cancelled with no decision sent to it."""
    from acp import RequestError, text_block

    from agentlog.eventlog.events import RunFinished, ToolCallDecided
    from agentlog.eventlog.jetstream.store import JetStreamEventStore

    d, never = protocol_deployment, f"t{uuid.uuid4().hex[:12]}"
    client = CancellingEditor()
    async with acp_agent(d, client) as conn:
        client.conn = conn
        with pytest.raises(RequestError) as refused:
            await conn.prompt(session_id=never, prompt=[text_block("text: hi")])
        assert refused.value.code == -32602
        sess = await conn.new_session(cwd=str(TESTS), mcp_servers=[])
        answer = await conn.prompt(session_id=sess.session_id, prompt=[text_block("approval: deploy it")])
        assert answer.stop_reason == "cancelled"
        assert len(client.asked) == 1
        store = await JetStreamEventStore.connect(d.nats_url)
        try:  # the cancel is queued: follow the log until the run has finished
            async with aclosing(store.follow(sess.session_id, 0)) as commits:
                async for sc in commits:
                    if any(isinstance(e, RunFinished) for e in sc.commit.events):
                        break
            events = [e for sc in [c async for c in store.read_thread(sess.session_id)] for e in sc.commit.events]
        finally:
            await store.close()
    assert not any(isinstance(e, ToolCallDecided) for e in events), events
    (end,) = [e for e in events if isinstance(e, RunFinished)]
    assert end.termination.type == "cancelled"
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{d.http_url}/v1/threads/{never}") as resp:
            assert resp.status == 404, await resp.text()
        async with http.get(f"{d.http_url}/v1/runs", params={"thread_id": never}) as resp:
            assert (await resp.json())["runs"] == []
