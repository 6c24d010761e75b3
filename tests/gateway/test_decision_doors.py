"""A decision must answer its ticket, on every door users decide through, against what they run
(`agentlog serve`, and `agentlog gateway` + `agentlog worker`: the shared `protocol_deployment` of
tests/apps/protocol_app.py, whose `sequential` agent asks a human before `echo`).

One waiting run takes a malformed approval from each door (a resume without a result, or one
whose result lacks `approved`): HTTP, the NATS API, the CLI (over NATS and HTTP),
`agentlog.client`, AG-UI `resume[]`, an AI SDK tool output or approval response, an A2A
decision. Each is refused with `invalid_decision` naming the field (and the run id), and the log
stays as it was: the run still waits, `echo` never ran. Then `agentlog run approve --always`
approves it (a standing rule: the next `echo` on the thread runs without asking). MCP and ACP
answer approvals through their own forms (an elicitation, a permission option): anything but a
yes never runs the tool there either.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import acp
import aiohttp
import mcp_types as types
import pytest
from a2a.types.a2a_pb2 import GetTaskRequest
from a2a.utils.errors import InvalidParamsError
from google.protobuf.json_format import MessageToDict
from mcp import Client
from typer.testing import CliRunner

from agentlog.cli.core import app
from agentlog.client import InvalidRequest, get_client
from agentlog.eventlog.jetstream.store import JetStreamEventStore

from tests.gateway.test_a2a import client_for, decision_message, final_task
from tests.gateway.test_acp import EditorClient, drive, run_of
from tests.support.adapters_routes import Http, open_deployed
from tests.support.http_stack import uid
from tests.support.topology import Deployment

TIMEOUT = 60
pytestmark = pytest.mark.usefixtures("keep_structlog_config")


async def _log(store: JetStreamEventStore, thread: str) -> list[Any]:
    return [sc async for sc in store.read_thread(thread)]


def _cli(*args: str) -> Any:
    """`agentlog ...` in this process (CliRunner), off the event loop (the CLI runs its own)."""
    return CliRunner().invoke(app, [*args, "--timeout", "10"])


async def test_a_malformed_approval_is_refused_on_every_door(protocol_deployment: Deployment) -> None:
    d = protocol_deployment
    thread = uid("t")
    async with asyncio.timeout(TIMEOUT * 2), get_client(d.http_url) as client, open_deployed(d) as deployed:
        store = deployed.store
        started = await client.runs.create("sequential", "approval: deploy it", thread_id=thread)
        run_id = started["run_id"]
        waiting = await client.runs.wait(run_id)
        (call,) = waiting["calls"].values()
        call_id = call["call_id"]
        assert call["ticket"]["response_schema"]["required"] == ["approved"]
        before = await _log(store, thread)

        # HTTP: no result, a result without `approved`
        async with aiohttp.ClientSession(d.http_url) as http:
            for result, field in ((None, "result"), ({"ok": "yes"}, "result.approved")):
                decision = {"target_id": call_id, "decision_id": uid("d"), "action": "resume",
                            **({"result": result} if result is not None else {})}
                async with http.post(f"/v1/runs/{run_id}/inputs", json={"decisions": [decision]}) as resp:
                    body = await resp.json()
                assert resp.status == 400 and body["code"] == "invalid_decision", body
                assert body["run_id"] == run_id and body["detail"][0]["field"] == field, body

        # the NATS API: the same error, as a micro error whose body names the run
        decision = {"target_id": call_id, "decision_id": uid("d"), "action": "resume", "result": {"approve": True}}
        msg = await store.nc.request("agentlog.api.runs.inputs",
                                     json.dumps({"run_id": run_id, "decisions": [decision]}).encode(), timeout=10)
        body = json.loads(msg.data)
        assert (msg.headers or {}).get("Nats-Service-Error-Code") == "400", body
        assert body["code"] == "invalid_decision" and body["run_id"] == run_id, body
        assert body["detail"][0]["field"] == "result.approved", body

        # agentlog.client
        with pytest.raises(InvalidRequest) as refused:
            await client.runs.approve(run_id, result={"ok": "yes"})
        assert refused.value.code == "invalid_decision" and refused.value.run_id == run_id
        assert refused.value.detail[0]["field"] == "result.approved"

        # the CLI, over NATS and over HTTP: exit 2 (the request was wrong), the API's code
        for target in (["--nats", d.nats_url], ["--url", d.http_url]):
            out = await asyncio.to_thread(_cli, "run", "approve", run_id, "--result", '{"ok": "yes"}', *target)
            assert out.exit_code == 2 and "invalid_decision" in out.output and "result.approved" in out.output, \
                out.output

        # AG-UI resume[]: resolved without a payload, and with one that is not an approval
        for entry in ({"interruptId": call_id, "status": "resolved"},
                      {"interruptId": call_id, "status": "resolved", "payload": {"ok": "yes"}}):
            answer = await Http().agui(deployed, {"threadId": thread, "runId": uid("r"), "messages": [], "tools": [],
                                                   "context": [], "state": {}, "forwardedProps": {},
                                                   "resume": [entry]}, agent="sequential")
            errors = [e for e in answer.events if e["type"] == "RUN_ERROR"]
            assert [e.get("code") for e in errors] == ["invalid_decision"], answer

        # AI SDK: a client-side tool output on the gated call, and an approval response that is
        # no boolean (the adapter maps only `approved: true/false` to an approval)
        parts = [({"type": "tool-echo", "toolCallId": call_id, "state": "output-available", "input": {"text": "deploy"},
                   "output": {"ok": "yes"}}, "result.approved"),
                 ({"type": "tool-approval-response", "approvalId": call_id, "approved": "yes"},
                  "approved must be true or false")]
        for part, why in parts:
            chat = {"id": thread, "trigger": "submit-message",
                    "messages": [{"id": uid("a"), "role": "assistant", "parts": [part]}]}
            answer = await Http().aisdk(deployed, chat, agent="sequential")
            text = json.dumps(answer.rejected or [p for p in answer.events if p["type"] == "error"])
            assert why in text, answer

        # A2A: a decision data part on the task (task id = run id); the task says what to answer
        a2a = await client_for(d.http_url, "sequential", streaming=False)
        task = await a2a.get_task(GetTaskRequest(id=run_id))
        (asked,) = MessageToDict(task.status.message.parts[1].data)["suspended"]
        assert asked["ticket"]["response_schema"]["required"] == ["approved"], asked
        with pytest.raises(InvalidParamsError, match="invalid_decision"):
            await final_task(a2a, decision_message(run_id, [{"target_id": call_id, "decision_id": uid("d"),
                                                             "action": "resume", "result": {"ok": "yes"}}]))

        assert await _log(store, thread) == before, "a refused decision changed the log"
        view = await client.runs.current(run_id)
        assert view["status"] == "waiting" and view["calls"][call_id]["status"] == "suspended"

        # approved, for good: `run approve --always` (a standing rule of the thread)
        out = await asyncio.to_thread(_cli, "run", "approve", run_id, "--always", "--url", d.http_url)
        assert out.exit_code == 0 and "approved (always)" in out.output, out.output
        done = await client.runs.wait(run_id)
        assert done["status"] == "done" and done["calls"][call_id]["status"] == "succeeded", done
        (decided,) = [e for sc in await _log(store, thread) for e in sc.commit.events
                      if type(e).__name__ == "ToolCallDecided"]
        assert decided.decision.result == {"approved": True, "always": True}
        again = await client.runs.create("sequential", "approval: once more", thread_id=thread)
        final = await client.runs.wait(again["run_id"])
        (echo,) = final["calls"].values()
        assert final["status"] == "done" and echo["status"] == "succeeded" and echo.get("ticket") is None, final


@pytest.mark.parametrize("answer", [{"approve": "yes"}, {}], ids=["not-a-boolean", "empty"])
async def test_mcp_elicitation_that_is_no_yes_or_no_runs_nothing(protocol_deployment: Deployment,
                                                                   answer: dict[str, Any]) -> None:
    """An elicitation answered with anything but `approve: true/false` is refused
    (`invalid_decision`); the run still waits, `echo` never ran."""
    async def callback(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content=answer)

    async with asyncio.timeout(TIMEOUT), Client(f"{protocol_deployment.http_url}/v1/mcp", mode="legacy",
                                                elicitation_callback=callback) as c:
        result = await c.call_tool("sequential", {"message": "approval: deploy it"})
    doc = result.structured_content
    assert result.is_error and doc["error"]["code"] == "invalid_decision", result
    async with get_client(protocol_deployment.http_url) as client:
        run = await client.runs.current(doc["run_id"])
    (call,) = run["calls"].values()
    assert run["status"] == "waiting" and call["status"] == "suspended" and not call.get("decision"), run


async def test_acp_permission_outcome_other_than_allow_runs_nothing(protocol_deployment: Deployment) -> None:
    """ACP: only the `allow` option approves; an option the agent did not offer is a denial."""
    if protocol_deployment.kind != "serve":
        pytest.skip("the ACP process runs its own worker: one log is enough")
    assert acp is not None

    class Unknown(EditorClient):
        async def request_permission(self, session_id: str, tool_call: Any, options: list[Any], **kw: Any) -> Any:
            from acp.schema import AllowedOutcome, RequestPermissionResponse

            self.asked.append((tool_call, [o.option_id for o in options]))
            return RequestPermissionResponse(outcome=AllowedOutcome(option_id="yes-please", outcome="selected"))

    client = Unknown()
    thread, answer = await drive(protocol_deployment, client, "approval: deploy it")
    assert answer.stop_reason == "end_turn" and len(client.asked) == 1
    run = await run_of(protocol_deployment, thread)
    (call,) = run["calls"].values()
    assert call["status"] == "cancelled", call
