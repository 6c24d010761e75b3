"""Issue #14 (protocol fidelity): what the official AG-UI / AI SDK v6 clients need to end in the
server's state, checked at the translator and session level on a real nats-server. The Node
check with the official npm packages is `test_protocol_clients.py`."""

from __future__ import annotations

import copy
import json
import pathlib
from typing import Any

import pytest
from frontend_stubs import frontend_tool

from agentlog.gateway.adapters import nats_routes
from agentlog.runtime import PermissionPlugin, ToolContext, tool
from agentlog.runtime.models import Turn

from protocol_verify.agui import verify_agui_stream
from protocol_verify.aisdk import parse_ui_sse, verify_ui_stream
from protocol_verify.reducers import AguiClient, AiSdkChat, normalise_agui, normalise_aisdk
from test_adapters_routes_support import TOOLS, TRANSPORTS, Stack, Transport, nats_request, open_stack

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_verifiers_live_in_tests_not_in_product_code() -> None:
    """Item 10: the stream verifiers are test code; nothing in src/agentlog/ imports them."""
    adapters = ROOT / "src" / "agentlog" / "adapters"
    assert not (adapters / "agui_verify.py").exists()
    assert not (adapters / "aisdk_verify.py").exists()
    for path in (ROOT / "src" / "agentlog").rglob("*.py"):
        text = path.read_text()
        assert "agui_verify" not in text and "aisdk_verify" not in text and "protocol_verify" not in text, path


# -- issue #12 item 3: the NATS adapter subjects check tokens and tenants like HTTP -------------

TOKENS = "root,tokA:tenantA,tokB:tenantB"


def _agui_body(thread: str, run: str, text: str = "hi") -> dict[str, Any]:
    return {"threadId": thread, "runId": run, "messages": [{"id": f"u-{run}", "role": "user", "content": text}],
            "tools": [], "context": [], "state": {}, "forwardedProps": {}}


def _aisdk_body(thread: str, text: str = "hi") -> dict[str, Any]:
    return {"id": thread, "trigger": "submit-message",
            "messages": [{"id": f"u-{thread}-{text}", "role": "user", "parts": [{"type": "text", "text": text}]}]}


async def test_nats_adapters_check_tokens_and_tenants(nats_server: Any) -> None:
    async with open_stack(nats_server, ["one", "two", "three"], tokens=TOKENS) as stack:
        ag_subject, ai_subject = nats_routes.AGUI_SUBJECT, nats_routes.AISDK_SUBJECT
        # no token / a wrong token: one error event with the micro error headers, nothing written
        for token, status, code in ((None, "401", "unauthorized"), ("nope", "403", "forbidden")):
            for subject, body in ((ag_subject, _agui_body("tx", "rx")), (ai_subject, _aisdk_body("ty"))):
                replies = await nats_request(stack, subject, body, token=token)
                assert len(replies) == 1, [r.data for r in replies]
                assert replies[0].headers["Nats-Service-Error-Code"] == status
                event = json.loads(replies[0].data)
                assert event["type"] in ("RUN_ERROR", "error")
                assert event.get("code", code) == code
        assert await stack.events_of("tx") == [] and await stack.events_of("ty") == []
        # tenant A creates its threads; they are recorded under its prefix
        events = [json.loads(m.data) for m in await nats_request(stack, ag_subject, _agui_body("ta", "r1"), token="tokA")]
        assert events[-1]["type"] == "RUN_FINISHED", events[-1]
        parts = [json.loads(m.data) for m in await nats_request(stack, ai_subject, _aisdk_body("tb"), token="tokA")]
        assert parts[-1] == {"type": "finish", "finishReason": "stop"}
        for thread in ("ta", "tb"):
            created = (await stack.events_of(thread))[0]
            assert created.resource_id == "tenantA"
        # tenant B cannot resume / continue them: answered like an unknown thread, nothing written
        before = await stack.last_seq()
        events = [json.loads(m.data) for m in await nats_request(stack, ag_subject, _agui_body("ta", "r2"), token="tokB")]
        assert [e["type"] for e in events] == ["RUN_ERROR"] and events[0]["code"] == "thread_not_found"
        parts = [json.loads(m.data) for m in await nats_request(stack, ai_subject, _aisdk_body("tb", "x"), token="tokB")]
        assert [p["type"] for p in parts] == ["error"]
        assert await stack.last_seq() == before
        # an unscoped token sees everything
        events = [json.loads(m.data) for m in await nats_request(stack, ag_subject, _agui_body("ta", "r3"), token="root")]
        assert events[-1]["type"] == "RUN_FINISHED"


