"""HTTP-only adapter routes: AG-UI / AI SDK history, the AI SDK resume-stream endpoint, 400s,
and that the routes are in the OpenAPI document (real nats-server, real aiohttp server)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from agentlog.runtime import PermissionPlugin
from agentlog.runtime.models import Turn

from protocol_verify.agui import verify_agui_stream
from protocol_verify.aisdk import parse_ui_sse, verify_ui_stream
from test_adapters_routes_support import TIMEOUT, Http, open_stack

pytestmark = pytest.mark.asyncio
http = Http()


def chat(thread: str, text: str, mid: str = "m1") -> dict[str, Any]:
    return {"id": thread, "trigger": "submit-message",
            "messages": [{"id": mid, "role": "user", "parts": [{"type": "text", "text": text}]}]}


async def test_histories_and_resume_stream(nats_server: Any) -> None:
    perm = PermissionPlugin(ask=["echo"])
    turns = [Turn.tool("add", {"a": 1, "b": 2}), "3 it is.", Turn.tool("echo", {"text": "x"}), "Echoed."]
    async with open_stack(nats_server, turns, plugins=(perm,)) as stack:
        c = stack.client
        first = await http.aisdk(stack, chat("c1", "add"))
        second = await http.aisdk(stack, chat("c1", "echo", "m2"))
        assert second.events[-1] == {"type": "finish", "finishReason": "tool-calls"}
        async with asyncio.timeout(TIMEOUT):
            resp = await c.get("/v1/ai-sdk/threads/c1/messages")
            ui = (await resp.json())["messages"]
            resp2 = await c.get("/v1/ag-ui/threads/c1/messages")
            agui = (await resp2.json())["messages"]
            run_id = first.events[0]["messageId"]
            replay = await c.get(f"/v1/ai-sdk/runs/{run_id}/stream")
            assert replay.headers["x-vercel-ai-ui-message-stream"] == "v1"
            text = await replay.text()
            waiting = await c.get(f"/v1/ai-sdk/runs/{second.events[0]['messageId']}/stream")
            waiting_text = await waiting.text()
            missing = await c.get("/v1/ai-sdk/threads/nope/messages")
            missing_run = await c.get("/v1/ai-sdk/runs/nope/stream")
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


async def test_bad_bodies_are_400_with_field_detail(nats_server: Any) -> None:
    async with open_stack(nats_server, ["x"]) as stack:
        seq = await stack.last_seq()
        async with asyncio.timeout(TIMEOUT):
            bad_json = await stack.client.post("/v1/ag-ui/agents/agent/runs", data=b"{nope")
            bad_id = await stack.client.post("/v1/ag-ui/agents/agent/runs", data=json.dumps(
                {"threadId": "a.b", "runId": "r1", "messages": [], "tools": [], "context": [], "state": {},
                 "forwardedProps": {}}))
            bad_chat = await stack.client.post("/v1/ai-sdk/agents/agent/runs", data=json.dumps({"id": "c1"}))
            spec = await (await stack.client.get("/openapi.json")).json()
        assert bad_json.status == 400 and (await bad_json.json())["code"] == "invalid_json"
        body = await bad_id.json()
        assert bad_id.status == 400 and body["detail"][0]["field"] == "threadId"
        assert bad_chat.status == 400 and (await bad_chat.json())["detail"][0]["field"] == "messages"
        assert {"/v1/ag-ui/agents/{agent_id}/runs", "/v1/ai-sdk/runs/{id}/stream"} <= set(spec["paths"])
        assert await stack.last_seq() == seq


async def test_unknown_agent_is_a_run_error_with_nothing_written(nats_server: Any) -> None:
    async with open_stack(nats_server, ["x"]) as stack:
        seq = await stack.last_seq()
        answer = await http.agui(stack, {"threadId": "t1", "runId": "r1", "messages": [
            {"id": "u1", "role": "user", "content": "hi"}], "tools": [], "context": [], "state": {},
            "forwardedProps": {}}, agent="ghost")
        types = [e["type"] for e in answer.events]
        assert types[0] == "RUN_STARTED" and types[-1] == "RUN_ERROR" and "STEP_STARTED" not in types
        verify_agui_stream(answer.events)
        assert answer.events[-1]["code"] == "agent_not_found"
        assert await stack.last_seq() == seq
