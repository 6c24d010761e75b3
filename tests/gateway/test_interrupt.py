"""Interrupt: `POST /v1/runs/{id}/inputs {"messages", "mode": "interrupt"}` on a RUNNING run
cancels it and continues the thread with the messages, as one command a worker executes (the
thread never has two active runs), against what users run: `agentlog serve`, and `agentlog
gateway` + `agentlog worker` (tests/apps/serve_app.py: agent `held` calls `hold`, which blocks until
its thread is released by a file, or the run is cancelled). A test releases a thread for every
run but the one it interrupts (`release_all_but`): `ToolCallStarted` is recorded before the tool
runs, so the interrupted run's `hold` may look at the file after the release and must still block.
The release is written before that run starts: the latest look, every time.

Synchronisation: the thread's event stream (followed) and `runs.wait`; no test waits on time.

One deployment per topology serves the module: every test drives threads of its own, and `hold`
is released per thread (a file named by the thread id in the deployment's hold directory), so a
test's release never reaches another test's run.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentlog.cli.core import app
from agentlog.client import ApiError, AsyncClient, SyncClient, get_sync_client

from tests.apps.serve_app import release_all_but
from tests.support.adapters_routes import TRANSPORTS, Transport, open_deployed
from tests.support.topology import TOPOLOGIES, Deployment, deploy

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("keep_structlog_config")
WAIT = 90


@pytest.fixture(scope="module", params=TOPOLOGIES)
def deployment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """One deployment per topology for the module (each test drives threads of its own)."""
    where = tmp_path_factory.mktemp(f"interrupt-{request.param}")
    hold = where / "hold"
    hold.mkdir()
    with deploy(request.param, where / "deployment", app="tests.apps.serve_app:app",
                env={"SERVE_APP_HOLD_DIR": str(hold)}) as running:
        yield running


@pytest.fixture
def hold_dir(deployment: Deployment) -> Path:
    """The deployment's hold directory: `hold` returns at once on a thread whose file is there."""
    return Path(deployment.env["SERVE_APP_HOLD_DIR"])


def held_run_ids(hold_dir: Path, name: str) -> dict[str, str]:
    """Ids for a `held` run named `name`, its thread released for every other run before it
    starts: the continuation that interrupts it can finish, and it stays held."""
    ids = {"thread_id": f"t-interrupt-{name}", "run_id": f"r-interrupt-{name}"}
    release_all_but(hold_dir, ids["thread_id"], ids["run_id"])
    return ids


def holding(client: SyncClient, hold_dir: Path, name: str) -> dict[str, Any]:
    """A `held` run whose `hold` call has started (and blocks): followed from the thread's stream."""
    run = client.runs.create("held", "go", **held_run_ids(hold_dir, name))
    for event in client.threads.stream(run["thread_id"], follow=True):
        if event.type == "ToolCallStarted":
            return run
    raise AssertionError("the thread's stream ended before the hold call started")


async def aholding(aio: AsyncClient, hold_dir: Path, name: str) -> dict[str, Any]:
    """`holding` for the async client."""
    run = await aio.runs.create("held", "go", **held_run_ids(hold_dir, name))
    async with contextlib.aclosing(aio.threads.stream(run["thread_id"], follow=True)) as events:
        async for event in events:
            if event.type == "ToolCallStarted":
                return run
    raise AssertionError("the thread's stream ended before the hold call started")


def log_of(client: SyncClient, thread_id: str) -> list[Any]:
    return list(client.threads.stream(thread_id))


def test_interrupt_cancels_the_running_run_and_continues_with_the_message(
        deployment: Deployment, hold_dir: Path) -> None:
    with get_sync_client(deployment.http_url) as client:
        old = holding(client, hold_dir, "sync")
        thread = old["thread_id"]
        new = client.runs.inputs(old["run_id"], messages="stop, then do this", mode="interrupt")
        assert new["thread_id"] == thread and new["run_id"] != old["run_id"]
        done = client.runs.wait(new["run_id"], timeout=WAIT)
        assert done["status"] == "done" and done["parent_run_id"] == old["run_id"]
        stopped = client.runs.get(old["run_id"], min_seq=done["last_seq"])
        assert stopped["termination"]["type"] == "cancelled"
        events = log_of(client, thread)
        ended = next(e.seq for e in events if e.type == "RunFinished" and e.run_id == old["run_id"])
        started = next(e.seq for e in events if e.type == "RunStarted" and e.run_id == new["run_id"])
        assert ended < started  # never two active runs
        # stopped by the live signal or the recorded request, whichever came first
        assert all(e.event.get("reason") == "interrupted by a new message"
                   for e in events if e.type == "RunCancelRequested")
        users = [e.event["message"]["content"] for e in events
                 if e.type == "MessageAppended" and e.event["message"]["role"] == "user"]
        assert users == ["go", "stop, then do this"]
    for run_id in (old["run_id"], new["run_id"]):
        result = runner.invoke(app, ["replay", run_id, "--verify", "--app", "tests.apps.serve_app:app",
                                     "--nats", deployment.nats_url, "--timeout", "10"])
        assert result.exit_code == 0, result.output