# -- issue #12 item 6: an unexpected producer error still ends the AG-UI stream ----------------


@pytest.mark.parametrize("tr", TRANSPORTS, ids=lambda t: t.name)
@pytest.mark.parametrize("where", ["content", "forwardedProps"])
async def test_agui_lone_surrogate_is_refused_before_the_stream(nats_server: Any, tr: Transport,
                                                                where: str) -> None:
    """The issue's trigger (a lone surrogate in content or forwardedProps) no longer reaches the
    producer: the one request decoder (`agentlog.gateway.operations.json_input`) refuses it as `invalid_json` (HTTP 400,
    NATS one RUN_ERROR) and nothing is written. Before: the HTTP stream never ended."""
    async with open_stack(nats_server, ["fine"]) as stack:
        body = _agui_body("t1", "r1")
        if where == "content":
            body["messages"][0]["content"] = "bad \ud800 text"
        else:
            body["forwardedProps"] = {"x": "\ud800"}
        raw = json.dumps(body)  # ASCII escapes: the lone surrogate arrives as `\\ud800`
        answer = await tr.agui(stack, json.loads(raw))
        assert answer.rejected is not None, answer.events
        assert answer.rejected["code"] == "invalid_json"
        assert await stack.events_of("t1") == []


@pytest.mark.parametrize("tr", TRANSPORTS, ids=lambda t: t.name)
async def test_agui_stream_ends_with_run_error_on_unexpected_error(nats_server: Any, tr: Transport,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the producer raises once the stream is open (here: the translator, with a lone
    surrogate in the exception text), the stream ends with RUN_ERROR `internal_error` whose text
    can be encoded. Before: the HTTP stream never ended."""
    from agentlog.gateway.adapters import agui

    feed = agui.AguiTranslator.feed
    calls = {"n": 0}

    def failing_feed(self: Any, item: Any) -> list[Any]:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("unexpected \ud800 failure")
        return feed(self, item)

    monkeypatch.setattr(agui.AguiTranslator, "feed", failing_feed)
    async with open_stack(nats_server, ["fine"]) as stack:
        answer = await tr.agui(stack, _agui_body("t1", "r1"))
        assert answer.events, "the stream must end with an event"
        assert answer.events[-1]["type"] == "RUN_ERROR", answer.events
        assert answer.events[-1]["code"] == "internal_error"
        assert "\ud800" not in json.dumps(answer.events[-1], ensure_ascii=False)


# -- issue #14: the client's reducer ends in the server's state ---------------------------------


@tool
def init_log(ctx: ToolContext) -> str:
    """Start an empty log list in the thread state."""
    ctx.set("/log", [])
    return "ok"


@tool
def append_log(text: str, ctx: ToolContext) -> str:
    """Append to the log list (an array append: applying it twice shows)."""
    ctx.patch([{"op": "add", "path": "/log/-", "value": text}])
    return text


LOG_TOOLS = [*TOOLS, init_log, append_log]


async def server_view(stack: Stack, thread: str) -> tuple[list[dict[str, Any]], Any, list[dict[str, Any]]]:
    """What GET says (all three read the log, not a lagging view): AG-UI messages, thread state,
    AI SDK messages."""
    out = []
    for path in (f"/v1/ag-ui/threads/{thread}/messages", f"/v1/threads/{thread}/state",
                 f"/v1/ai-sdk/threads/{thread}/messages"):
        resp = await stack.client.get(path)
        assert resp.status == 200, await resp.text()
        out.append(await resp.json())
    return out[0]["messages"], out[1]["state"], out[2]["messages"]


def agui_input(thread: str, run: str, client: AguiClient | None = None, *extra: dict[str, Any],
               **kw: Any) -> dict[str, Any]:
    """A request as `HttpAgent` builds it: the client's messages (activity ones left out) + extra."""
    history = [m for m in (client.messages if client else []) if m.get("role") != "activity"]
    return {"threadId": thread, "runId": run, "messages": [*history, *extra], "tools": [], "context": [],
            "state": client.state if client else {}, "forwardedProps": {}, **kw}


@pytest.mark.parametrize("tr", TRANSPORTS, ids=lambda t: t.name)
async def test_agui_live_text_and_tool_call_build_the_servers_messages(nats_server: Any, tr: Transport) -> None:
    """Items 2-3: text streamed live, then a tool call of the same message, then the final text.
    WITHOUT the MESSAGES_SNAPSHOT repair the client already holds exactly the server's messages
    (no duplicate text, no tool-call-only message, same order), and with it too."""
    turns = [Turn.tool("add", {"a": 1, "b": 2}, text="Let me add those numbers"), "The sum is three."]
    async with open_stack(nats_server, turns) as stack:
        answer = await tr.agui(stack, agui_input("t1", "r1", None, {"id": "u1", "role": "user", "content": "add"}))
        events = verify_agui_stream(answer.events)
        assert sum(e.type == "TEXT_MESSAGE_CONTENT" for e in events) > 2  # it did stream live
        live = AguiClient().apply_all(events, snapshots=False)
        full = AguiClient().apply_all(events)
        messages, state, _ = await server_view(stack, "t1")
        assert live.problems == [] and full.problems == []
        assert normalise_agui(live.messages) == normalise_agui(messages)
        assert normalise_agui(full.messages) == normalise_agui(messages)
        assert full.state == state == {"last_sum": 3}
        starts = [e for e in events if e.type == "TOOL_CALL_START"]
        assert [s.parent_message_id for s in starts] == [messages[1]["id"]]


@pytest.mark.parametrize("tr", TRANSPORTS, ids=lambda t: t.name)
async def test_aisdk_live_text_and_tool_call_make_one_text_part(nats_server: Any, tr: Transport) -> None:
    """Item 2 (AI SDK): the streamed text is one text part, not twice."""
    turns = [Turn.tool("add", {"a": 1, "b": 2}, text="Let me add those numbers"), "The sum is three."]
    async with open_stack(nats_server, turns) as stack:
        chat = AiSdkChat([{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "add"}]}])
        body = {"id": "c1", "trigger": "submit-message", "messages": chat.messages}
        answer = await tr.aisdk(stack, body)
        verify_ui_stream(answer.events)
        chat.receive(answer.events)
        _, _, history = await server_view(stack, "c1")
        assert chat.problems == [] and chat.errors == []
        assert normalise_aisdk(chat.messages) == normalise_aisdk(history)
        texts = [p["text"] for p in chat.messages[-1]["parts"] if p["type"] == "text"]
        assert texts == ["Let me add those numbers", "The sum is three."]


