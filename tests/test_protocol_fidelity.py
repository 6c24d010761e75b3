"""Issue #14 (protocol fidelity): what the official AG-UI / AI SDK v6 clients need to end in the
server's state, checked at the translator and session level on a real nats-server. The Node
check with the official npm packages is `test_protocol_clients.py`."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from gateway.adapters import nats_routes

from test_adapters_routes_support import TRANSPORTS, Transport, nats_request, open_stack

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_verifiers_live_in_tests_not_in_product_code() -> None:
    """Item 10: the stream verifiers are test code; nothing in gateway/ imports them."""
    adapters = ROOT / "gateway" / "adapters"
    assert not (adapters / "agui_verify.py").exists()
    assert not (adapters / "aisdk_verify.py").exists()
    for path in (ROOT / "gateway").rglob("*.py"):
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
async def test_agui_stream_ends_with_run_error_on_unexpected_error(nats_server: Any, tr: Transport,
                                                                   where: str) -> None:
    async with open_stack(nats_server, ["fine"]) as stack:
        body = _agui_body("t1", "r1")
        if where == "content":
            body["messages"][0]["content"] = "bad \ud800 text"
        else:
            body["forwardedProps"] = {"x": "\ud800"}
        raw = json.dumps(body)  # ASCII escapes: the lone surrogate arrives as `\\ud800`
        answer = await tr.agui(stack, json.loads(raw))
        assert answer.events, "the stream must end with an event"
        assert answer.events[-1]["type"] == "RUN_ERROR", answer.events
        assert answer.events[-1]["code"] == "internal_error"
        assert "\ud800" not in json.dumps(answer.events[-1], ensure_ascii=False)
        if where == "content":  # the run could not record its input: nothing half-written
            assert await stack.events_of("t1") == []
