"""The protocol adapters and the reads after them, against what users run: `agentlog serve`,
and `agentlog gateway` + `agentlog worker` (tests/support/topology.py), with the scripted app
tests/apps/protocol_app.py (a scenario is named by the first word of the user message).

What only shows there: the run executes on a worker that streams live deltas on core NATS
while the gateway follows the log, so a whole step (and the next one) can reach the adapter
before the commits it comes after; and the gateway's views are a projection that may not have
applied the caller's write yet when its reply (202, or the end of a stream) arrives.

One deployment per topology serves the session (`protocol_deployment`); every test uses its
own threads.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support.adapters_routes import TRANSPORTS, Deployed, Http, Transport, open_deployed
from tests.support.protocol_verify.agui import verify_agui_stream
from tests.support.protocol_verify.aisdk import parse_ui_sse, verify_ui_stream
from tests.support.protocol_verify.reducers import AguiClient, AiSdkChat, normalise_agui, normalise_aisdk
from tests.support.topology import Deployment

PICK = {"name": "pick_color", "description": "Let the user pick a color",
        "parameters": {"type": "object", "properties": {}}}


@pytest.fixture
async def stack(protocol_deployment: Deployment) -> AsyncIterator[Deployed]:
    """The shared deployment of tests/apps/protocol_app.py, one per topology (conftest.py)."""
    async with open_deployed(protocol_deployment) as value:
        yield value


def uid(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


def agui_input(thread: str, client: AguiClient | None = None, *extra: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """A request as `HttpAgent` builds it: the client's messages (activity ones left out) + extra."""
    history = [m for m in (client.messages if client else []) if m.get("role") != "activity"]
    return {"threadId": thread, "runId": uid("r"), "messages": [*history, *extra], "tools": [], "context": [],
            "state": client.state if client else {}, "forwardedProps": {}, **kw}


def user(text: str) -> dict[str, Any]:
    return {"id": uid("u"), "role": "user", "content": text}


async def server_view(stack: Deployed, thread: str) -> tuple[list[dict[str, Any]], Any, list[dict[str, Any]]]:
    """AG-UI messages, thread state, AI SDK messages, as the gateway answers them."""
    out = []
    for path in (f"/v1/ag-ui/threads/{thread}/messages", f"/v1/threads/{thread}/state",
                 f"/v1/ai-sdk/threads/{thread}/messages"):
        async with stack.client.get(path) as resp:
            assert resp.status == 200, await resp.text()
            out.append(await resp.json())
    return out[0]["messages"], out[1]["state"], out[2]["messages"]


def _ids(events: list[Any], kind: str, key: str) -> list[str]:
    return [e[key] for e in events if e["type"] == kind]


# -- the streams ---------------------------------------------------------------------------------


@pytest.mark.parametrize("tr", TRANSPORTS, ids=lambda t: t.name)
async def test_agui_starts_each_message_and_tool_call_once(stack: Deployed, tr: Transport) -> None:
    """Text, a tool call, its result, the next step's text: each message and call is started
    once, and WITHOUT the closing MESSAGES_SNAPSHOT the client already holds the server's
    messages. On a worker the next step's deltas can arrive before the step's commit; that commit
    must not start the text and the call a second time."""
    thread = uid("t")
    answer = await tr.agui(stack, agui_input(thread, None, user("add: the numbers")), agent="open")
    events = verify_agui_stream(answer.events)
    assert events[-1].type == "RUN_FINISHED"
    wire = answer.events
    for kind, key in (("TEXT_MESSAGE_START", "messageId"), ("TOOL_CALL_START", "toolCallId")):
        ids = _ids(wire, kind, key)
        assert len(ids) == len(set(ids)), (kind, [e["type"] for e in wire])
    messages, state, _ = await server_view(stack, thread)
    live = AguiClient().apply_all(events, snapshots=False)
    assert live.problems == [] and normalise_agui(live.messages) == normalise_agui(messages)
    assert state == {"last_sum": 3}


