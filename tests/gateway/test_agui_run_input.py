"""A run's client input against what users run (`protocol_deployment`: `agentlog serve`, and
`agentlog gateway` + `agentlog worker`), with the `tunable` agent of tests/apps/protocol_app.py, which
answers with what it was sent and allows some overrides:

- the official `@ag-ui/client` (tests/support/js/run_input.mjs) sends state, context and forwardedProps
  with model / systemPrompt / config overrides: all recorded at run start, the state merged into
  the thread's (the agent's tool reads it, `GET /v1/threads/{id}/state` shows it), the context
  in the model's system prompt, the overrides in the model request;
- an override the agent does not allow is a 400 `override_not_allowed` and nothing is written;
- the same overrides, context and state on `POST /v1/runs` and the NATS `runs.start`;
- `agentlog replay RUN --verify` passes on a run with overrides.

Pure units and the runtime itself: tests/runtime/test_run_input.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from typing import Any

import aiohttp
import pytest

from agentlog.eventlog.events import (
    RunFinished,
    RunStarted,
    RunSuspended,
    StatePatched,
    StoredCommit,
    ToolCallSuspended,
)
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.runtime.inputs.run_input import CONTEXT_HEADING

from tests.support import forkserver
from tests.support.adapters_routes import TRANSPORTS, Transport, open_deployed
from tests.support.js_clients import JS, ensure_js_clients
from tests.support.topology import PYTHONPATH, REPO, TESTS, Deployment

TIMEOUT = 90
JS = TESTS / "support" / "js"
OVERRIDES = {"model": "tunable-small", "systemPrompt": "Be brief.", "config": {"temperature": 0.2}, "tab": 3}
CONTEXT = f"{CONTEXT_HEADING}\n- page: /billing\n- plan: pro"


async def official_client(base: str, thread: str, props: dict[str, Any]) -> dict[str, Any]:
    await ensure_js_clients()
    proc = await asyncio.create_subprocess_exec("node", str(JS / "run_input.mjs"), base, thread, json.dumps(props),
                                                cwd=JS, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    doc: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return doc


async def thread_log(d: Deployment, thread: str) -> list[StoredCommit]:
    store = await JetStreamEventStore.connect(d.nats_url)
    try:
        return [sc async for sc in store.read_thread(thread)]
    finally:
        await store.close()


async def until_finished(d: Deployment, thread: str, end: type = RunFinished) -> list[StoredCommit]:
    """The thread's commits once its run has finished (or `end` is recorded), following the
    log, bounded."""
    store = await JetStreamEventStore.connect(d.nats_url)
    out: list[StoredCommit] = []
    follower = store.follow(thread, 0)
    try:
        async with asyncio.timeout(TIMEOUT):
            async for sc in follower:
                out.append(sc)
                if any(isinstance(e, end) for e in sc.commit.events):
                    return out
    finally:
        await follower.aclose()  # type: ignore[attr-defined]
        await store.close()
    return out


def answer_of(messages: list[dict[str, Any]]) -> dict[str, Any]:
    last = [m for m in messages if m["role"] == "assistant" and m.get("content")][-1]
    got: dict[str, Any] = json.loads(last["content"])
    return got


def started_of(commits: list[StoredCommit]) -> RunStarted:
    return next(e for sc in commits for e in sc.commit.events if isinstance(e, RunStarted))


async def test_agui_run_input_state_context_override_with_official_client(protocol_deployment: Deployment) -> None:
    """The official client's state, context and forwardedProps reach the agent and the log."""
    thread = f"t{uuid.uuid4().hex[:12]}"
    doc = await official_client(protocol_deployment.http_url, thread, OVERRIDES)
    assert "status" not in doc, doc
    assert answer_of(doc["messages"]) == {
        "model": "tunable-small", "system": f"Be brief.\n\n{CONTEXT}",
        "options": {"max_tokens": 100, "temperature": 0.2}, "state_seen": "from the client",
    }
    # the client ends with the thread's state: its own, merged in, streamed back as a delta
    assert doc["state"] == {"draft": "from the client", "count": 1}
    assert [e["type"] for e in doc["events"]][:2] == ["STATE_SNAPSHOT", "STATE_DELTA"], doc["events"]

    commits = await thread_log(protocol_deployment, thread)
    started = started_of(commits)
    assert started.overrides is not None and started.overrides.model == "tunable-small"
    assert started.overrides.system_prompt == "Be brief." and started.overrides.options == {"temperature": 0.2}
    assert [(c.description, c.value) for c in started.context] == [("page", "/billing"), ("plan", "pro")]
    assert started.forwarded_props == OVERRIDES
    first = commits[0].commit.events
    patch = next(e for e in first if isinstance(e, StatePatched))
    assert patch.source == "client" and patch.ops == [{"op": "add", "path": "/draft", "value": "from the client"},
                                                      {"op": "add", "path": "/count", "value": 1}]
    async with aiohttp.ClientSession() as http, \
            http.get(f"{protocol_deployment.http_url}/v1/threads/{thread}/state") as resp:
        assert resp.status == 200
        assert (await resp.json())["state"] == {"draft": "from the client", "count": 1}