async def test_agui_retried_resume_replays_from_the_state_at_the_decision(nats_server: Any) -> None:
    """Item 1: the client lost the resume's answer and sends the same resume again: the replay's
    STATE_SNAPSHOT is the state as of the decision, so its STATE_DELTAs apply once."""
    turns = [Turn.tool("init_log", {}), Turn.tool("append_log", {"text": "x"}), "Logged."]
    async with open_stack(nats_server, turns, tools=LOG_TOOLS, plugins=(PermissionPlugin(ask=["append_log"]),)) as stack:
        http = TRANSPORTS[0]
        client = AguiClient()
        answer = await http.agui(stack, agui_input("t1", "r1", client, {"id": "u1", "role": "user", "content": "log x"}))
        client.apply_all(verify_agui_stream(answer.events))
        (interrupt,) = client.pending_interrupts
        lost = copy.deepcopy(client)  # the client whose first answer never arrived
        resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True}}]
        answer = await http.agui(stack, agui_input("t1", "r2", client, resume=resume))
        client.apply_all(verify_agui_stream(answer.events))
        seq = await stack.last_seq()
        answer = await http.agui(stack, agui_input("t1", "r3", lost, resume=resume))
        lost.apply_all(verify_agui_stream(answer.events))
        assert await stack.last_seq() == seq  # a replay: nothing written
        messages, state, _ = await server_view(stack, "t1")
        assert state == {"log": ["x"]}
        for c in (client, lost):
            assert c.problems == []
            assert c.state == state
            assert normalise_agui(c.messages) == normalise_agui(messages)


@pytest.mark.parametrize("tr", TRANSPORTS, ids=lambda t: t.name)
async def test_aisdk_error_answer_creates_no_message(nats_server: Any, tr: Transport) -> None:
    """Item 7: an error answer (here: an approval for no open call) sends no `start.messageId`,
    so the client adds no phantom assistant message under the chat id."""
    async with open_stack(nats_server, ["hello"]) as stack:
        chat = AiSdkChat([{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}])
        chat.receive((await tr.aisdk(stack, {"id": "c1", "trigger": "submit-message", "messages": chat.messages})).events)
        before = copy.deepcopy(chat.messages)
        bogus = {"id": "a1", "role": "assistant", "parts": [
            {"type": "tool-echo", "toolCallId": "nope", "state": "approval-responded", "input": {},
             "approval": {"id": "nope", "approved": True}}]}
        answer = await tr.aisdk(stack, {"id": "c1", "trigger": "submit-message", "messages": [*before, bogus]})
        assert [p["type"] for p in answer.events][-2:] == ["error", "finish"]
        assert all(p.get("messageId") in (None,) for p in answer.events if p["type"] == "start")
        chat.receive(answer.events)
        assert chat.messages == before and chat.errors