def test_interrupt_without_a_mode_is_a_409_naming_it_and_writes_nothing(
        deployment: Deployment, hold_dir: Path) -> None:
    with get_sync_client(deployment.http_url) as client:
        old = holding(client, hold_dir, "no-mode")
        thread = old["thread_id"]
        before = len(log_of(client, thread))
        with pytest.raises(ApiError) as raised:
            client.runs.inputs(old["run_id"], messages="hello?")
        assert raised.value.status == 409 and '"mode": "interrupt"' in raised.value.message, raised.value
        for body in ({"messages": "x", "mode": "later"}, {"mode": "interrupt"}, {"mode": "steer"},
                     {"decisions": [], "messages": [], "mode": "interrupt"}):
            with pytest.raises(ApiError) as bad:
                client.call(client.aio.request("POST", f"/v1/runs/{old['run_id']}/inputs", json_body=body))
            assert (bad.value.status, bad.value.code) == (400, "invalid_input"), body
        assert len(log_of(client, thread)) == before
        client.runs.cancel(old["run_id"])  # its hold never returns: only the cancel ends it


def test_interrupt_of_a_finished_run_is_a_plain_continuation(deployment: Deployment, hold_dir: Path) -> None:
    with get_sync_client(deployment.http_url) as client:
        (hold_dir / "t-interrupt-done").touch()  # before the run: its hold returns at once
        first = client.runs.create("held", "go", thread_id="t-interrupt-done")
        assert client.runs.wait(first["run_id"], timeout=WAIT)["status"] == "done"
        new = client.runs.inputs(first["run_id"], messages="more", mode="interrupt")
        done = client.runs.wait(new["run_id"], timeout=WAIT)
        assert done["status"] == "done" and done["parent_run_id"] == first["run_id"]
        assert not [e for e in log_of(client, first["thread_id"]) if e.type == "RunCancelRequested"]


@pytest.mark.parametrize("tr", TRANSPORTS, ids=lambda t: t.name)
async def test_interrupt_stop_then_send_in_the_ai_sdk(deployment: Deployment, hold_dir: Path, tr: Transport) -> None:
    """The AI SDK client stopped its stream (the run went on) and sends a new message: one
    interrupting command, the old run cancelled, the new message answered in the stream."""
    async with asyncio.timeout(WAIT), open_deployed(deployment) as stack, AsyncClient(deployment.http_url) as aio:
        old = await aholding(aio, hold_dir, f"aisdk-{tr.name}")
        chat = old["thread_id"]
        body = {"id": chat, "trigger": "submit-message", "messages": [
            {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "go"}]},
            {"id": "u2", "role": "user", "parts": [{"type": "text", "text": "stop, then this"}]}]}
        answer = await tr.aisdk(stack, body, agent="held")
        assert not [p for p in answer.events if p["type"] == "error"], answer.events
        assert answer.events[-1]["type"] == "finish"
        new = next(p["messageId"] for p in answer.events if p["type"] == "start")
        view = await aio.runs.wait(new, timeout=WAIT)
        assert view["parent_run_id"] == old["run_id"]
        stopped = await aio.runs.get(old["run_id"], min_seq=view["last_seq"])
        assert stopped["termination"]["type"] == "cancelled"


@pytest.mark.parametrize("tr", TRANSPORTS, ids=lambda t: t.name)
async def test_interrupt_stop_then_send_in_ag_ui(deployment: Deployment, hold_dir: Path, tr: Transport) -> None:
    """The same through AG-UI: a run request on a thread whose run still runs interrupts it."""
    async with asyncio.timeout(WAIT), open_deployed(deployment) as stack, AsyncClient(deployment.http_url) as aio:
        old = await aholding(aio, hold_dir, f"agui-{tr.name}")
        chat = old["thread_id"]
        body = {"threadId": chat, "runId": f"r-agui-interrupt-{tr.name}", "tools": [], "context": [],
                "state": {}, "forwardedProps": {},
                "messages": [{"id": "u1", "role": "user", "content": "go"},
                             {"id": "u2", "role": "user", "content": "stop, then this"}]}
        answer = await tr.agui(stack, body, agent="held")
        types = [e["type"] for e in answer.events]
        assert "RUN_ERROR" not in types and types[-1] == "RUN_FINISHED", answer.events
        stopped = await aio.runs.get(old["run_id"])
        assert stopped["termination"]["type"] == "cancelled"
        runs = (await aio.runs.list(thread_id=chat))["runs"]
        assert [r["parent_run_id"] for r in runs if r["run_id"] != old["run_id"]] == [old["run_id"]]
