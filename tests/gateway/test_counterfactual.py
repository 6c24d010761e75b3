"""Counterfactual branches of a run (`POST /v1/runs/{id}/counterfactual`, NATS
`agentlog.api.runs.counterfactual`, `client.runs.counterfactual`) and the diff of two branches
(`GET /v1/threads/{a}/diff/{b}`, NATS `threads.diff`, `agentlog thread diff`), against what users
run: `agentlog serve`, and `agentlog gateway` + `agentlog worker` (the shared `protocol_deployment`
of tests/apps/protocol_app.py: agent `sequential` asks a human before `echo`, with the permission
ticket's approval schema).

Synchronisation: `runs.wait` follows the log; no test waits on time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from agentlog.cli.core import app
from agentlog.client import ApiError, SyncClient, get_sync_client

from tests.support.http_stack import uid
from tests.support.topology import Deployment

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("keep_structlog_config")
WAIT = 90


@pytest.fixture
def client(protocol_deployment: Deployment) -> Iterator[SyncClient]:
    with get_sync_client(protocol_deployment.http_url) as value:
        yield value


def decided_run(client: SyncClient, approved: bool = True) -> tuple[str, str, str]:
    """A finished run of `sequential` whose `echo` call a human approved (or denied): (thread, run, call)."""
    run = client.runs.create("sequential", "approval: deploy it")
    waiting = client.runs.wait(run["run_id"], timeout=WAIT)
    assert waiting["status"] == "waiting"
    call = next(iter(waiting["calls"]))
    client.runs.inputs(run["run_id"], decisions=[{"target_id": call, "decision_id": uid("d"), "action": "resume",
                                                  "result": {"approved": approved}}])
    assert client.runs.wait(run["run_id"], timeout=WAIT)["status"] == "done"
    return run["thread_id"], run["run_id"], call


def tool_results(client: SyncClient, thread: str) -> list[str]:
    return [m["message"]["content"] for m in client.threads.messages(thread)["messages"] if m["message"]["role"] == "tool"]


def verify(d: Deployment, run_id: str) -> Any:
    return runner.invoke(app, ["replay", run_id, "--verify", "--app", "tests.apps.protocol_app:app", "--nats",
                               d.nats_url, "--timeout", "10"])


def test_counterfactual_denied_instead_of_approved_runs_on_a_new_thread(client: SyncClient) -> None:
    """The approved run, branched at its decision with a denial: a new thread and run that took
    the denial and went on (the tool never ran there), the source untouched."""
    thread, run_id, call = decided_run(client)
    before = client.threads.messages(thread)["messages"]
    branch = client.runs.counterfactual(run_id, call, result={"approved": False}, reason="what if denied")
    assert branch["forked_from"]["thread_id"] == thread and branch["forked_from"]["run_id"] == run_id
    assert branch["forked_from"]["call_id"] == call and branch["run_id"] != run_id
    done = client.runs.wait(branch["run_id"], timeout=WAIT)
    assert done["status"] == "done" and done["thread_id"] == branch["thread_id"]
    assert done["calls"][call]["status"] != client.runs.get(run_id)["calls"][call]["status"]
    assert tool_results(client, thread) == ["deploy"]
    assert tool_results(client, branch["thread_id"]) != ["deploy"]
    assert client.threads.messages(thread)["messages"] == before
