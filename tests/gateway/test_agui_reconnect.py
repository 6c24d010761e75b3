"""Reconnecting to a live AG-UI run (`POST /v1/ag-ui/agents/{agent}/connect`, the official
client's `connectAgent`), against what users run (`protocol_deployment`: `agentlog serve`, and
`agentlog gateway` + `agentlog worker`): a client that lost its stream mid-run gets the rest of
the run from the log, with no message twice. And what makes a drop anywhere safe: the stream
keeps the server's message order, a call's result before the next step's text.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import aiohttp

from tests.apps.protocol_app import HOLD_DIR
from tests.support.js_clients import JS, ensure_js_clients
from tests.support.protocol_verify.reducers import normalise_agui
from tests.support.topology import Deployment

TIMEOUT = 90


async def node(*args: str) -> dict[str, Any]:
    await ensure_js_clients()
    proc = await asyncio.create_subprocess_exec("node", *args, cwd=JS, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    doc: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return doc


async def server_messages(base: str, thread: str) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(f"{base}/v1/ag-ui/threads/{thread}/messages") as resp:
        assert resp.status == 200, await resp.text()
        messages: list[dict[str, Any]] = (await resp.json())["messages"]
    return messages


async def test_agui_reconnect_to_a_live_run_gets_the_rest_once(protocol_deployment: Deployment) -> None:
    thread = f"t{uuid.uuid4().hex[:12]}"
    base = protocol_deployment.http_url
    doc = await node(str(JS / "reconnect.mjs"), base, "open", thread, str(HOLD_DIR))
    before, after, events = doc["before"], doc["after"], doc["events"]
    assert not any(m.get("role") == "assistant" and m.get("content") == "Released." for m in before)
    assert events[0] == "RUN_STARTED" and events[-1] == "RUN_FINISHED" and events.count("RUN_STARTED") == 1, events
    ids = [m["id"] for m in after]
    assert len(ids) == len(set(ids)), after
    assert normalise_agui(after) == normalise_agui(await server_messages(base, thread))
    assert after[-1]["role"] == "assistant" and after[-1]["content"] == "Released."


async def test_agui_connect_to_a_finished_run_and_to_nothing(protocol_deployment: Deployment) -> None:
    """A finished run answers at once (snapshots, RUN_FINISHED); a thread with no run is a 404."""
    base = protocol_deployment.http_url
    thread = f"t{uuid.uuid4().hex[:12]}"
    body = {"threadId": thread, "runId": "r1", "messages": [{"id": "u1", "role": "user", "content": "text: hi"}],
            "tools": [], "context": [], "state": {}, "forwardedProps": {}}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/ag-ui/agents/open/runs", json=body) as resp:
            assert resp.status == 200
            await resp.read()
        async with http.post(f"{base}/v1/ag-ui/agents/open/connect", json={**body, "messages": []}) as resp:
            assert resp.status == 200
            text = await resp.text()
        types = [json.loads(line[5:])["type"] for line in text.splitlines() if line.startswith("data:")]
        assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED" and "MESSAGES_SNAPSHOT" in types, types
        async with http.post(f"{base}/v1/ag-ui/agents/open/connect",
                             json={**body, "threadId": f"t{uuid.uuid4().hex[:12]}"}) as resp:
            assert resp.status == 404, await resp.text()


async def test_agui_a_tool_result_comes_before_the_next_steps_text(protocol_deployment: Deployment) -> None:
    """A tool step, then a text step (`add`): the official client gets step 1's TOOL_CALL_RESULT
    before step 2's TEXT_MESSAGE_START, and holds the server's messages in the server's order.
    (The next step's live text outruns the commit of the result: without holding it back, the
    result landed inside that text message, and a client dropped mid-text kept another order.)"""
    base = protocol_deployment.http_url
    doc = await node(str(JS / "step_order.mjs"), base, "open", f"t{uuid.uuid4().hex[:12]}", "3")
    for run in doc["runs"]:
        kinds = [kind for kind, _id in run["events"]]
        assert kinds == ["TEXT_MESSAGE_START", "TOOL_CALL_RESULT", "TEXT_MESSAGE_START"], run["events"]
        server = await server_messages(base, run["threadId"])
        assert [m["role"] for m in server] == ["user", "assistant", "tool", "assistant"], server
        assert normalise_agui(run["messages"]) == normalise_agui(server)
