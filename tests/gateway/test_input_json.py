"""Hostile JSON is a 400 `{error, code}` on EVERY JSON route, never a 500, and writes nothing. Every
route of both modes (serve: in-process runtime; gateway: work queue + worker) over all three
transports (HTTP, the NATS micro service with its error headers, the adapters' NATS subjects with
one error event) x {a body nested 1,000 deep, a value nested past `MAX_DEPTH`, a lone surrogate in
each string field of a realistic body (a decision result and reason, forwardedProps, an AG-UI resume
payload, messages, metadata, ...)}.

Plain json.loads would raise RecursionError (a 500) on deep nesting and let `"\\ud800"` through to
the UTF-8 encoders (msgspec, the log, the command queue): 500s, and in gateway mode an orphan
thread. The routes are checked against what users run (`protocol_deployment`: `agentlog serve`, and
`agentlog gateway` + `agentlog worker`). The decoder itself
(`agentlog.gateway.operations.json_input`) gets property tests at the end."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentlog.gateway.adapters import nats_routes
from agentlog.gateway.operations.json_input import MAX_DEPTH, InvalidJson, check_depth, parse_json

from tests.support.http_stack import uid
from tests.support.input import TIMEOUT, Stack, adapter_call, http_call, nats_call, open_deployed, waiting_run
from tests.support.topology import Deployment

SURROGATE = "\ud800"


def _targets(t: str, r: str, c: str, agent: str, tool: str = "echo") -> list[tuple[str, str, dict[str, Any]]]:
    """(transport, route, realistic body) for every JSON route; t/r/c: a waiting run's ids (of
    `agent`, waiting for an approval of `tool`)."""
    decision = {"target_id": c, "decision_id": "d-1", "action": "resume", "result": {"note": "ok"}, "reason": "why"}
    start = {"agent_id": agent, "messages": [{"role": "user", "content": "hi"}], "resource_id": "res-1",
             "thread_id": "t-new"}
    agui = {"threadId": t, "runId": "agui-1", "messages": [{"id": "m-1", "role": "user", "content": "hi"}],
            "tools": [], "context": [{"description": "d", "value": "v"}], "state": {"s": "v"},
            "forwardedProps": {"k": "v"}}
    agui_resume = {**agui, "messages": [], "resume": [{"interruptId": c, "status": "resolved",
                                                       "payload": {"approved": "yes"}}]}
    aisdk = {"id": t, "messages": [{"id": "m-2", "role": "user", "parts": [{"type": "text", "text": "hi"}]}]}
    aisdk_approval = {"id": t, "messages": [{"id": "m-3", "role": "assistant", "parts": [
        {"type": f"tool-{tool}", "toolCallId": c, "state": "approval-responded",
         "approval": {"id": c, "approved": True, "reason": "fine"}}]}]}
    return [
        ("http:POST", "/v1/threads", {"thread_id": "t-other", "resource_id": "res", "metadata": {"k": "v"}}),
        ("http:PATCH", f"/v1/threads/{t}", {"metadata": {"k": "v"}}),
        ("http:POST", "/v1/runs", start),
        ("http:POST", "/v1/runs", {"agent_id": agent, "messages": "hi"}),
        ("http:POST", f"/v1/runs/{r}/inputs", {"decisions": [decision]}),
        ("http:POST", f"/v1/runs/{r}/inputs", {"messages": "more"}),
        ("http:POST", f"/v1/runs/{r}/cancel", {"reason": "stop"}),
        ("http:POST", f"/v1/ag-ui/agents/{agent}/runs", agui),
        ("http:POST", f"/v1/ag-ui/agents/{agent}/runs", agui_resume),
        ("http:POST", f"/v1/ai-sdk/agents/{agent}/runs", aisdk),
        ("http:POST", f"/v1/ai-sdk/agents/{agent}/runs", aisdk_approval),
        ("nats", "agentlog.api.threads.create", {"thread_id": "t-other", "resource_id": "res", "metadata": {"k": "v"}}),
        ("nats", "agentlog.api.threads.get", {"thread_id": t}),
        ("nats", "agentlog.api.threads.list", {"resource_id": "res"}),
        ("nats", "agentlog.api.threads.messages", {"thread_id": t}),
        ("nats", "agentlog.api.runs.start", start),
        ("nats", "agentlog.api.runs.inputs", {"run_id": r, "decisions": [decision]}),
        ("nats", "agentlog.api.runs.inputs", {"run_id": r, "messages": [{"role": "user", "content": "more"}]}),
        ("nats", "agentlog.api.runs.cancel", {"run_id": r, "reason": "stop"}),
        ("nats", "agentlog.api.runs.get", {"run_id": r}),
        ("nats", "agentlog.api.runs.list", {"thread_id": t, "agent_id": agent}),
        ("adapter", nats_routes.AGUI_SUBJECT, agui),
        ("adapter", nats_routes.AGUI_SUBJECT, agui_resume),
        ("adapter", nats_routes.AISDK_SUBJECT, aisdk),
        ("adapter", nats_routes.AISDK_SUBJECT, aisdk_approval),
    ]


def _string_leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(value, str):
        yield path
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _string_leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _string_leaves(v, (*path, i))


def _replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _replaced(value[path[0]], path[1:], new)
    return copy


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


def _variants(body: dict[str, Any]) -> Iterator[tuple[str, bytes]]:
    yield "nested 1000 deep", b"[" * 1000 + b"]" * 1000
    yield "object nested 1000 deep", b'{"a":' * 1000 + b"1" + b"}" * 1000
    first = next(iter(body))
    yield f"{first} nested {MAX_DEPTH + 1} deep", json.dumps({**body, first: _nested(MAX_DEPTH + 1)}).encode()
    for path in _string_leaves(body):  # json.dumps writes the lone surrogate as the escape \ud800
        yield f"lone surrogate at {'.'.join(map(str, path))}", json.dumps(_replaced(body, path, SURROGATE)).encode()


def _object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


async def _problem(s: Stack, transport: str, target: str, data: bytes) -> str | None:
    """None when the answer is a typed 400; else what is wrong with it."""
    if transport.startswith("http:"):
        status, raw = await http_call(s, transport[5:], target, data)
        body = _object(raw)
        ok = status == 400 and isinstance(body.get("error"), str) and isinstance(body.get("code"), str)
        return None if ok else f"HTTP {status} {raw[:200]!r}"
    if transport == "nats":
        code, desc, raw = await nats_call(s, target, data)
        body = _object(raw)
        ok = code == "400" and bool(desc) and isinstance(body.get("error"), str) and isinstance(body.get("code"), str)
        return None if ok else f"NATS {code} {desc!r} {raw[:200]!r}"
    events = await adapter_call(s, target, data)
    kinds = [e.get("type") for e in events]
    text = json.dumps(events)[:200]
    if kinds not in (["RUN_ERROR"], ["error"]) or "internal error" in text:
        return f"adapter events {text}"
    return None


async def test_hostile_json_is_a_typed_400_on_every_route(protocol_deployment: Deployment) -> None:
    async with asyncio.timeout(TIMEOUT * 4), open_deployed(protocol_deployment) as s:
        t, r, c = await waiting_run(s)
        head = await s.store.last_seq()
        problems = []
        for transport, target, body in _targets(t, r, c, s.agent):
            for name, data in _variants(body):
                try:
                    async with asyncio.timeout(5):
                        problem = await _problem(s, transport, target, data)
                except TimeoutError:
                    problem = "no answer within 5 s"
                if problem is not None:
                    problems.append(f"{transport} {target} [{name}]: {problem}")
        assert not problems, f"{len(problems)} answers are not a typed 400:\n" + "\n".join(problems)
        assert await s.store.last_seq() == head  # nothing half-written by any of them
        async with s.http.get(f"/v1/runs/{r}", params={"min_seq": str(head)}) as resp:
            assert (await resp.json())["status"] == "waiting"  # and the run is untouched


# == the decoder (pure) ==========================================================================

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=20,
)


@given(_json)
def test_parse_json_round_trips_every_json_value(value: Any) -> None:
    assert parse_json(json.dumps(value).encode()) == value
    assert parse_json(json.dumps(value, ensure_ascii=False)) == value


@given(_json, st.sampled_from(["\ud800", "\udfff", "a\udc00b"]))
def test_parse_json_refuses_lone_surrogates_anywhere(value: Any, bad: str) -> None:
    with pytest.raises(InvalidJson):
        parse_json(json.dumps([value, {"k": bad}]).encode())
    with pytest.raises(InvalidJson):  # raw surrogate bytes (json.loads of bytes lets them through)
        parse_json(json.dumps(bad, ensure_ascii=False).encode("utf-8", "surrogatepass"))


@given(st.integers(min_value=1, max_value=3 * MAX_DEPTH))
def test_depth_bound_is_exact(depth: int) -> None:
    body = json.dumps(_nested(depth)).encode()
    if depth <= MAX_DEPTH:
        assert parse_json(body) == _nested(depth)
    else:
        with pytest.raises(InvalidJson):
            parse_json(body)
    check_depth({"a": {"b": [1]}}, limit=3)
    with pytest.raises(InvalidJson):
        check_depth({"a": {"b": [1]}}, limit=2)


@pytest.mark.parametrize("raw", [b"[" * 100_000, b"NaN", b"1e400", b"{", b"\xff", b'"\\ud800"'])
def test_parse_json_refuses_with_one_typed_error(raw: bytes) -> None:
    with pytest.raises(InvalidJson) as err:
        parse_json(raw)
    assert err.value.code == "invalid_json"


# == JSON inside a string: a frontend tool's result (AG-UI `role: tool` content) ==================


@pytest.mark.parametrize("content", ['"a\\ud800b"', "[" * 1000 + "]" * 1000])
async def test_frontend_tool_result_holding_hostile_json_is_taken_as_text(
        protocol_deployment: Deployment, content: str) -> None:
    """The content is parsed as JSON when it is JSON we can store; otherwise it is the text.
    Plain json.loads would give a lone surrogate (the decision commit then fails to encode:
    RUN_ERROR) or raise RecursionError (not a ValueError: the request crashes). protocol_app's
    `confirm` scenario calls `confirm_action`, a frontend tool the request declares."""
    from tests.gateway.test_adapters_routes import agui_ok, run_input, user
    from tests.support.adapters_routes import Http
    from tests.support.adapters_routes import open_deployed as open_adapters

    confirm = {"name": "confirm_action", "description": "d", "parameters": {"type": "object"}}
    thread, first = uid("t"), uid("r")
    async with asyncio.timeout(TIMEOUT), open_adapters(protocol_deployment) as stack:
        events = await agui_ok(Http(), stack, run_input(thread, first, user("confirm: one", uid("u")),  # type: ignore[arg-type]
                                                       tools=[confirm]), "open")
        (call_id,) = events[-1].outcome.pending_tool_call_ids  # AG-UI 1.0: the run ends, the call pending
        result = {"id": uid("m-tool"), "role": "tool", "toolCallId": call_id, "content": content}
        events = await agui_ok(Http(), stack, run_input(thread, uid("r"), result, tools=[confirm]),  # type: ignore[arg-type]
                               "open")
        assert events[-1].type == "RUN_FINISHED" and events[-1].outcome.type == "success"
        async with stack.client.get(f"/v1/runs/{first}") as resp:
            view = await resp.json()
            assert resp.status == 200, view
        assert view["status"] == "done" and view["calls"][call_id]["result"] == content