@pytest.mark.parametrize("approved", [True, False], ids=["approve", "deny"])
async def test_aisdk_history_keeps_approval_and_denial(nats_server: Any, approved: bool) -> None:
    """Item 8: after an approval the history's tool part carries `approval{id, approved}`; a
    denial is `output-denied` (with approval), which `validateUIMessages` requires."""
    async with open_stack(nats_server, [Turn.tool("echo", {"text": "deploy"}), "Done."],
                          plugins=(PermissionPlugin(ask=["echo"]),)) as stack:
        http = TRANSPORTS[0]
        chat = AiSdkChat([{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "deploy"}]}])
        chat.receive((await http.aisdk(stack, {"id": "c1", "trigger": "submit-message", "messages": chat.messages})).events)
        tool_part = next(p for p in chat.messages[-1]["parts"] if p["type"] == "tool-echo")
        assert tool_part["state"] == "approval-requested"
        # what addToolApprovalResponse does on the client, then the automatic resend
        tool_part.update(state="approval-responded", approval={**tool_part["approval"], "approved": approved})
        answer = await http.aisdk(stack, {"id": "c1", "trigger": "submit-message", "messages": chat.messages})
        verify_ui_stream(answer.events, known_tool_calls=[tool_part["toolCallId"]])
        chat.receive(answer.events)
        _, _, history = await server_view(stack, "c1")
        (part,) = [p for p in history[-1]["parts"] if p["type"] == "tool-echo"]
        assert part["approval"]["id"] == tool_part["toolCallId"] and part["approval"]["approved"] is approved
        assert part["state"] == ("output-available" if approved else "output-denied")
        assert normalise_aisdk(chat.messages) == normalise_aisdk(history)


async def test_aisdk_resumed_stream_replays_the_whole_message(nats_server: Any) -> None:
    """Item 5: `GET /v1/ai-sdk/runs/{id}/stream` after an approved run replays the whole assistant
    message; the client (resume-stream resets the message at `start`) ends with the history."""
    async with open_stack(nats_server, [Turn.tool("echo", {"text": "deploy"}, text="Deploying now"), "Done."],
                          plugins=(PermissionPlugin(ask=["echo"]),)) as stack:
        http = TRANSPORTS[0]
        chat = AiSdkChat([{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "deploy"}]}])
        first = (await http.aisdk(stack, {"id": "c1", "trigger": "submit-message", "messages": chat.messages})).events
        chat.receive(first)
        tool_part = next(p for p in chat.messages[-1]["parts"] if p["type"] == "tool-echo")
        tool_part.update(state="approval-responded", approval={**tool_part["approval"], "approved": True})
        chat.receive((await http.aisdk(stack, {"id": "c1", "trigger": "submit-message", "messages": chat.messages})).events)
        _, _, history = await server_view(stack, "c1")
        resp = await stack.client.get(f"/v1/ai-sdk/runs/{first[0]['messageId']}/stream")
        parts, done = parse_ui_sse(await resp.text())
        assert done and verify_ui_stream(parts)
        resumed = AiSdkChat(copy.deepcopy(chat.messages))
        resumed.receive(parts, resume=True)
        assert normalise_aisdk(resumed.messages) == normalise_aisdk(history) == normalise_aisdk(chat.messages)


