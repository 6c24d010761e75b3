"""HTTP-only adapter routes: AG-UI / AI SDK history, the AI SDK resume-stream endpoint, 400s,
and that the routes are in the OpenAPI document; against what users run (`agentlog serve`, and
`agentlog gateway` + `agentlog worker`: the shared `protocol_deployment` of tests/apps/protocol_app.py,
so every test uses its own threads)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support.adapters_routes import TIMEOUT, Deployed, Http, open_deployed
from tests.support.http_stack import uid
from tests.support.protocol_verify.agui import verify_agui_stream
from tests.support.protocol_verify.aisdk import parse_ui_sse, verify_ui_stream
from tests.support.topology import Deployment

pytestmark = pytest.mark.asyncio
http = Http()


@pytest.fixture
async def stack(protocol_deployment: Deployment) -> AsyncIterator[Deployed]:
    async with open_deployed(protocol_deployment) as value:
        yield value


def chat(thread: str, text: str) -> dict[str, Any]:
    return {"id": thread, "trigger": "submit-message",
            "messages": [{"id": uid("m"), "role": "user", "parts": [{"type": "text", "text": text}]}]}


async def test_histories_and_resume_stream(stack: Deployed) -> None:
    """`sequential` (protocol_app) adds without asking, and asks before `echo`."""
    c1 = uid("c")
    c = stack.client
    first = await http.aisdk(stack, chat(c1, "add: 1 and 2"), agent="sequential")  # type: ignore[arg-type]
    second = await http.aisdk(stack, chat(c1, "approval: echo"), agent="sequential")  # type: ignore[arg-type]
    assert second.events[-1] == {"type": "finish", "finishReason": "tool-calls"}
    async with asyncio.timeout(TIMEOUT):
        resp = await c.get(f"/v1/ai-sdk/threads/{c1}/messages")
        ui = (await resp.json())["messages"]
        resp2 = await c.get(f"/v1/ag-ui/threads/{c1}/messages")
        agui = (await resp2.json())["messages"]
        run_id = first.events[0]["messageId"]
        replay = await c.get(f"/v1/ai-sdk/runs/{run_id}/stream")
        assert replay.headers["x-vercel-ai-ui-message-stream"] == "v1"
        text = await replay.text()
        waiting = await c.get(f"/v1/ai-sdk/runs/{second.events[0]['messageId']}/stream")
        waiting_text = await waiting.text()
        missing = await c.get(f"/v1/ai-sdk/threads/{uid('c')}/messages")
        missing_run = await c.get(f"/v1/ai-sdk/runs/{uid('r')}/stream")
    assert [m["role"] for m in ui] == ["user", "assistant", "user", "assistant"]
    assert ui[1]["id"] == run_id
    tool_parts = [p for p in ui[1]["parts"] if p["type"] == "tool-add"]
    assert tool_parts == [{"type": "tool-add", "toolCallId": tool_parts[0]["toolCallId"], "input": {"a": 1, "b": 2},
                           "state": "output-available", "output": 3}]
    assert ui[3]["parts"][-1]["state"] == "approval-requested"
    assert [m["role"] for m in agui] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    parts = verify_ui_stream(text)
    assert parts[-1] == {"type": "finish", "finishReason": "stop"}
    def tools(ps: list[Any]) -> list[Any]:  # the replay has no live input deltas
        return [p for p in ps if p["type"].startswith("tool-") and p["type"] != "tool-input-delta"]

    assert tools(parts) == tools(first.events)
    waiting_parts, done = parse_ui_sse(waiting_text)
    assert done and waiting_parts[-1] == {"type": "finish", "finishReason": "tool-calls"}
    verify_ui_stream(waiting_parts)
    assert (missing.status, missing_run.status) == (404, 404)


async def test_bad_bodies_are_400_with_field_detail(stack: Deployed) -> None:
    seq = await stack.last_seq()
    async with asyncio.timeout(TIMEOUT):
        bad_json = await stack.client.post("/v1/ag-ui/agents/open/runs", data=b"{nope")
        bad_id = await stack.client.post("/v1/ag-ui/agents/open/runs", data=json.dumps(
            {"threadId": "a.b", "runId": uid("r"), "messages": [], "tools": [], "context": [], "state": {},
             "forwardedProps": {}}))
        bad_chat = await stack.client.post("/v1/ai-sdk/agents/open/runs", data=json.dumps({"id": uid("c")}))
        spec = await (await stack.client.get("/openapi.json")).json()
    assert bad_json.status == 400 and (await bad_json.json())["code"] == "invalid_json"
    body = await bad_id.json()
    assert bad_id.status == 400 and body["detail"][0]["field"] == "threadId"
    assert bad_chat.status == 400 and (await bad_chat.json())["detail"][0]["field"] == "messages"
    assert {"/v1/ag-ui/agents/{agent_id}/runs", "/v1/ai-sdk/runs/{id}/stream"} <= set(spec["paths"])
    assert await stack.last_seq() == seq


async def test_unknown_agent_is_a_run_error_with_nothing_written(stack: Deployed) -> None:
    seq = await stack.last_seq()
    answer = await http.agui(stack, {"threadId": uid("t"), "runId": uid("r"), "messages": [  # type: ignore[arg-type]
        {"id": uid("u"), "role": "user", "content": "hi"}], "tools": [], "context": [], "state": {},
        "forwardedProps": {}}, agent="ghost")
    types = [e["type"] for e in answer.events]
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_ERROR" and "STEP_STARTED" not in types
    verify_agui_stream(answer.events)
    assert answer.events[-1]["code"] == "agent_not_found"
    assert await stack.last_seq() == seq
