"""Protocol fidelity: what the official AG-UI / AI SDK v6 clients need to end in the server's state,
against what users run (`agentlog serve`, and `agentlog gateway` + `agentlog worker`: the shared
`protocol_deployment` of tests/apps/protocol_app.py, and `tokens_deployment`, the same app with tokens
and CORS). The Node check with the official npm packages is `test_protocol_clients.py`; the
client-reducer checks of the approval, resume and frontend-tool paths are in
`test_protocol_deployed.py`. In process: only the check that injects a failure into the
translator."""

from __future__ import annotations

import json
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentlog.gateway.adapters import nats_routes

from tests.apps.protocol_app import TOOLS as APP_TOOLS
from tests.support.adapters_routes import (
    TRANSPORTS,
    Deployed,
    Transport,
    nats_request,
    open_deployed,
    open_stack,
)
from tests.support.http_stack import uid
from tests.support.protocol_verify.agui import verify_agui_stream
from tests.support.protocol_verify.reducers import AguiClient, normalise_agui
from tests.support.topology import Deployment

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
async def stack(protocol_deployment: Deployment) -> AsyncIterator[Deployed]:
    async with open_deployed(protocol_deployment) as value:
        yield value


@pytest.fixture
async def secured(tokens_deployment: Deployment) -> AsyncIterator[Deployed]:
    """The deployment with tokens (conftest.py `TOKENS`; this module's tenants are C and D) and
    CORS origins (`CORS_ORIGINS`)."""
    async with open_deployed(tokens_deployment) as value:
        yield value


def test_verifiers_live_in_tests_not_in_product_code() -> None:
    """The stream verifiers are test code; nothing in src/agentlog/ imports them."""
    adapters = ROOT / "src" / "agentlog" / "adapters"
    assert not (adapters / "agui_verify.py").exists()
    assert not (adapters / "aisdk_verify.py").exists()
    for path in (ROOT / "src" / "agentlog").rglob("*.py"):
        text = path.read_text()
        assert "agui_verify" not in text and "aisdk_verify" not in text and "protocol_verify" not in text, path


# -- the NATS adapter subjects check tokens and tenants like HTTP -------------------------------

def _agui_body(thread: str, run: str, text: str = "hi") -> dict[str, Any]:
    return {"threadId": thread, "runId": run, "messages": [{"id": f"u-{run}", "role": "user", "content": text}],
            "tools": [], "context": [], "state": {}, "forwardedProps": {}}


def _aisdk_body(thread: str, text: str = "hi") -> dict[str, Any]:
    return {"id": thread, "trigger": "submit-message",
            "messages": [{"id": f"u-{thread}-{text}", "role": "user", "parts": [{"type": "text", "text": text}]}]}


async def test_nats_adapters_check_tokens_and_tenants(secured: Deployed) -> None:
    stack = secured
    tx, ty, ta, tb = uid("tx"), uid("ty"), uid("ta"), uid("tb")
    ag_subject, ai_subject = nats_routes.AGUI_SUBJECT, nats_routes.AISDK_SUBJECT
    # no token / a wrong token: one error event with the micro error headers, nothing written
    for token, status, code in ((None, "401", "unauthorized"), ("nope", "403", "forbidden")):
        for subject, body in ((ag_subject, _agui_body(tx, uid("r"))), (ai_subject, _aisdk_body(ty))):
            replies = await nats_request(stack, subject, body, agent="open", token=token)  # type: ignore[arg-type]
            assert len(replies) == 1, [r.data for r in replies]
            assert replies[0].headers["Nats-Service-Error-Code"] == status
            event = json.loads(replies[0].data)
            assert event["type"] in ("RUN_ERROR", "error")
            assert event.get("code", code) == code
            # the body says what the headers say, as the HTTP answer does
            assert event.get("message", event.get("errorText")) == replies[0].headers["Nats-Service-Error"], event
    assert await stack.events_of(tx) == [] and await stack.events_of(ty) == []

    async def ask(subject: str, body: Any, token: str) -> list[dict[str, Any]]:
        replies = await nats_request(stack, subject, body, agent="open", token=token)  # type: ignore[arg-type]
        return [json.loads(m.data) for m in replies]

    # tenant C creates its threads; they are recorded under its prefix
    events = await ask(ag_subject, _agui_body(ta, uid("r"), "text: one"), "tc")
    assert events[-1]["type"] == "RUN_FINISHED", events[-1]
    parts = await ask(ai_subject, _aisdk_body(tb, "text: two"), "tc")
    assert parts[-1] == {"type": "finish", "finishReason": "stop"}
    for thread in (ta, tb):
        created = (await stack.events_of(thread))[0]
        assert created.resource_id == "tenantC"
    # tenant D cannot resume / continue them: answered like an unknown thread, nothing written
    before = await stack.last_seq()
    events = await ask(ag_subject, _agui_body(ta, uid("r"), "text: three"), "td")
    assert [e["type"] for e in events] == ["RUN_ERROR"] and events[0]["code"] == "thread_not_found"
    parts = await ask(ai_subject, _aisdk_body(tb, "text: x"), "td")
    assert [p["type"] for p in parts] == ["error"]
    assert await stack.last_seq() == before
    # an unscoped token sees everything
    events = await ask(ag_subject, _agui_body(ta, uid("r"), "text: four"), "admin")
    assert events[-1]["type"] == "RUN_FINISHED"


# -- an unexpected producer error still ends the AG-UI stream ----------------------------------