@pytest.mark.parametrize(("props", "field"), [
    ({"model": "tunable-huge"}, "model"),
    ({"config": {"temperature": 0.2, "top_p": 0.9}}, "options"),
])
async def test_agui_override_not_allowed_is_400_and_writes_nothing(
        protocol_deployment: Deployment, props: dict[str, Any], field: str) -> None:
    """An override the agent does not allow: the official client's request fails with HTTP 400
    `override_not_allowed` (a refused request, not a stream), and the thread has no commit."""
    thread = f"t{uuid.uuid4().hex[:12]}"
    doc = await official_client(protocol_deployment.http_url, thread, props)
    assert doc["status"] == 400, doc
    assert doc["payload"]["code"] == "override_not_allowed" and field.rstrip("s") in doc["payload"]["error"], doc
    assert await thread_log(protocol_deployment, thread) == []


async def test_override_on_http_runs_and_nats_start(protocol_deployment: Deployment) -> None:
    """`POST /v1/runs` and the NATS `agentlog.api.runs.start` take `overrides`, `context` and
    `state`, under the same policy (400 `override_not_allowed`, nothing written)."""
    import nats

    base = protocol_deployment.http_url
    thread = f"t{uuid.uuid4().hex[:12]}"
    body = {"agent_id": "tunable", "thread_id": thread, "messages": "go",
            "overrides": {"model": "tunable-small", "system_prompt": "Short.", "options": {"temperature": 0}},
            "context": [{"description": "page", "value": "/billing"}], "state": {"draft": "http"}}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/runs", json=body) as resp:
            assert resp.status == 202, await resp.text()
        commits = await until_finished(protocol_deployment, thread)
        answer = next(e.message.content for sc in commits for e in sc.commit.events
                      if type(e).__name__ == "MessageAppended" and e.message.role == "assistant" and e.message.content)
        assert json.loads(answer) == {"model": "tunable-small", "system": f"Short.\n\n{CONTEXT_HEADING}\n- page: /billing",
                                      "options": {"max_tokens": 100, "temperature": 0}, "state_seen": "http"}
        refused = f"t{uuid.uuid4().hex[:12]}"
        async with http.post(f"{base}/v1/runs", json={**body, "thread_id": refused,
                                                      "overrides": {"system_prompt": "x", "model": "tunable-huge"}}) as resp:
            assert resp.status == 400
            assert (await resp.json())["code"] == "override_not_allowed"
    nc = await nats.connect(protocol_deployment.nats_url)
    try:
        msg = await nc.request("agentlog.api.runs.start", json.dumps(
            {"agent_id": "tunable", "thread_id": refused, "messages": "go",
             "overrides": {"options": {"seed": 1}}}).encode(), timeout=30)
        assert (msg.headers or {}).get("Nats-Service-Error-Code") == "400", msg.data
        assert json.loads(msg.data)["code"] == "override_not_allowed"
        nats_thread = f"t{uuid.uuid4().hex[:12]}"
        msg = await nc.request("agentlog.api.runs.start", json.dumps(
            {"agent_id": "tunable", "thread_id": nats_thread, "messages": "go",
             "overrides": {"model": "tunable-small"}}).encode(), timeout=30)
        assert not (msg.headers or {}).get("Nats-Service-Error-Code"), msg.data
    finally:
        await nc.close()
    assert await thread_log(protocol_deployment, refused) == []
    started = started_of(await until_finished(protocol_deployment, nats_thread))
    assert started.overrides is not None and started.overrides.model == "tunable-small"
    # the Python client passes them through
    from agentlog.client import InvalidRequest, get_client

    async with get_client(base) as client:
        run = await client.runs.create("tunable", "go", overrides={"options": {"temperature": 1}},
                                       context=[{"description": "from", "value": "client"}], state={"draft": "py"})
        started = started_of(await until_finished(protocol_deployment, run["thread_id"]))
        assert started.overrides is not None and started.overrides.options == {"temperature": 1}
        assert [c.value for c in started.context] == ["client"]
        view = await client.runs.get(run["run_id"], min_seq=run["seq"])  # the run view shows them
        assert view["overrides"] == {"options": {"temperature": 1}}
        with pytest.raises(InvalidRequest) as err:
            await client.runs.create("tunable", "go", overrides={"system_prompt": "x", "options": {"stop": ["."]}})
        assert err.value.code == "override_not_allowed"


async def test_override_run_verifies_by_replay(protocol_deployment: Deployment) -> None:
    """`agentlog replay RUN --verify` on a run with overrides, context and client state: the
    recorded values rebuild the same model requests and the same start commit."""
    if protocol_deployment.kind != "serve":
        pytest.skip("the recording is the same in both topologies")
    thread = f"t{uuid.uuid4().hex[:12]}"
    await official_client(protocol_deployment.http_url, thread, OVERRIDES)
    run_id = started_of(await thread_log(protocol_deployment, thread)).run_id
    proc = await asyncio.to_thread(
        forkserver.run, ["replay", run_id, "--verify", "--app", "tests.apps.protocol_app:app",
                         "--nats", protocol_deployment.nats_url],
        cwd=str(REPO), env={**os.environ, "PYTHONPATH": PYTHONPATH}, timeout=TIMEOUT)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


async def test_override_on_ai_sdk_route(protocol_deployment: Deployment) -> None:
    """The AI SDK route reads `model`, `systemPrompt` and `config` from the chat request body
    (what `sendMessage(message, {body})` adds), under the same policy."""
    base = protocol_deployment.http_url
    thread = f"t{uuid.uuid4().hex[:12]}"
    body = {"id": thread, "trigger": "submit-message", "model": "tunable-small", "systemPrompt": "Terse.",
            "config": {"temperature": 0.5},
            "messages": [{"id": f"u{thread}", "role": "user", "parts": [{"type": "text", "text": "go"}]}]}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/ai-sdk/agents/tunable/runs", json=body) as resp:
            assert resp.status == 200
            stream = await resp.text()
        assert '"type":"finish"' in stream.replace(" ", ""), stream[-500:]
        commits = await until_finished(protocol_deployment, thread)
        answer = [e.message.content for sc in commits for e in sc.commit.events
                  if type(e).__name__ == "MessageAppended" and e.message.role == "assistant" and e.message.content]
        assert json.loads(answer[-1]) == {"model": "tunable-small", "system": "Terse.",
                                          "options": {"max_tokens": 100, "temperature": 0.5}, "state_seen": "null"}
        refused = f"t{uuid.uuid4().hex[:12]}"
        async with http.post(f"{base}/v1/ai-sdk/agents/tunable/runs",
                             json={**body, "id": refused, "model": "tunable-huge"}) as resp:
            assert resp.status == 400
            assert (await resp.json())["code"] == "override_not_allowed"
        async with http.post(f"{base}/v1/ai-sdk/agents/tunable/runs", json={**body, "id": refused, "config": 3}) as resp:
            assert resp.status == 400
            assert (await resp.json())["detail"][0]["field"] == "config"
        # regenerating the answer with a refused override: 400 before the fork is made
        regenerate = {**body, "trigger": "regenerate-message", "messageId": started_of(commits).run_id,
                      "model": "tunable-huge"}
        async with http.post(f"{base}/v1/ai-sdk/agents/tunable/runs", json=regenerate) as resp:
            assert resp.status == 400
            assert (await resp.json())["code"] == "override_not_allowed"
    assert await thread_log(protocol_deployment, refused) == []
    assert len(await thread_log(protocol_deployment, thread)) == len(commits)  # no fork recorded


async def test_override_kept_when_the_run_resumes_after_an_approval(protocol_deployment: Deployment) -> None:
    """A run with overrides waits for an approval; the worker that resumes it rebuilds the run
    from the log (its snapshot and the commits after it), and its next inference still gets
    the recorded model, options and context."""
    base = protocol_deployment.http_url
    thread = f"t{uuid.uuid4().hex[:12]}"
    body = {"agent_id": "tunable", "thread_id": thread, "messages": "approve: read it",
            "overrides": {"model": "tunable-small", "options": {"temperature": 0.7}},
            "context": [{"description": "ticket", "value": "OPS-7"}], "state": {"draft": "approved"}}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/runs", json=body) as resp:
            assert resp.status == 202, await resp.text()
            run_id = (await resp.json())["run_id"]
        waiting = await until_finished(protocol_deployment, thread, RunSuspended)
        (call_id,) = [e.call_id for sc in waiting for e in sc.commit.events if isinstance(e, ToolCallSuspended)]
        decision = {"target_id": call_id, "decision_id": f"d{thread}", "action": "resume",
                    "result": {"approved": True}}
        async with http.post(f"{base}/v1/runs/{run_id}/inputs", json={"decisions": [decision]}) as resp:
            assert resp.status == 202, await resp.text()
    commits = await until_finished(protocol_deployment, thread)
    answer = [e.message.content for sc in commits for e in sc.commit.events
              if type(e).__name__ == "MessageAppended" and e.message.role == "assistant" and e.message.content]
    assert json.loads(answer[-1]) == {
        "model": "tunable-small", "system": f"You are tunable.\n\n{CONTEXT_HEADING}\n- ticket: OPS-7",
        "options": {"max_tokens": 100, "temperature": 0.7}, "state_seen": "approved"}


@pytest.mark.parametrize("tr", TRANSPORTS, ids=lambda t: t.name)
async def test_agui_override_over_http_and_nats_subject(protocol_deployment: Deployment, tr: Transport) -> None:
    """The AG-UI route over HTTP and over its NATS subject (`agentlog.ag-ui.runs`): allowed
    overrides reach the model; a refused one is a 400 answer (HTTP) or exactly one RUN_ERROR
    (NATS) with code `override_not_allowed`, and nothing is written."""
    async with open_deployed(protocol_deployment) as stack:
        thread = f"t{uuid.uuid4().hex[:12]}"
        body = {"threadId": thread, "runId": f"r{thread}", "state": {"draft": tr.name}, "tools": [], "context": [],
                "messages": [{"id": f"u{thread}", "role": "user", "content": "go"}],
                "forwardedProps": {"model": "tunable-small", "config": {"temperature": 0.1}}}
        answer = await tr.agui(stack, body, agent="tunable")
        assert answer.rejected is None and answer.events[-1]["type"] == "RUN_FINISHED", answer
        snapshot = [e for e in answer.events if e["type"] == "MESSAGES_SNAPSHOT"][-1]
        assert answer_of(snapshot["messages"]) == {"model": "tunable-small", "system": "You are tunable.",
                                                   "options": {"max_tokens": 100, "temperature": 0.1},
                                                   "state_seen": tr.name}
        refused = f"t{uuid.uuid4().hex[:12]}"
        answer = await tr.agui(stack, {**body, "threadId": refused, "forwardedProps": {"systemPrompt": 1}},
                               agent="tunable")
        assert answer.rejected is not None and answer.rejected.get("code") == "invalid_input", answer
        answer = await tr.agui(stack, {**body, "threadId": refused, "forwardedProps": {"model": "tunable-huge"}},
                               agent="tunable")
        assert answer.rejected is not None and answer.rejected.get("code") == "override_not_allowed", answer
        assert [sc async for sc in stack.store.read_thread(refused)] == []
