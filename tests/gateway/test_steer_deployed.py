"""Steering what users run: `POST /v1/runs/{id}/inputs` (and `agentlog.api.runs.inputs` over NATS)
with `mode` steer / follow_up against `agentlog serve` and against `agentlog gateway` + `agentlog
worker` (one deployment per topology for the module), replay --verify on the steered runs, and a
steer that outlives its worker.

App: tests/apps/steer_app.py (`wait` blocks until the test writes a byte to the thread's FIFO, which the
test holds open). Synchronisation: the thread's event stream and `runs.wait`; no test waits for a
timeout to expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from typer.testing import CliRunner

from agentlog.cli.core import app as cli
from agentlog.client import ApiError, AsyncClient, SyncClient, get_sync_client

from tests.support.adapters_routes import TRANSPORTS, Transport, open_deployed
from tests.support.topology import TOPOLOGIES, Deployment, deploy

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("keep_structlog_config")
WAIT = 90


@pytest.fixture(scope="module")
def fifo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("steer-fifos")


@pytest.fixture(scope="module", params=TOPOLOGIES)
def deployment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
               fifo_dir: Path) -> Iterator[Deployment]:
    # a 2 s command lease: a killed worker's run is handed over quickly
    env = {"STEER_APP_DIR": str(fifo_dir), "AGENTLOG_WORKER_ACK_WAIT": "2"}
    with deploy(request.param, tmp_path_factory.mktemp(f"steer-{request.param}"), app="tests.apps.steer_app:app",
                env=env) as running:
        yield running


class Release:
    """The write end of a thread's FIFO, held open for the test: each `one()` lets one `wait`
    call return (a byte written before the call waits in the pipe)."""

    def __init__(self, fifo_dir: Path, thread_id: str) -> None:
        path = fifo_dir / thread_id
        os.mkfifo(path)
        self.fd = os.open(path, os.O_RDWR)

    def one(self) -> None:
        os.write(self.fd, b"x")

    def close(self) -> None:
        os.close(self.fd)


def held(client: SyncClient, thread_id: str, text: str = "hold on") -> dict[str, Any]:
    """A `steered` run whose `wait` call has started (and blocks)."""
    run = client.runs.create("steered", text, thread_id=thread_id)
    for event in client.threads.stream(thread_id, follow=True):
        if event.type == "ToolCallStarted":
            return run
    raise AssertionError("the thread's stream ended before the wait call started")


def log_of(client: SyncClient, thread_id: str) -> list[Any]:
    return list(client.threads.stream(thread_id))


def said(events: list[Any], role: str) -> list[str]:
    return [e.event["message"].get("content", "") for e in events
            if e.type == "MessageAppended" and e.event["message"]["role"] == role]


def verify(d: Deployment, run_id: str) -> None:
    result = runner.invoke(cli, ["replay", run_id, "--verify", "--app", "tests.apps.steer_app:app",
                                 "--nats", d.nats_url, "--timeout", "10"])
    assert result.exit_code == 0, result.output


def test_steer_over_http_is_taken_at_the_next_step_boundary(deployment: Deployment, fifo_dir: Path) -> None:
    thread = f"t-steer-http-{deployment.kind}"
    release = Release(fifo_dir, thread)
    try:
        with get_sync_client(deployment.http_url) as client:
            run = held(client, thread)
            accepted = client.runs.inputs(run["run_id"], messages="change of plan: 1.4.3", mode="steer")
            assert (accepted["run_id"], accepted["thread_id"]) == (run["run_id"], thread)  # the same run goes on
            release.one()
            done = client.runs.wait(run["run_id"], timeout=WAIT)
            assert done["status"] == "done" and done["termination"]["type"] == "natural_end"
            events = log_of(client, thread)
            assert said(events, "user") == ["hold on", "change of plan: 1.4.3"]
            assert said(events, "assistant")[-1] == "heard: change of plan: 1.4.3"
            queued = next(e for e in events if e.type == "MessageQueued")
            assert queued.seq == accepted["seq"] and queued.event["mode"] == "steer"
            kinds = [e.type for e in events]
            # recorded while the tool ran; taken after its result, before the next inference
            assert kinds.index("MessageQueued") < kinds.index("ToolCallCompleted")
            taken = next(i for i, e in enumerate(events) if e.type == "MessageAppended"
                         and e.event["message"]["id"] == queued.event["message"]["id"])
            assert kinds.index("ToolCallCompleted") < taken < len(kinds) - 1 - kinds[::-1].index("InferenceCompleted")
            assert [e.run_id for e in events if e.type == "RunStarted"] == [run["run_id"]]
    finally:
        release.close()
    verify(deployment, run["run_id"])


async def test_steer_follow_up_over_nats_continues_the_run_when_it_would_end(deployment: Deployment, fifo_dir: Path) -> None:
    thread = f"t-follow-nats-{deployment.kind}"
    release = Release(fifo_dir, thread)
    nc = await nats.connect(deployment.nats_url)
    try:
        with get_sync_client(deployment.http_url) as client:
            run = held(client, thread)
            body = {"run_id": run["run_id"], "messages": "then write the changelog", "mode": "follow_up"}
            reply = json.loads((await nc.request("agentlog.api.runs.inputs", json.dumps(body).encode(),
                                                 timeout=WAIT)).data)
            assert reply["run_id"] == run["run_id"], reply
            release.one()
            done = client.runs.wait(run["run_id"], timeout=WAIT)
            assert done["status"] == "done"
            events = log_of(client, thread)
            # answered after the first message (not at the step boundary), then the follow-up
            assert said(events, "assistant")[-2:] == ["heard: hold on", "heard: then write the changelog"]
            assert sum(e.type == "RunFinished" for e in events) == 1
            # on a finished run: a clear 409 over NATS
            reply = await nc.request("agentlog.api.runs.inputs", json.dumps(body).encode(), timeout=WAIT)
            assert reply.headers and reply.headers.get("Nats-Service-Error-Code") == "409", reply.headers
            assert json.loads(reply.data)["code"] == "run_finished"
    finally:
        release.close()
        await nc.close()
    await asyncio.to_thread(verify, deployment, run["run_id"])


def test_steer_needs_a_mode_and_a_running_run_and_works_from_the_cli(deployment: Deployment, fifo_dir: Path) -> None:
    thread = f"t-steer-409-{deployment.kind}"
    release = Release(fifo_dir, thread)
    try:
        with get_sync_client(deployment.http_url) as client:
            run = held(client, thread)
            before = len(log_of(client, thread))
            with pytest.raises(ApiError) as raised:
                client.runs.inputs(run["run_id"], messages="hello?")
            assert raised.value.status == 409
            for mode in ("steer", "follow_up", "interrupt"):
                assert f'"mode": "{mode}"' in raised.value.message, raised.value.message
            with pytest.raises(ApiError) as bad:
                client.runs.inputs(run["run_id"], messages=[{"role": "assistant", "content": "x"}], mode="steer")
            assert (bad.value.status, bad.value.code) == (400, "invalid_input")
            with pytest.raises(ApiError) as mixed:  # decisions are not queued, nor dropped
                client.runs.inputs(run["run_id"], messages="and approve it", mode="steer",
                                   decisions=[{"target_id": "c-1", "decision_id": "d-1", "action": "resume"}])
            assert (mixed.value.status, mixed.value.code) == (400, "invalid_input")
            assert len(log_of(client, thread)) == before  # nothing written
            # the CLI: agentlog run continue RUN MESSAGE --mode steer
            result = runner.invoke(cli, ["run", "continue", run["run_id"], "via the cli", "--mode", "steer",
                                         "--json", "--url", deployment.http_url, "--timeout", "30"])
            assert result.exit_code == 0, result.output
            assert json.loads(result.stdout)["run_id"] == run["run_id"]
            release.one()
            assert client.runs.wait(run["run_id"], timeout=WAIT)["status"] == "done"
            assert said(log_of(client, thread), "assistant")[-1] == "heard: via the cli"
            with pytest.raises(ApiError) as late:
                client.runs.inputs(run["run_id"], messages="too late", mode="steer")
            assert (late.value.status, late.value.code) == (409, "run_finished")
    finally:
        release.close()


def test_steer_outlives_the_worker_the_log_is_the_queue(deployment: Deployment, fifo_dir: Path) -> None:
    """serve: the steer is recorded, then the process is killed before the run takes it; split:
    the worker is killed and the steer arrives while it is down. Either way the run resumed from
    the log on the restarted process takes it."""
    thread = f"t-steer-kill-{deployment.kind}"
    release = Release(fifo_dir, thread)
    try:
        with get_sync_client(deployment.http_url) as client:
            run = held(client, thread)
            if deployment.kind == "serve":
                client.runs.inputs(run["run_id"], messages="after the crash", mode="steer")
                deployment.kill("serve")
                deployment.start("serve")
            else:
                deployment.kill("worker-0")
                answer: dict[str, Any] = {}

                def send() -> None:
                    with get_sync_client(deployment.http_url, timeout=WAIT) as c:
                        try:
                            answer.update(c.runs.inputs(run["run_id"], messages="after the crash", mode="steer"))
                        except ApiError as exc:  # no worker within the gateway's wait: still queued
                            answer["code"] = exc.code

                sender = threading.Thread(target=send)
                sender.start()
                deployment.start("worker-0")
                sender.join(WAIT)
                assert answer.get("run_id") == run["run_id"] or answer.get("code") == "dispatch_timeout", answer
        with get_sync_client(deployment.http_url) as client:
            release.one()
            done = client.runs.wait(run["run_id"], timeout=WAIT)
            assert done["status"] == "done"
            events = log_of(client, thread)
            assert said(events, "user") == ["hold on", "after the crash"]
            assert said(events, "assistant")[-1] == "heard: after the crash"
    finally:
        release.close()
    verify(deployment, run["run_id"])


async def _queued_on(aio: AsyncClient, thread_id: str) -> None:
    """Until a `MessageQueued` lands on the thread (the test's one)."""
    async with contextlib.aclosing(aio.threads.stream(thread_id, follow=True)) as events:
        async for event in events:
            if event.type == "MessageQueued":
                return


async def _runs_of(aio: AsyncClient, thread_id: str) -> list[str]:
    """The runs the thread's log started (the log, not a projection that may trail it)."""
    async with contextlib.aclosing(aio.threads.stream(thread_id)) as events:
        return [e.run_id async for e in events if e.type == "RunStarted"]


async def _held_async(aio: AsyncClient, thread_id: str) -> dict[str, Any]:
    run = await aio.runs.create("steered", "hold on", thread_id=thread_id)
    async with contextlib.aclosing(aio.threads.stream(thread_id, follow=True)) as events:
        async for event in events:
            if event.type == "ToolCallStarted":
                return run
    raise AssertionError("the thread's stream ended before the wait call started")


@pytest.mark.parametrize("tr", TRANSPORTS, ids=lambda t: t.name)
async def test_steer_in_ag_ui_via_forwarded_props(deployment: Deployment, fifo_dir: Path, tr: Transport) -> None:
    """A run request with a new message on a thread whose run runs, `forwardedProps.agentlog.mode`
    = steer: queued on that run (no second run), and this stream carries the rest of it."""
    thread = f"t-steer-agui-{deployment.kind}-{tr.name}"
    release = Release(fifo_dir, thread)
    try:
        async with asyncio.timeout(WAIT), open_deployed(deployment) as stack, AsyncClient(deployment.http_url) as aio:
            run = await _held_async(aio, thread)
            body = {"threadId": thread, "runId": "r-agui-steer", "tools": [], "context": [], "state": {},
                    "forwardedProps": {"agentlog": {"mode": "steer"}},
                    "messages": [{"id": "u-steer", "role": "user", "content": "change of plan"}]}
            answering = asyncio.ensure_future(tr.agui(stack, body, agent="steered"))
            await _queued_on(aio, thread)
            release.one()
            answer = await answering
            types = [e["type"] for e in answer.events]
            assert "RUN_ERROR" not in types and types[-1] == "RUN_FINISHED", answer.events
            text = "".join(e.get("delta", "") for e in answer.events if e["type"] == "TEXT_MESSAGE_CONTENT")
            assert "heard: change of plan" in text, answer.events
            assert await _runs_of(aio, thread) == [run["run_id"]]
    finally:
        release.close()


@pytest.mark.parametrize("tr", TRANSPORTS, ids=lambda t: t.name)
async def test_steer_follow_up_in_the_ai_sdk_via_the_request_body(deployment: Deployment, fifo_dir: Path,
                                                          tr: Transport) -> None:
    """`sendMessage(message, {body: {agentlog: {mode: "follow_up"}}})` while the chat's run runs:
    queued on it; the stream is that run's assistant message going on with the follow-up."""
    thread = f"t-follow-aisdk-{deployment.kind}-{tr.name}"
    release = Release(fifo_dir, thread)
    try:
        async with asyncio.timeout(WAIT), open_deployed(deployment) as stack, AsyncClient(deployment.http_url) as aio:
            run = await _held_async(aio, thread)
            body = {"id": thread, "trigger": "submit-message", "agentlog": {"mode": "follow_up"}, "messages": [
                {"id": "u-follow", "role": "user", "parts": [{"type": "text", "text": "then the changelog"}]}]}
            answering = asyncio.ensure_future(tr.aisdk(stack, body, agent="steered"))
            await _queued_on(aio, thread)
            release.one()
            answer = await answering
            assert not [p for p in answer.events if p["type"] == "error"], answer.events
            assert answer.events[-1]["type"] == "finish"
            assert next(p["messageId"] for p in answer.events if p["type"] == "start") == run["run_id"]
            text = "".join(p.get("delta", "") for p in answer.events if p["type"] == "text-delta")
            assert "heard: hold on" in text and "heard: then the changelog" in text, answer.events
            assert await _runs_of(aio, thread) == [run["run_id"]]
    finally:
        release.close()