@pytest.mark.parametrize("tr", TRANSPORTS, ids=lambda t: t.name)
@pytest.mark.parametrize("where", ["content", "forwardedProps"])
async def test_agui_lone_surrogate_is_refused_before_the_stream(stack: Deployed, tr: Transport,
                                                                where: str) -> None:
    """A lone surrogate in content or forwardedProps never reaches the producer, where it would fail
    once the stream is open: the one request decoder (`agentlog.gateway.operations.json_input`)
    refuses it as `invalid_json` (HTTP 400, NATS one RUN_ERROR) and nothing is written."""
    thread = uid("t")
    body = _agui_body(thread, uid("r"))
    if where == "content":
        body["messages"][0]["content"] = "bad \ud800 text"
    else:
        body["forwardedProps"] = {"x": "\ud800"}
    raw = json.dumps(body)  # ASCII escapes: the lone surrogate arrives as `\\ud800`
    answer = await tr.agui(stack, json.loads(raw), "open")  # type: ignore[arg-type]
    assert answer.rejected is not None, answer.events
    assert answer.rejected["code"] == "invalid_json"
    assert await stack.events_of(thread) == []


@pytest.mark.parametrize("tr", TRANSPORTS, ids=lambda t: t.name)
async def test_agui_stream_ends_with_run_error_on_unexpected_error(nats_server: Any, tr: Transport,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the producer raises once the stream is open (here: the translator, with a lone
    surrogate in the exception text), the stream ends with RUN_ERROR `internal_error` whose text
    can be encoded, so the client is never left on an HTTP stream that does not end. In process:
    it patches the translator."""
    from agentlog.gateway.adapters.agui import translator as agui

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


# -- the client's reducer ends in the server's state --------------------------------------------


async def server_view(stack: Deployed, thread: str) -> tuple[list[dict[str, Any]], Any, list[dict[str, Any]]]:
    """What GET says (all three read the log, not a lagging view): AG-UI messages, thread state,
    AI SDK messages."""
    out = []
    for path in (f"/v1/ag-ui/threads/{thread}/messages", f"/v1/threads/{thread}/state",
                 f"/v1/ai-sdk/threads/{thread}/messages"):
        async with stack.client.get(path) as resp:
            assert resp.status == 200, await resp.text()
            out.append(await resp.json())
    return out[0]["messages"], out[1]["state"], out[2]["messages"]


@pytest.mark.parametrize("tr", TRANSPORTS, ids=lambda t: t.name)
async def test_agui_live_text_and_tool_call_build_the_servers_messages(stack: Deployed, tr: Transport) -> None:
    """Text streamed live, then a tool call of the same message, then the final text. WITHOUT the
    MESSAGES_SNAPSHOT repair the client already holds exactly the server's messages (no duplicate
    text, no tool-call-only message, same order), and with it too."""
    thread = uid("t")
    body = {"threadId": thread, "runId": uid("r"), "tools": [], "context": [], "state": {}, "forwardedProps": {},
            "messages": [{"id": uid("u"), "role": "user", "content": "add: the numbers"}]}
    answer = await tr.agui(stack, body, "open")  # type: ignore[arg-type]
    events = verify_agui_stream(answer.events)
    assert sum(e.type == "TEXT_MESSAGE_CONTENT" for e in events) > 2  # it did stream live
    live = AguiClient().apply_all(events, snapshots=False)
    full = AguiClient().apply_all(events)
    messages, state, _ = await server_view(stack, thread)
    assert live.problems == [] and full.problems == []
    assert normalise_agui(live.messages) == normalise_agui(messages)
    assert normalise_agui(full.messages) == normalise_agui(messages)
    assert full.state == state == {"last_sum": 3}
    starts = [e for e in events if e.type == "TOOL_CALL_START"]
    assert [s.parent_message_id for s in starts] == [messages[1]["id"]]


# -- CORS, GET /v1/agents, adapter request bodies in /openapi.json -----------------------------

ORIGIN = "http://127.0.0.1:5173"


async def test_cors_for_browser_clients(secured: Deployed) -> None:
    """`tokens_deployment` allows `ORIGIN` (AGENTLOG_CORS_ORIGINS, conftest.py)."""
    stack = secured
    # preflight: no token, no route, still answered for an allowed origin
    resp = await stack.client.options("/v1/ag-ui/agents/open/runs", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert resp.status == 204
    assert resp.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "POST" in resp.headers["Access-Control-Allow-Methods"]
    assert resp.headers["Access-Control-Allow-Headers"] == "authorization, content-type"
    # a streamed answer carries the headers too (set before the SSE response is sent)
    resp = await stack.client.post("/v1/ai-sdk/agents/open/runs", data=json.dumps(_aisdk_body(uid("c"), "text: hi")),
                                   headers={"Origin": ORIGIN, "Authorization": "Bearer admin"})
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


async def test_cors_off_by_default(stack: Deployed) -> None:
    """`protocol_deployment` sets no AGENTLOG_CORS_ORIGINS."""
    async with stack.client.get("/health", headers={"Origin": ORIGIN}) as resp:
        assert "Access-Control-Allow-Origin" not in resp.headers


async def test_agents_listing_and_adapter_bodies_in_openapi(stack: Deployed) -> None:
    resp = await stack.client.get("/v1/agents")
    assert resp.status == 200
    agents = {a["id"]: a for a in (await resp.json())["agents"]}
    agent = agents["open"]
    assert agent["description"] == ""
    tools = {t["name"]: t for t in agent["tools"]}
    assert set(tools) == {t.name for t in APP_TOOLS}
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