@pytest.mark.parametrize("tr", TRANSPORTS, ids=lambda t: t.name)
async def test_aisdk_makes_one_tool_part_per_call(stack: Deployed, tr: Transport) -> None:
    """The official `ai` client keeps one tool part per call: `tool-input-start` once, and the
    step is not finished while its call's input is still streaming: the step's `finish-step`
    comes after its call's `tool-input-available` however early the next step's first delta
    arrives, and the step's commit does not start the call again (that would make two tool
    parts, one stuck at `input-streaming`)."""
    chat = AiSdkChat([{"id": uid("u"), "role": "user", "parts": [{"type": "text", "text": "add: x"}]}])
    thread = uid("c")
    answer = await tr.aisdk(stack, {"id": thread, "trigger": "submit-message", "messages": chat.messages},
                            agent="open")
    verify_ui_stream(answer.events)
    starts = _ids(answer.events, "tool-input-start", "toolCallId")
    assert len(starts) == len(set(starts)) == 1, [p["type"] for p in answer.events]
    types = [p["type"] for p in answer.events]
    assert types.index("tool-input-available") < types.index("finish-step"), types
    chat.receive(answer.events)
    _, _, history = await server_view(stack, thread)
    assert chat.problems == [] and chat.errors == []
    assert normalise_aisdk(chat.messages) == normalise_aisdk(history)
    assert all(p.get("state") != "input-streaming" for p in chat.messages[-1]["parts"])
    texts = [p["text"] for p in chat.messages[-1]["parts"] if p["type"] == "text"]
    assert texts == ["Let me add those numbers", "The sum is three."]


async def test_agui_resume_retried_by_a_client_that_lost_the_answer(stack: Deployed) -> None:
    """The client lost the resume's answer and sends the same resume again: nothing is written,
    the replay starts from the state as of the decision, so its deltas apply once."""
    http = TRANSPORTS[0]
    thread, client = uid("t"), AguiClient()
    answer = await http.agui(stack, agui_input(thread, client, user("log: x")), agent="sequential")
    client.apply_all(verify_agui_stream(answer.events))
    (interrupt,) = client.pending_interrupts
    lost = copy.deepcopy(client)
    resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True}}]
    client.apply_all(verify_agui_stream(
        (await http.agui(stack, agui_input(thread, client, resume=resume), agent="sequential")).events))
    seq = await stack.last_seq()
    lost.apply_all(verify_agui_stream(
        (await http.agui(stack, agui_input(thread, lost, resume=resume), agent="sequential")).events))
    assert await stack.last_seq() == seq
    messages, state, _ = await server_view(stack, thread)
    for c in (client, lost):
        assert c.problems == [] and c.state == state == {"log": ["x"]}
        assert normalise_agui(c.messages) == normalise_agui(messages)


@pytest.mark.parametrize("tr", TRANSPORTS, ids=lambda t: t.name)
async def test_aisdk_error_answer_creates_no_message(stack: Deployed, tr: Transport) -> None:
    """An approval for no open call: an error answer without `start.messageId` (no phantom
    assistant message on the client) and nothing written."""
    thread = uid("c")
    chat = AiSdkChat([{"id": uid("u"), "role": "user", "parts": [{"type": "text", "text": "text: hi"}]}])
    chat.receive((await tr.aisdk(stack, {"id": thread, "trigger": "submit-message", "messages": chat.messages},
                                 agent="open")).events)
    before = copy.deepcopy(chat.messages)
    bogus = {"id": uid("a"), "role": "assistant", "parts": [
        {"type": "tool-echo", "toolCallId": "nope", "state": "approval-responded", "input": {},
         "approval": {"id": "nope", "approved": True}}]}
    seq = await stack.last_seq()
    answer = await tr.aisdk(stack, {"id": thread, "trigger": "submit-message", "messages": [*before, bogus]},
                            agent="open")
    assert [p["type"] for p in answer.events][-2:] == ["error", "finish"]
    assert all(p.get("messageId") is None for p in answer.events if p["type"] == "start")
    chat.receive(answer.events)
    assert chat.messages == before and chat.errors
    assert await stack.last_seq() == seq


@pytest.mark.parametrize("approved", [True, False], ids=["approve", "deny"])
async def test_aisdk_history_keeps_approval_and_denial(stack: Deployed, approved: bool) -> None:
    http = TRANSPORTS[0]
    thread = uid("c")
    chat = AiSdkChat([{"id": uid("u"), "role": "user", "parts": [{"type": "text", "text": "approval: deploy"}]}])
    chat.receive((await http.aisdk(stack, {"id": thread, "trigger": "submit-message", "messages": chat.messages},
                                   agent="sequential")).events)
    (part,) = [p for p in chat.messages[-1]["parts"] if p["type"] == "tool-echo"]
    assert part["state"] == "approval-requested"
    part.update(state="approval-responded", approval={**part["approval"], "approved": approved})
    answer = await http.aisdk(stack, {"id": thread, "trigger": "submit-message", "messages": chat.messages},
                              agent="sequential")
    verify_ui_stream(answer.events, known_tool_calls=[part["toolCallId"]])
    chat.receive(answer.events)
    _, _, history = await server_view(stack, thread)
    (kept,) = [p for p in history[-1]["parts"] if p["type"] == "tool-echo"]
    assert kept["approval"]["id"] == part["toolCallId"] and kept["approval"]["approved"] is approved
    assert kept["state"] == ("output-available" if approved else "output-denied")
    assert normalise_aisdk(chat.messages) == normalise_aisdk(history)


@pytest.mark.parametrize("tr", TRANSPORTS, ids=lambda t: t.name)
async def test_aisdk_client_tool_output_answers_a_frontend_tool(stack: Deployed, tr: Transport) -> None:
    thread = uid("c")
    chat = AiSdkChat([{"id": uid("u"), "role": "user", "parts": [{"type": "text", "text": "frontend: pick"}]}])
    chat.receive((await tr.aisdk(stack, {"id": thread, "trigger": "submit-message", "messages": chat.messages},
                                 agent="open")).events)
    (part,) = [p for p in chat.messages[-1]["parts"] if p["type"] == "tool-pick_color"]
    assert part["state"] == "input-available"
    part.update(state="output-available", output={"color": "blue"})  # what addToolOutput does
    answer = await tr.aisdk(stack, {"id": thread, "trigger": "submit-message", "messages": chat.messages},
                            agent="open")
    assert answer.rejected is None, answer.rejected
    verify_ui_stream(answer.events, known_tool_calls=[part["toolCallId"]])
    chat.receive(answer.events)
    _, _, history = await server_view(stack, thread)
    assert chat.errors == [] and normalise_aisdk(chat.messages) == normalise_aisdk(history)
    async with stack.client.get(f"/v1/runs/{chat.messages[-1]['id']}") as resp:
        view = await resp.json()
    assert view["status"] == "done" and view["calls"][part["toolCallId"]]["result"] == {"color": "blue"}


async def test_agui_resume_sent_again_by_a_client_that_saw_the_answer(stack: Deployed) -> None:
    """An approval-gated tool that patches the state, approved, then the same resume sent again
    by the client that got the first answer: the replay sends nothing it already holds, so it
    ends with the server's messages (not a second tool message under one id, 7 vs 6) and state."""
    http = TRANSPORTS[0]
    thread, client = uid("t"), AguiClient()
    answer = await http.agui(stack, agui_input(thread, client, user("log: append x after approval")),
                             agent="sequential")
    client.apply_all(verify_agui_stream(answer.events))
    (interrupt,) = client.pending_interrupts
    resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True}}]
    answer = await http.agui(stack, agui_input(thread, client, resume=resume), agent="sequential")
    client.apply_all(verify_agui_stream(answer.events))
    seq = await stack.last_seq()
    request = agui_input(thread, client, resume=resume)
    answer = await http.agui(stack, request, agent="sequential")
    replay = verify_agui_stream(answer.events)
    assert await stack.last_seq() == seq  # a replay: nothing written
    held = {m["id"] for m in request["messages"]}
    assert not held & set(_ids(answer.events, "TOOL_CALL_RESULT", "messageId"))
    assert not held & set(_ids(answer.events, "TEXT_MESSAGE_START", "messageId"))
    client.apply_all(replay)
    messages, state, _ = await server_view(stack, thread)
    assert client.problems == [] and state == client.state == {"log": ["x"]}
    assert normalise_agui(client.messages) == normalise_agui(messages)


async def test_aisdk_resume_stream_after_an_approval(stack: Deployed) -> None:
    """`GET /v1/ai-sdk/runs/{id}/stream` after an approved run: the client's message (no part
    left at `input-streaming`, which would make the real client continue a stale message
    instead of taking the replay) is replaced by the replay and ends as the history."""
    http = TRANSPORTS[0]
    thread = uid("c")
    chat = AiSdkChat([{"id": uid("u"), "role": "user", "parts": [{"type": "text", "text": "approval: deploy"}]}])
    first = (await http.aisdk(stack, {"id": thread, "trigger": "submit-message", "messages": chat.messages},
                              agent="sequential")).events
    verify_ui_stream(first)
    chat.receive(first)
    (part,) = [p for p in chat.messages[-1]["parts"] if p["type"] == "tool-echo"]
    assert part["state"] == "approval-requested"
    part.update(state="approval-responded", approval={**part["approval"], "approved": True})
    second = (await http.aisdk(stack, {"id": thread, "trigger": "submit-message", "messages": chat.messages},
                               agent="sequential")).events
    verify_ui_stream(second, known_tool_calls=[part["toolCallId"]])
    chat.receive(second)
    assert all(p.get("state") != "input-streaming" for p in chat.messages[-1]["parts"])
    _, _, history = await server_view(stack, thread)
    async with stack.client.get(f"/v1/ai-sdk/runs/{first[0]['messageId']}/stream") as resp:
        parts, done = parse_ui_sse(await resp.text())
    assert done and verify_ui_stream(parts)
    resumed = AiSdkChat(copy.deepcopy(chat.messages))
    resumed.receive(parts, resume=True)
    assert normalise_aisdk(resumed.messages) == normalise_aisdk(history) == normalise_aisdk(chat.messages)


async def test_frontend_tool_pending_refusal_names_the_tool_calls(stack: Deployed) -> None:
    """A run that ended with `pendingToolCallIds` (no interrupt) and a new user message instead
    of the tool result: refused as `missing_tool_result` naming the call, not `missing_resume`
    about interrupts the client never received; nothing is written."""
    http = TRANSPORTS[0]
    thread, client = uid("t"), AguiClient()
    answer = await http.agui(stack, agui_input(thread, client, user("frontend: pick a color"), tools=[PICK]),
                             agent="sequential")
    client.apply_all(verify_agui_stream(answer.events))
    (pending,) = client.pending_tool_call_ids
    assert client.pending_interrupts == []
    seq = await stack.last_seq()
    answer = await http.agui(stack, agui_input(thread, client, user("never mind"), tools=[PICK]), agent="sequential")
    error = answer.events[-1]
    assert error["type"] == "RUN_ERROR" and error["code"] == "missing_tool_result", answer.events
    assert pending in error["message"] and "interrupt" not in error["message"]
    assert await stack.last_seq() == seq


async def test_agents_lists_the_apps_tools(stack: Deployed) -> None:
    async with stack.client.get("/v1/agents") as resp:
        assert resp.status == 200
        agents = {a["id"]: a for a in (await resp.json())["agents"]}
    assert set(agents) == {"sequential", "parallel_batch_approval", "open", "priced", "tunable"}
    tools = {t["name"]: t for t in agents["open"]["tools"]}
    assert {"add", "echo", "pick_color"} <= set(tools)
    assert tools["add"]["parameters"]["properties"].keys() == {"a", "b"}
    # the NATS micro service answers the same catalog
    reply = await stack.nc.request("agentlog.api.agents.list", b"{}", timeout=10)
    assert json.loads(reply.data) == {"agents": list(agents.values())}