@pytest.mark.parametrize("tr", TRANSPORTS, ids=lambda t: t.name)
async def test_aisdk_client_tool_output_answers_a_frontend_tool(nats_server: Any, tr: Transport) -> None:
    """Item 6: `addToolOutput` (tool part `output-available`) is the frontend tool's result."""
    turns = [Turn.tool("pick_color", {"palette": ["red", "blue"]}), "You picked blue."]
    tools = [*TOOLS, frontend_tool("pick_color", "Let the user pick a color")]
    async with open_stack(nats_server, turns, tools=tools) as stack:
        chat = AiSdkChat([{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "pick"}]}])
        chat.receive((await tr.aisdk(stack, {"id": "c1", "trigger": "submit-message", "messages": chat.messages})).events)
        part = next(p for p in chat.messages[-1]["parts"] if p["type"] == "tool-pick_color")
        assert part["state"] == "input-available"
        part.update(state="output-available", output={"color": "blue"})  # what addToolOutput does
        answer = await tr.aisdk(stack, {"id": "c1", "trigger": "submit-message", "messages": chat.messages})
        assert answer.rejected is None, answer.rejected
        verify_ui_stream(answer.events, known_tool_calls=[part["toolCallId"]])
        chat.receive(answer.events)
        _, _, history = await server_view(stack, "c1")
        assert chat.errors == []
        assert normalise_aisdk(chat.messages) == normalise_aisdk(history)
        view = await stack.runtime.run_view(chat.messages[-1]["id"])
        assert view.calls[part["toolCallId"]].result == {"color": "blue"} and view.status == "done"


# -- item 9: CORS, GET /v1/agents, adapter request bodies in /openapi.json ---------------------

ORIGIN = "http://127.0.0.1:5173"


async def test_cors_for_browser_clients(nats_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTLOG_CORS_ORIGINS", f"{ORIGIN}, http://127.0.0.1:3000")
    async with open_stack(nats_server, ["Hello."], tokens="tok") as stack:
        # preflight: no token, no route, still answered for an allowed origin
        resp = await stack.client.options("/v1/ag-ui/agents/agent/runs", headers={
            "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert resp.status == 204
        assert resp.headers["Access-Control-Allow-Origin"] == ORIGIN
        assert "POST" in resp.headers["Access-Control-Allow-Methods"]
        assert resp.headers["Access-Control-Allow-Headers"] == "authorization, content-type"
        # a streamed answer carries the headers too (set before the SSE response is sent)
        resp = await stack.client.post("/v1/ai-sdk/agents/agent/runs", data=json.dumps(_aisdk_body("c1")),
                                       headers={"Origin": ORIGIN, "Authorization": "Bearer tok"})
        assert resp.status == 200 and resp.headers["Access-Control-Allow-Origin"] == ORIGIN
        assert "x-vercel-ai-ui-message-stream" in resp.headers["Access-Control-Expose-Headers"]
        await resp.read()
        # errors too (a browser must be able to read the 401 body)
        resp = await stack.client.get("/v1/agents", headers={"Origin": ORIGIN})
        assert resp.status == 401 and resp.headers["Access-Control-Allow-Origin"] == ORIGIN
        # another origin: refused preflight, no CORS headers on answers
        resp = await stack.client.options("/v1/agents", headers={
            "Origin": "http://127.0.0.1:9", "Access-Control-Request-Method": "GET"})
        assert resp.status == 403 and "Access-Control-Allow-Origin" not in resp.headers
        resp = await stack.client.get("/health", headers={"Origin": "http://127.0.0.1:9"})
        assert "Access-Control-Allow-Origin" not in resp.headers


async def test_cors_off_by_default(nats_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTLOG_CORS_ORIGINS", raising=False)
    async with open_stack(nats_server, ["Hello."]) as stack:
        resp = await stack.client.get("/health", headers={"Origin": ORIGIN})
        assert "Access-Control-Allow-Origin" not in resp.headers


async def test_agents_listing_and_adapter_bodies_in_openapi(nats_server: Any) -> None:
    async with open_stack(nats_server, ["Hello."]) as stack:
        resp = await stack.client.get("/v1/agents")
        assert resp.status == 200
        (agent,) = (await resp.json())["agents"]
        assert agent["id"] == "agent" and agent["description"] == ""
        tools = {t["name"]: t for t in agent["tools"]}
        assert set(tools) == {t.name for t in TOOLS}
        assert tools["add"]["parameters"]["properties"].keys() == {"a", "b"}
        doc = await (await stack.client.get("/openapi.json")).json()
        assert "/v1/agents" in doc["paths"]
        for path, required in (("/v1/ag-ui/agents/{agent_id}/runs", {"threadId", "runId", "messages"}),
                               ("/v1/ai-sdk/agents/{agent_id}/runs", {"id", "messages"})):
            schema = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
            assert required <= set(schema.get("required", ())), (path, schema.get("required"))
        refs = json.dumps(doc).count("#/components/schemas/")
        assert refs and all(ref.split("/")[-1] in doc["components"]["schemas"]
                            for ref in _refs(doc))


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "$ref"] + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []
