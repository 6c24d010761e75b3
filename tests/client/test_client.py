"""`agentlog.client` against what users run: `agentlog serve`, and `agentlog gateway` + `agentlog
worker` (tests/support/topology.py), with bearer tokens on, app tests/apps/cli_runs_app.py (`deployer` asks a
human before `deploy`; `chat` answers "hello").

Synchronisation: `runs.wait` and `runs.stream` follow the log over SSE; every read after a write
passes the write's `seq` as `min_seq`; no test waits on time. The one fake server here is an
aiohttp app in the test's loop that drops an event stream mid-way, to check the client's
`Last-Event-ID` resume (a real server drops only clients that fall behind its queue). Views that
lag the log are made in process (the real HTTP app with its projection runner stopped).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from agentlog.client import (
    STATUS_BY_CODE,
    AsyncClient,
    Conflict,
    ConnectionFailed,
    InvalidRequest,
    NotFound,
    StreamEvent,
    Unauthorized,
    get_client,
    get_sync_client,
)
from agentlog.eventlog import JetStreamEventStore, new_id, now_ms
from agentlog.eventlog.events import Commit, ToolCallDecided, ToolCallDecision
from agentlog.gateway.operations.errors import STATUS_BY_CODE as SERVER_STATUS_BY_CODE

from tests.support.topology import TOPOLOGIES, Deployment, deploy

TOKEN = "client-test-token"


@pytest.fixture(scope="module", params=TOPOLOGIES)
def deployment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with deploy(request.param, tmp_path_factory.mktemp(f"client-{request.param}"), app="tests.apps.cli_runs_app:app",
                tokens=TOKEN) as running:
        yield running


def client_of(d: Deployment) -> AsyncClient:
    return get_client(d.http_url, token=TOKEN, timeout=30)


async def run_to_pause(client: AsyncClient, agent: str = "deployer") -> tuple[dict[str, Any], list[StreamEvent]]:
    run = await client.runs.create(agent, "ship it")
    async with asyncio.timeout(60):
        events = [e async for e in client.runs.stream(run["run_id"])]
    return run, events


# -- the async client ------------------------------------------------------------------------------


async def test_create_stream_wait_approve_round_trip(deployment: Deployment) -> None:
    async with client_of(deployment) as client:
        run, events = await run_to_pause(client)
        assert set(run) >= {"thread_id", "run_id", "seq"}
        assert "RunStarted" in [e.type for e in events[:2]] and events[-1].type == "RunSuspended" and events[-1].pauses
        assert {e.run_id for e in events} == {run["run_id"]} and [e.seq for e in events] == sorted(e.seq for e in events)

        waiting = await client.runs.wait(run["run_id"], timeout=60)
        assert waiting["status"] == "waiting"
        [pending] = await client.runs.pending(run["run_id"])
        assert pending["ticket"]["parameters"]["tool"] == "deploy"

        approved = await client.runs.approve(run["run_id"])
        assert approved["decided"] == [pending["call_id"]] and approved["action"] == "resume"
        done = await client.runs.wait(run["run_id"], min_seq=approved["seq"], timeout=60)
        assert done["status"] == "done" and done["calls"][pending["call_id"]]["result"] == "deployed prod"

        # the rest of the run, after the pause the first stream ended at
        rest = [e async for e in client.runs.stream(run["run_id"], after=events[-1].id)]
        decided = [e for e in rest if e.type == "ToolCallDecided"]
        assert [d.event["decision"]["result"] for d in decided] == [{"approved": True}]
        assert rest[-1].type == "RunFinished"


async def test_deny_records_approved_false_and_the_tool_does_not_run(deployment: Deployment) -> None:
    async with client_of(deployment) as client:
        run, _ = await run_to_pause(client)
        denied = await client.runs.deny(run["run_id"], reason="not on friday")
        done = await client.runs.wait(run["run_id"], min_seq=denied["seq"], timeout=60)
        [call] = done["calls"].values()
        assert done["status"] == "done" and call["status"] != "succeeded"
        assert call["decision"]["action"] == "cancel" and call["decision"]["result"] == {"approved": False}
        assert call["decision"]["reason"] == "not on friday"


async def test_reads_threads_runs_agents(deployment: Deployment) -> None:
    async with client_of(deployment) as client:
        run = await client.runs.create("chat", "hi")
        done = await client.runs.wait(run["run_id"], timeout=60)
        assert done["status"] == "done" and done["agent_id"] == "chat"
        thread_id = run["thread_id"]
        thread = await client.threads.get(thread_id, min_seq=done["last_seq"])
        assert thread["thread_id"] == thread_id and run["run_id"] in thread["run_ids"]
        messages = (await client.threads.messages(thread_id))["messages"]
        assert [(m["message"]["role"], m["message"]["content"]) for m in messages] == [("user", "hi"), ("assistant", "hello")]
        state = await client.threads.state(thread_id, at=messages[0]["event_id"])
        assert state["thread_id"] == thread_id and state["at"] == messages[0]["event_id"]
        runs = await client.runs.list(thread_id=thread_id, min_seq=done["last_seq"])
        assert [r["run_id"] for r in runs["runs"]] == [run["run_id"]]
        listed = await client.threads.list(limit=200, min_seq=done["last_seq"])
        assert thread_id in [t["thread_id"] for t in listed["threads"]]
        history = [e async for e in client.threads.stream(thread_id)]
        assert history[-1].type == "RunFinished" and history[-1].run_id == run["run_id"]
        agents = {a["id"]: a for a in await client.agents.list()}
        assert set(agents) == {"deployer", "chat"}

        created = await client.threads.create(metadata={"topic": "x"})
        new_id = created["thread"]["thread_id"]
        updated = await client.threads.update(new_id, {"topic": "y"})
        assert updated["thread"]["metadata"] == {"topic": "y"}
        deleted = await client.threads.delete(new_id, reason="test")
        assert deleted["deleted"] is True
        with pytest.raises(NotFound):
            await client.threads.get(new_id, min_seq=deleted["seq"])


async def test_continue_and_cancel(deployment: Deployment) -> None:
    async with client_of(deployment) as client:
        first = await client.runs.create("chat", "hi")
        await client.runs.wait(first["run_id"], timeout=60)
        child = await client.runs.inputs(first["run_id"], messages="and again")
        assert child["thread_id"] == first["thread_id"] and child["run_id"] != first["run_id"]
        done = await client.runs.wait(child["run_id"], min_seq=child["seq"], timeout=60)
        assert done["parent_run_id"] == first["run_id"] and done["status"] == "done"

        run, _ = await run_to_pause(client)
        cancelled = await client.runs.cancel(run["run_id"], reason="changed my mind")
        view = await client.runs.wait(run["run_id"], min_seq=cancelled["seq"], timeout=60)
        assert view["status"] == "done" and view["termination"]["type"] == "cancelled"


async def test_errors_are_typed_with_the_api_codes(deployment: Deployment) -> None:
    async with client_of(deployment) as client:
        with pytest.raises(NotFound) as missing:
            await client.runs.get("nosuchrun")
        assert (missing.value.code, missing.value.status) == ("run_not_found", 404)
        with pytest.raises(NotFound) as agent:
            await client.runs.create("nobody", "hi")
        assert agent.value.code == "agent_not_found"
        with pytest.raises(InvalidRequest) as bad:
            await client.runs.list(status="sleeping")
        assert (bad.value.code, bad.value.status) == ("invalid_input", 400) and bad.value.detail
        with pytest.raises(NotFound):
            async for _ in client.runs.stream("nosuchrun"):
                pass

        run = await client.runs.create("chat", "hi")
        await client.runs.wait(run["run_id"], timeout=60)
        with pytest.raises(Conflict) as nothing:  # nothing waits: refused before anything is sent
            await client.runs.approve(run["run_id"])
        assert nothing.value.code == "run_not_waiting"
        with pytest.raises(Conflict) as finished:  # the server's own refusal of a decision
            await client.runs.decide(run["run_id"], [{"target_id": "c1", "action": "resume"}])
        assert finished.value.code in ("run_not_waiting", "run_finished") and finished.value.status == 409

    async with get_client(deployment.http_url) as anonymous:
        with pytest.raises(Unauthorized) as unauthorized:
            await anonymous.runs.list()
        assert (unauthorized.value.code, unauthorized.value.status) == ("unauthorized", 401)


async def test_a_run_with_a_recorded_decision_streams_on(deployment: Deployment) -> None:
    """A decision is in the log but no worker has applied it yet (written here straight to the
    log, so nothing applies it until the cancel below makes a worker load the run): the run is
    still on its way, so a followed stream of it stays open instead of ending with its past."""
    async with client_of(deployment) as client:
        run, _ = await run_to_pause(client)
        [pending] = await client.runs.pending(run["run_id"])
        store = await JetStreamEventStore.connect(deployment.nats_url)
        try:
            decision = ToolCallDecision(target_id=pending["call_id"], decision_id="d-direct", action="resume",
                                        result={"approved": True})
            commit = Commit(commit_id=new_id(), thread_id=run["thread_id"], run_id=run["run_id"], ts=now_ms(),
                            events=[ToolCallDecided(call_id=pending["call_id"], decision=decision)])
            await store.append(commit, await store.thread_version(run["thread_id"]))
        finally:
            await store.close()
        seen: list[str] = []
        async with asyncio.timeout(60):
            async for event in client.runs.stream(run["run_id"]):
                seen.append(event.type)
                if event.type == "ToolCallDecided":  # the history is out: the stream is past its start
                    await client.runs.cancel(run["run_id"])
        assert "ToolCallDecided" in seen and seen[-1] == "RunFinished", seen


async def test_an_event_larger_than_a_line_buffer_streams(deployment: Deployment) -> None:
    """One event of 300 kB (one SSE line) arrives whole."""
    text = "x" * 300_000
    async with client_of(deployment) as client:
        run = await client.runs.create("chat", text)
        async with asyncio.timeout(60):
            events = [e async for e in client.runs.stream(run["run_id"])]
        assert text in [e.event.get("message", {}).get("content") for e in events]
        assert events[-1].type == "RunFinished"


# -- the blocking client ---------------------------------------------------------------------------


def test_sync_client_round_trip(deployment: Deployment) -> None:
    with get_sync_client(deployment.http_url, token=TOKEN, timeout=30) as client:
        run = client.runs.create("deployer", "ship it")
        events = list(client.runs.stream(run["run_id"]))
        assert events[-1].type == "RunSuspended"
        assert client.runs.wait(run["run_id"], timeout=60)["status"] == "waiting"
        approved = client.runs.approve(run["run_id"])
        done = client.runs.wait(run["run_id"], min_seq=approved["seq"], timeout=60)
        assert done["status"] == "done"
        assert [m["message"]["role"] for m in client.threads.messages(run["thread_id"])["messages"]][0] == "user"
        for event in client.runs.stream(run["run_id"]):  # leaving a stream early closes it
            assert event.type in ("ThreadCreated", "RunStarted")
            break
        with pytest.raises(NotFound) as missing:
            client.runs.get("nosuchrun")
        assert missing.value.code == "run_not_found"
        assert {a["id"] for a in client.agents.list()} == {"deployer", "chat"}


def test_env_gives_the_url_and_token(deployment: Deployment, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTLOG_URL", deployment.http_url)
    monkeypatch.setenv("AGENTLOG_API_TOKEN", TOKEN)
    with get_sync_client() as client:
        assert client.url == deployment.http_url and "runs" in client.runs.list()


# -- without a server ------------------------------------------------------------------------------


def test_no_server_is_connection_failed() -> None:
    with get_sync_client("http://127.0.0.1:1", timeout=5) as client, pytest.raises(ConnectionFailed) as failed:
        client.runs.get("r1")
    assert failed.value.code == "connection_failed" and failed.value.status is None


def test_import_is_light() -> None:
    """`import agentlog.client` loads neither the runtime nor the log nor nats."""
    code = ("import sys, agentlog.client; "
            "heavy = sorted(m for m in sys.modules if m.startswith(('agentlog.runtime', 'agentlog.eventlog', "
            "'agentlog.projections', 'agentlog.api', 'agentlog.gateway.http', 'nats'))); print(heavy); assert not heavy")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_status_table_mirrors_the_server() -> None:
    """Every code the server maps to a status is known to the client with that status."""
    assert {c: STATUS_BY_CODE.get(c) for c in SERVER_STATUS_BY_CODE} == SERVER_STATUS_BY_CODE


@contextlib.asynccontextmanager
async def fake_gateway(*routes: web.RouteDef) -> AsyncIterator[str]:
    """An aiohttp app in the test's loop answering `routes` on a loopback port: its base URL."""
    app = web.Application()
    app.router.add_routes(routes)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_a_broken_stream_resumes_after_the_last_event() -> None:
    """The server closes the connection after two frames (as it does to a client that fell
    behind); the client reconnects with `Last-Event-ID` and gets the rest, once each."""
    seen: list[str | None] = []

    async def events(request: web.Request) -> web.StreamResponse:
        last = request.headers.get("Last-Event-ID")
        seen.append(last)
        start = 0 if last is None else int(last.split(":")[0])
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for seq in range(start + 1, 6):
            await response.write(b': heartbeat\n\nid: %d:0\nevent: Step\ndata: {"thread_id": "t", "run_id": "r", '
                                 b'"event": {"n": %d}}\n\n' % (seq, seq))
            if last is None and seq == 2:
                assert request.transport is not None
                request.transport.close()  # no end of the chunked body: a broken stream
                return response
        await response.write_eof()
        return response

    async with fake_gateway(web.get("/v1/runs/r/events", events)) as url, get_client(url) as client:
        got = [e async for e in client.runs.stream("r")]
    assert [(e.id, e.event["n"]) for e in got] == [(f"{n}:0", n) for n in range(1, 6)]
    assert seen == [None, "2:0"]


async def test_a_branch_asked_for_again_after_a_503_is_the_same_request() -> None:
    """The gateway answers the first attempt 503 (NATS went away part way through the branch's
    commits); the client sends it again with the same body, its new thread id chosen by the
    client, which is what lets the gateway finish that branch instead of starting another."""
    bodies: list[Any] = []

    async def counterfactual(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        if len(bodies) == 1:
            return web.json_response({"error": "nats-server went away", "code": "store_unavailable"}, status=503,
                                     headers={"Retry-After": "0"})
        return web.json_response({"thread_id": bodies[-1]["new_thread_id"], "run_id": "rb", "seq": 9,
                                  "forked_from": {"thread_id": "t", "run_id": "r"}}, status=201)

    async with fake_gateway(web.post("/v1/runs/r/counterfactual", counterfactual)) as url, get_client(url) as client:
        branch = await client.runs.counterfactual("r", "call-1", result={"approved": False})
        answered = await client.runs.replace_answer("r", 1, content="no")
    assert len(bodies) == 3 and bodies[0] == bodies[1]
    assert bodies[0]["new_thread_id"] and branch["thread_id"] == bodies[0]["new_thread_id"]
    assert bodies[2]["new_thread_id"] not in ("", None, bodies[0]["new_thread_id"])  # one per branch asked
    assert answered["thread_id"] == bodies[2]["new_thread_id"]


async def test_a_silent_stream_is_resumed() -> None:
    """A server that stops sending (no heartbeat, connection left open) is taken for gone after
    `stream_idle`; the client reconnects after the last event and gets the rest."""
    seen: list[str | None] = []
    hang = asyncio.Event()  # never set: the first connection goes silent

    async def events(request: web.Request) -> web.StreamResponse:
        last = request.headers.get("Last-Event-ID")
        seen.append(last)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if last is None:
            await response.write(b'id: 1:0\nevent: Step\ndata: {"event": {"n": 1}}\n\n')
            await hang.wait()
        await response.write(b'id: 2:0\nevent: Step\ndata: {"event": {"n": 2}}\n\n')
        await response.write_eof()
        return response

    async with fake_gateway(web.get("/v1/runs/r/events", events)) as url, \
            AsyncClient(url, stream_idle=0.5) as client, asyncio.timeout(30):
        got = [e.id async for e in client.runs.stream("r")]
    assert got == ["1:0", "2:0"] and seen == [None, "1:0"]


async def test_wait_and_current_answer_while_the_views_lag(nats_server: Any) -> None:
    """The views may lag the log (a loaded machine, a restart): `runs.wait` and `runs.current`
    read as of the commits they saw in the log (the server folds the run from the log), never
    the views' 503 `projection_timeout`. Here the projection runner is stopped before the run:
    the views never learn of it. (In process: a real nats-server and the real HTTP app.)"""
    from aiohttp.test_utils import TestClient, TestServer

    from agentlog.gateway.http import Settings, create_app
    from agentlog.gateway.http.write import write_routes
    from agentlog.projections.kv import KVViewStore
    from agentlog.projections.runner import ProjectionRunner
    from agentlog.runtime import AgentSpec, Runtime
    from agentlog.runtime.models import ScriptedModel

    from tests.support.http_stack import stop_runner
    from tests.support.inprocess import InProcessDispatcher

    store = await JetStreamEventStore.connect(nats_server.url)
    views = await KVViewStore.open(store.nc)
    runner = ProjectionRunner(store.nc, views, fetch_timeout=0.2)
    await runner.start()
    await stop_runner(runner)
    rt = Runtime(store, agents=[AgentSpec(id="chat", model=ScriptedModel(["hello"]))])
    dispatcher = InProcessDispatcher(rt)
    app = create_app(store, views, runner, dispatcher=dispatcher, extra_routes=write_routes(dispatcher),
                     settings=Settings(read_wait=0.2))
    server = TestClient(TestServer(app, host="127.0.0.1"))
    await server.start_server()
    try:
        async with asyncio.timeout(60), AsyncClient(str(server.make_url("")).rstrip("/")) as client:
            started = await client.runs.create("chat", "hi")
            done = await client.runs.wait(started["run_id"], min_seq=started["seq"])
            assert done["status"] == "done" and done["termination"]["type"] == "natural_end", done
            assert (await client.runs.current(started["run_id"]))["status"] == "done"
    finally:
        await server.close()
        await rt.aclose()
        await store.close()