# -- reads show the caller's last write -----------------------------------------------------------


async def test_run_read_right_after_its_202(stack: Deployed) -> None:
    """`GET /v1/runs/{id}` right after `POST /v1/runs` answered 202 finds the run, every time,
    even while the gateway's projection has not applied the start yet (not a 404)."""
    for _ in range(20):
        async with stack.client.post("/v1/runs", json={"agent_id": "open", "messages": "text: hi"}) as resp:
            assert resp.status == 202, await resp.text()
            started = await resp.json()
        async with stack.client.get(f"/v1/runs/{started['run_id']}") as resp:
            assert resp.status == 200, await resp.text()
            view = await resp.json()
        assert view["run_id"] == started["run_id"] and view["last_seq"] >= started["seq"]
        async with stack.client.get(f"/v1/threads/{started['thread_id']}") as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["version"] >= started["seq"]


@pytest.mark.parametrize("protocol", ["ag-ui", "ai-sdk"])
async def test_reads_after_a_stream_ends_show_its_writes(stack: Deployed, protocol: str) -> None:
    """Right after an AG-UI / AI SDK stream ends, the run and thread reads show the run's end,
    not the views' older version (`running`)."""
    http: Http = TRANSPORTS[0]  # type: ignore[assignment]
    for _ in range(5):
        thread = uid("t")
        if protocol == "ag-ui":
            answer = await http.agui(stack, agui_input(thread, None, user("state: add")), agent="open")
            assert answer.events[-1]["type"] == "RUN_FINISHED"
            run_id = await stack.run_of(thread)
        else:
            body = {"id": thread, "trigger": "submit-message",
                    "messages": [{"id": uid("u"), "role": "user", "parts": [{"type": "text", "text": "state: add"}]}]}
            answer = await http.aisdk(stack, body, agent="open")
            assert answer.events[-1] == {"type": "finish", "finishReason": "stop"}
            run_id = answer.events[0]["messageId"]
        head = await stack.store.thread_version(thread)
        async with stack.client.get(f"/v1/runs/{run_id}") as resp:
            run = await resp.json()
            assert resp.status == 200, run
        assert run["status"] == "done" and run["last_seq"] == head
        async with stack.client.get(f"/v1/threads/{thread}") as resp:
            view = await resp.json()
        assert view["version"] == head and view["state"] == {"last_sum": 3}
        # the stream's end carries its position: a listing given it as min_seq shows the run done
        (position,) = ([e["value"] for e in answer.events if e.get("name") == "agentlog.position"]
                       if protocol == "ag-ui" else
                       [p["data"] for p in answer.events if p["type"] == "data-agentlog-position"])
        assert position == {"seq": head}
        async with stack.client.get("/v1/runs", params={"thread_id": thread, "min_seq": position["seq"]}) as resp:
            listed = (await resp.json())["runs"]
        assert [(r["run_id"], r["status"]) for r in listed] == [(run_id, "done")]


async def test_reads_after_an_a2a_stream_ends_show_its_writes(stack: Deployed) -> None:
    """The same after an A2A `SendStreamingMessage` (task id = run id, context id = thread)."""
    from tests.gateway.test_a2a import client_for, text_message

    streamer = await client_for(stack.base, "open", streaming=True)
    for n in range(3):
        events = [ev async for ev in streamer.send_message(text_message("state: add", mid=uid(f"m{n}")))]
        task = events[0].task
        assert events[-1].HasField("status_update")
        head = await stack.store.thread_version(task.context_id)
        async with stack.client.get(f"/v1/runs/{task.id}") as resp:
            run = await resp.json()
            assert resp.status == 200, run
        assert run["status"] == "done" and run["last_seq"] == head
        async with stack.client.get(f"/v1/threads/{task.context_id}") as resp:
            view = await resp.json()
        assert view["version"] == head and view["state"] == {"last_sum": 3}
