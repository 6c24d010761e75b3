"""The A2A server on the gateway, driven by the official a2a-sdk client over 127.0.0.1: agent
card, SendMessage, SendStreamingMessage, GetTask, CancelTask mapped onto runs (task id = run id),
a decision-only message answering a waiting run (HITL), and typed errors for bad requests;
against what users run (`agentlog serve`, and `agentlog gateway` + `agentlog worker`: the shared
`protocol_deployment` of tests/apps/protocol_app.py, and `tokens_deployment` for auth; its agents:
`open` answers, `sequential` asks before `echo`). The public-URL card is checked deployed in
test_hardening_http.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, create_client
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError, TaskNotCancelableError, TaskNotFoundError
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.struct_pb2 import Value

from agentlog.projections.fold import fold_commits

from tests.support.http_stack import Remote, open_remote, uid
from tests.support.topology import Deployment

pytestmark = pytest.mark.asyncio
TIMEOUT = 30
HELLO = "Hello from agentlog, streamed live."


@pytest.fixture
async def s(protocol_deployment: Deployment) -> AsyncIterator[Remote]:
    async with open_remote(protocol_deployment) as value:
        yield value


def base_of(s: Remote) -> str:
    return s.url


def text_message(text: str, *, task_id: str = "", context_id: str = "", mid: str = "m1") -> SendMessageRequest:
    msg = Message(message_id=mid, role=Role.ROLE_USER, parts=[Part(text=text)], task_id=task_id, context_id=context_id)
    return SendMessageRequest(message=msg)


def decision_message(task_id: str, decisions: list[dict[str, Any]]) -> SendMessageRequest:
    data = Value()
    ParseDict({"decisions": decisions}, data)
    msg = Message(message_id=uid("d"), role=Role.ROLE_USER, parts=[Part(data=data)], task_id=task_id)
    return SendMessageRequest(message=msg)


async def client_for(base: str, agent: str, *, streaming: bool) -> Any:
    http = httpx.AsyncClient(timeout=TIMEOUT)
    card = await A2ACardResolver(http, base, f"/a2a/{agent}/.well-known/agent-card.json").get_agent_card()
    return await create_client(card, ClientConfig(streaming=streaming, httpx_client=http))


async def final_task(client: Any, request: SendMessageRequest) -> Any:
    events = [ev async for ev in client.send_message(request)]
    assert len(events) == 1 and events[0].HasField("task"), events
    return events[0].task


async def test_a2a_client_against_our_server(s: Remote) -> None:
    async with asyncio.timeout(TIMEOUT):
        base = base_of(s)
        # the agent card at the well-known path (default agent: the app's first) and per agent
        async with httpx.AsyncClient() as http:
            card = await A2ACardResolver(http, base).get_agent_card()
        assert card.name == "sequential" and card.capabilities.streaming
        assert card.supported_interfaces[0].url == f"{base}/a2a/sequential"
        assert not card.security_schemes and not card.security_requirements  # no tokens: open

        client = await client_for(base, "open", streaming=False)
        task = await final_task(client, text_message("text: hello", mid=uid("m")))
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert task.artifacts[0].parts[0].text == HELLO
        assert [(m.role, m.parts[0].text) for m in task.history] == [(Role.ROLE_USER, "text: hello"),
                                                                     (Role.ROLE_AGENT, HELLO)]
        run = fold_commits([sc async for sc in s.store.read_run(task.id)]).runs[task.id]  # task id = run id
        assert run.thread_id == task.context_id and run.status == "done" and run.agent_id == "open"
        got = await client.get_task(GetTaskRequest(id=task.id))
        assert got.status.state == TaskState.TASK_STATE_COMPLETED and got.id == task.id
        # a follow-up in the same context continues the thread with a new run
        again = await final_task(client, text_message("text: more", context_id=task.context_id, mid=uid("m")))
        assert again.context_id == task.context_id and again.id != task.id

        # streaming: the task, then updates, the answer artifact, the final status
        streamer = await client_for(base, "open", streaming=True)
        events = [ev async for ev in streamer.send_message(text_message("text: stream me", mid=uid("m")))]
        kinds = [ev.WhichOneof("payload") for ev in events]
        assert kinds[0] == "task" and kinds[-1] == "status_update", kinds
        assert "artifact_update" in kinds
        assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
        art = next(ev.artifact_update for ev in events if ev.HasField("artifact_update"))
        assert art.artifact.parts[0].text == HELLO

        # HITL: the run waits -> input-required listing the call; a decision-only message resumes it
        approver = await client_for(base, "sequential", streaming=False)
        waiting = await final_task(approver, text_message("approval: ship", mid=uid("m")))
        assert waiting.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        data = MessageToDict(waiting.status.message.parts[1].data)
        call_id = data["suspended"][0]["call_id"]
        assert data["suspended"][0]["tool"] == "echo"
        done = await final_task(approver, decision_message(waiting.id, [
            {"target_id": call_id, "decision_id": uid("ok"), "action": "resume", "result": {"approved": True}}]))
        assert done.id == waiting.id and done.status.state == TaskState.TASK_STATE_COMPLETED
        assert done.artifacts[0].parts[0].text == "All done."

        # cancel: a waiting task is cancelled; a finished one is not cancelable
        waiting2 = await final_task(approver, text_message("approval: ship again", mid=uid("m")))
        cancelled = await approver.cancel_task(CancelTaskRequest(id=waiting2.id))
        assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
        with pytest.raises(TaskNotCancelableError, match="already finished"):
            await approver.cancel_task(CancelTaskRequest(id=done.id))


async def test_card_urls_are_the_listen_address_whatever_the_host_header(s: Remote) -> None:
    """Without a public URL the card's URL is the address the server listens on (the socket the
    request came in on), never the `Host` the caller sent."""
    async with asyncio.timeout(TIMEOUT):
        base = base_of(s)
        for path in ("/.well-known/agent-card.json", "/a2a/sequential/.well-known/agent-card.json"):
            resp = await s.client.get(path, headers={"Host": "evil.example", "X-Forwarded-Host": "evil.example"})
            card = await resp.json()
            assert resp.status == 200 and "evil.example" not in json.dumps(card)
            assert card["supportedInterfaces"][0]["url"].startswith(f"{base}/a2a/"), (card, base)


async def test_a2a_bad_requests_get_typed_errors(s: Remote) -> None:
    async with asyncio.timeout(TIMEOUT):
        base = base_of(s)
        client = await client_for(base, "sequential", streaming=False)
        with pytest.raises(TaskNotFoundError, match="not found"):
            await client.get_task(GetTaskRequest(id=uid("no-such-run")))
        with pytest.raises(TaskNotFoundError, match="not found"):
            await client.get_task(GetTaskRequest(id="bad id!"))
        waiting = await final_task(client, text_message("approval: ship", mid=uid("m")))
        with pytest.raises(InvalidParamsError, match="unknown_call"):
            await final_task(client, decision_message(waiting.id, [
                {"target_id": "nope", "decision_id": "x", "action": "resume"}]))
        with pytest.raises(InvalidParamsError, match="task_id"):
            await final_task(client, decision_message("", [{"target_id": "c", "decision_id": "x", "action": "resume"}]))
        # raw JSON-RPC: unknown method and malformed JSON are JSON-RPC errors, never a 500
        for body in (b'{"jsonrpc": "2.0", "id": 1, "method": "Nope", "params": {}}', b"{not json"):
            resp = await s.client.post("/a2a/sequential", data=body, headers={"Content-Type": "application/json"})
            assert resp.status == 200
            doc = await resp.json()
            assert doc["error"]["code"] in (-32601, -32700), doc
        resp = await s.client.post("/a2a/ghost", json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {}})
        assert resp.status == 404 and (await resp.json())["code"] == "agent_not_found"
        # hostile JSON (1,000 deep; a lone surrogate) is a parse error, never -32603 internal error
        before = await s.store.last_seq()
        for body in (b"[" * 1000 + b"]" * 1000,
                     b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"x": "\\ud800"}}'):
            resp = await s.client.post("/a2a/sequential", data=body, headers={"Content-Type": "application/json"})
            assert resp.status == 200
            doc = await resp.json()
            assert doc["error"]["code"] == -32700 and doc["error"]["data"]["code"] == "invalid_json", doc
        assert await s.store.last_seq() == before


async def test_a_remote_a2a_agent_as_a_sub_agent(s: Remote) -> None:
    """A local run calls the deployment's agents through `remote_agent_tool` (the a2a-sdk client
    against its A2A server on 127.0.0.1): a completed remote task is the call's result, an
    input-required one suspends the call with a ticket naming the remote task; replay answers
    from the log."""
    from agentlog.runtime import AgentSpec, Runtime
    from agentlog.runtime.models.scripted import ScriptedModel, Turn
    from agentlog.runtime.replay.verify import verify_run
    from agentlog.runtime.toolkits.a2a import remote_agent_tool

    async with asyncio.timeout(TIMEOUT):
        base = base_of(s)
        tools = [remote_agent_tool("ask_open", f"{base}/a2a/open", card_path="/.well-known/agent-card.json"),
                 remote_agent_tool("ask_approver", base, card_path="/a2a/sequential/.well-known/agent-card.json")]
        agents = [AgentSpec(id="boss", model="boss", tools=["ask_open", "ask_approver"])]
        script = [Turn.tool("ask_open", {"prompt": "text: hello"}, id="c-q"),
                  Turn.tool("ask_approver", {"prompt": "approval: ship"}, id="c-a"), Turn.text("never")]
        local = Runtime(s.store, agents=agents, tools=tools, models={"boss": ScriptedModel(script)})
        run_id = uid("local-run")
        result = await local.run("boss", "delegate", thread_id=uid("local"), run_id=run_id)
        calls = result.run.calls
        assert calls["c-q"].status == "succeeded"
        assert calls["c-q"].result["output"] == HELLO and calls["c-q"].result["state"] == "TASK_STATE_COMPLETED"
        remote_run = fold_commits([sc async for sc in s.store.read_run(calls["c-q"].result["task_id"])])
        assert next(iter(remote_run.runs.values())).agent_id == "open"  # a real run of the remote agent
        # the remote task waits for a decision: the local call suspends on it
        assert result.status == "waiting" and calls["c-a"].status == "suspended"
        ticket = calls["c-a"].ticket
        assert ticket.resume_mode == "use_decision_as_tool_result" and ticket.parameters["task_id"]
        # verified replay of the local run: the remote calls answer from the log (nothing sent)
        report = await verify_run(s.store, run_id, local)
        assert report.ok and report.tools_from_log == 2 and report.tools_executed == 0


async def test_a2a_endpoints_need_a_token_when_auth_is_on(tokens_deployment: Deployment) -> None:
    """With tokens configured the JSON-RPC endpoint authenticates like /v1 (cards stay public);
    a tenant-scoped token is served, scoped to its tenant (tests/gateway/test_a2a_tasks.py)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "nope"}}
    headers = {"A2A-Version": "1.0"}
    async with asyncio.timeout(TIMEOUT), open_remote(tokens_deployment) as s:
        card = await s.client.get("/a2a/open/.well-known/agent-card.json")
        assert card.status == 200  # public, and it says how to authenticate
        card_json = await card.json()
        assert card_json["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"
        assert card_json["securityRequirements"] == [{"schemes": {"bearer": {}}}]
        resp = await s.client.post("/a2a/open", json=body, headers=headers)
        assert resp.status == 401 and (await resp.json())["code"] == "unauthorized"
        resp = await s.client.post("/a2a/open", json=body, headers={**headers, "Authorization": "Bearer tc"})
        assert resp.status == 200 and (await resp.json())["error"]["code"] == -32001  # task not found
        resp = await s.client.post("/a2a/open", json=body, headers={**headers, "Authorization": "Bearer admin"})
        assert resp.status == 200 and (await resp.json())["error"]["code"] == -32001  # task not found
