"""Recorded runs across deployments, in both topologies users run (`agentlog serve`, and `agentlog
gateway` + `agentlog worker`): runs made over HTTP on one deployment (the shared protocol
deployment, `tests/apps/protocol_app.py`) are exported from its log with `agentlog export`,
imported with `agentlog import` into the log of a fresh deployment of the same app, whose views and
listings then show them and whose workers carry an imported waiting run on when it is approved
there; `agentlog replay --verify --all` verifies them over either live log and `--file` from the
recording alone, and a changed app diverges at each run's first inference.

The CLI runs in process (`CliRunner`) against the deployments' nats-servers; the runs, views,
listings and decisions go through the deployments' HTTP APIs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from typer.testing import CliRunner

from agentlog.cli.core import app as cli_app
from agentlog.cli.demo import follow_run
from agentlog.eventlog.events import InferenceCompleted, ToolCallSuspended
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.recording import Recording, read_recording
from agentlog.runtime.replay.verify import replay_app_digest

from tests.apps import protocol_app
from tests.support.deployed_runs import LIMIT, start_and_settle
from tests.support.topology import Deployment, deploy

APP = "tests.apps.protocol_app:app"
CHANGED = "tests.apps.recorded_app:prompt_changed"
runner = CliRunner()

pytestmark = pytest.mark.usefixtures("keep_structlog_config")


class Targets:
    """A fresh deployment of the protocol app per topology, started on first use and stopped at
    the end of the module: the log the recordings are imported into."""

    def __init__(self, stack: contextlib.ExitStack, tmp: pytest.TempPathFactory) -> None:
        self._stack, self._tmp = stack, tmp
        self._running: dict[str, Deployment] = {}

    def get(self, kind: str) -> Deployment:
        if kind not in self._running:
            self._running[kind] = self._stack.enter_context(
                deploy(kind, self._tmp.mktemp(f"recorded-target-{kind}"), app=APP))  # type: ignore[arg-type]
        return self._running[kind]


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Targets]:
    with contextlib.ExitStack() as stack:
        yield Targets(stack, tmp_path_factory)


@pytest.fixture
def target(protocol_deployment: Deployment, targets: Targets) -> Deployment:
    return targets.get(protocol_deployment.kind)


def cli(*args: str) -> Any:
    result = runner.invoke(cli_app, list(args))
    return result


def approve(call_id: str) -> dict[str, Any]:
    return {"decisions": [{"target_id": call_id, "decision_id": f"ok-{call_id}", "action": "resume",
                           "result": {"approved": True}}]}


async def _settle(deployment: Deployment, thread_id: str, run_id: str, after: int) -> int:
    """Follow the log until the run waits or ends again; its seq."""
    store = await JetStreamEventStore.connect(deployment.nats_url)
    try:
        async with asyncio.timeout(LIMIT):
            seq, _ = await follow_run(store, thread_id, run_id, after, lambda _c: None)
        return seq
    finally:
        await store.close()


async def _suspended_call(deployment: Deployment, run_id: str) -> str:
    store = await JetStreamEventStore.connect(deployment.nats_url)
    try:
        return next(e.call_id for sc in [c async for c in store.read_run(run_id)]
                    for e in sc.commit.events if type(e) is ToolCallSuspended)
    finally:
        await store.close()


@dataclass
class Made:
    """Runs made over HTTP on the source deployment: `waiting` stops for an approval; `approved`
    was approved and finished, and `continued` (a message after it, same thread) continues it;
    `opened` ran a tool and set state, no approval."""

    waiting: dict[str, Any]
    approved: dict[str, Any]
    continued: dict[str, Any]
    opened: dict[str, Any]

    @property
    def asked(self) -> list[str]:
        return [self.waiting["run_id"], self.approved["run_id"], self.opened["run_id"]]


async def make_runs(source: Deployment) -> Made:
    async with aiohttp.ClientSession(source.http_url) as http:
        waiting, _, _ = await start_and_settle(source.nats_url, http, {"agent_id": "sequential",
                                                                       "messages": "approval: ship it"})
        approved, seq, _ = await start_and_settle(source.nats_url, http, {"agent_id": "sequential",
                                                                          "messages": "approval: deploy it"})
        call = await _suspended_call(source, approved["run_id"])
        async with http.post(f"/v1/runs/{approved['run_id']}/inputs", json=approve(call)) as r:
            assert r.status == 202, await r.text()
        seq = await _settle(source, approved["thread_id"], approved["run_id"], seq)
        async with http.post(f"/v1/runs/{approved['run_id']}/inputs", json={"messages": ["add: then add"]}) as r:
            assert r.status == 202, await r.text()
            continued = await r.json()
        await _settle(source, continued["thread_id"], continued["run_id"], seq)
        opened, _, _ = await start_and_settle(source.nats_url, http, {"agent_id": "open", "messages": "add: 1 and 2"})
    return Made(waiting, approved, continued, opened)


#: Runs made once per topology (and pytest process): every test reads them, none changes them.
_made: dict[str, Made] = {}


@pytest.fixture
def made(protocol_deployment: Deployment) -> Made:
    if protocol_deployment.kind not in _made:
        _made[protocol_deployment.kind] = asyncio.run(make_runs(protocol_deployment))
    return _made[protocol_deployment.kind]


def export(source: Deployment, path: Path, *run_ids: str) -> Recording:
    args = [a for r in run_ids for a in ("--run", r)]
    result = cli("export", *args, "-o", str(path), "--nats", source.nats_url, "--timeout", "10")
    assert result.exit_code == 0, result.output
    return read_recording(path.read_bytes())


def first_inference(rec: Recording, run_id: str) -> str:
    return next(str(p) for sc in rec.commits if sc.commit.run_id == run_id for p, e in sc.positioned()
                if type(e) is InferenceCompleted)


async def _last_seq(deployment: Deployment) -> int:
    store = await JetStreamEventStore.connect(deployment.nats_url)
    try:
        return await store.last_seq()
    finally:
        await store.close()


# -- export ---------------------------------------------------------------------------------------


def test_export_runs_from_a_deployed_log(protocol_deployment: Deployment, made: Made, tmp_path: Path) -> None:
    rec = export(protocol_deployment, tmp_path / "runs.jsonl", *made.asked)
    assert rec.header.runs == made.asked  # in the order they were made
    # the continuation came with the run it continues, on the same thread
    assert set(rec.run_ids()) == {*made.asked, made.continued["run_id"]}
    assert set(rec.threads()) == {made.waiting["thread_id"], made.approved["thread_id"], made.opened["thread_id"]}
    # the app the deployment recorded on every run, by name and digest: the protocol app's
    assert rec.header.app_digest == replay_app_digest(protocol_app.app)
    assert [a.name for a in rec.header.apps] == ["default"]
    # the waiting run's thread ends where it waits for the human
    waiting = rec.threads()[made.waiting["thread_id"]]
    assert any(type(e) is ToolCallSuspended for e in waiting[-1].commit.events)


# -- import into a fresh deployment ---------------------------------------------------------------


async def _views(target: Deployment, made: Made, min_seq: int) -> dict[str, Any]:
    async with aiohttp.ClientSession(target.http_url) as http:
        out: dict[str, Any] = {}
        for key, run in (("waiting", made.waiting), ("approved", made.approved), ("continued", made.continued),
                         ("opened", made.opened)):
            async with http.get(f"/v1/runs/{run['run_id']}", params={"min_seq": str(min_seq)}) as r:
                assert r.status == 200, await r.text()
                out[key] = await r.json()
        async with http.get("/v1/runs", params={"thread_id": made.approved["thread_id"], "min_seq": str(min_seq)}) as r:
            assert r.status == 200, await r.text()
            out["thread_runs"] = await r.json()
        async with http.get("/v1/runs", params={"parent_run_id": made.approved["run_id"]}) as r:
            out["children"] = await r.json()
        async with http.get("/v1/runs", params={"agent_id": "sequential", "status": "waiting", "limit": "500"}) as r:
            out["waiting_list"] = await r.json()
        async with http.get(f"/v1/threads/{made.opened['thread_id']}", params={"min_seq": str(min_seq)}) as r:
            assert r.status == 200, await r.text()
            out["opened_thread"] = await r.json()
        async with http.get(f"/v1/threads/{made.approved['thread_id']}/messages") as r:
            assert r.status == 200, await r.text()
            out["messages"] = await r.json()
    return out


def _runs(listing: dict[str, Any]) -> list[str]:
    return [r["run_id"] for r in listing["runs"]]


def test_import_runs_into_a_fresh_deployment_shows_them_in_views_and_listings(
        protocol_deployment: Deployment, target: Deployment, made: Made, tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    rec = export(protocol_deployment, path, *made.asked)
    imported = cli("import", str(path), "--json", "--nats", target.nats_url, "--timeout", "10")
    assert imported.exit_code == 0, imported.output
    report = json.loads(imported.stdout)
    assert report["written"] + report["present"] == len(rec.commits) and report["threads"] == 3

    views = asyncio.run(_views(target, made, asyncio.run(_last_seq(target))))
    assert views["waiting"]["status"] == "waiting" and views["waiting"]["agent_id"] == "sequential"
    assert views["approved"]["status"] == "done" and views["approved"]["termination"]["type"] == "natural_end"
    assert views["continued"]["status"] == "done" and views["continued"]["parent_run_id"] == made.approved["run_id"]
    assert views["opened"]["status"] == "done" and views["opened"]["app"]["digest"] == rec.header.app_digest
    assert _runs(views["thread_runs"]) == [made.continued["run_id"], made.approved["run_id"]]  # newest first
    assert _runs(views["children"]) == [made.continued["run_id"]]
    assert made.waiting["run_id"] in _runs(views["waiting_list"])
    assert views["opened_thread"]["state"] == {"last_sum": 3}
    texts = [m["message"]["content"] for m in views["messages"]["messages"] if m["message"]["role"] == "assistant"]
    assert "All done." in texts  # the approved run's answer, read on the new deployment

    again = cli("import", str(path), "--json", "--nats", target.nats_url)
    assert again.exit_code == 0 and json.loads(again.stdout)["written"] == 0  # idempotent


def test_import_runs_then_approving_the_imported_waiting_run_finishes_it_on_the_new_deployment(
        protocol_deployment: Deployment, target: Deployment, tmp_path: Path) -> None:
    async def one_waiting() -> dict[str, Any]:
        async with aiohttp.ClientSession(protocol_deployment.http_url) as http:
            started, _, _ = await start_and_settle(protocol_deployment.nats_url, http,
                                                   {"agent_id": "parallel_batch_approval", "messages": "approval: go"})
            return started

    waiting = asyncio.run(one_waiting())
    path = tmp_path / "waiting.jsonl"
    export(protocol_deployment, path, waiting["run_id"])
    assert cli("import", str(path), "--nats", target.nats_url).exit_code == 0

    async def approve_there() -> dict[str, Any]:
        call = await _suspended_call(target, waiting["run_id"])
        after = await _last_seq(target)
        async with aiohttp.ClientSession(target.http_url) as http:
            async with http.post(f"/v1/runs/{waiting['run_id']}/inputs", json=approve(call)) as r:
                assert r.status == 202, (await r.text(), target.outputs())
            seq = await _settle(target, waiting["thread_id"], waiting["run_id"], after)
            async with http.get(f"/v1/runs/{waiting['run_id']}", params={"min_seq": str(seq)}) as r:
                view: dict[str, Any] = await r.json()
        return view

    view = asyncio.run(approve_there())
    assert view["status"] == "done" and view["termination"]["type"] == "natural_end", view
    # and the run, carried on by another deployment, still verifies as one run
    verified = cli("replay", "--verify", "--all", "--run", waiting["run_id"], "--app", APP, "--json",
                   "--nats", target.nats_url)
    assert verified.exit_code == 0, verified.output
    assert json.loads(verified.stdout)["counts"] == {"verified": 1, "diverged": 0, "skipped": 0}


# -- verify every run ------------------------------------------------------------------------------


def test_verify_all_over_the_live_log_of_a_deployment(protocol_deployment: Deployment, made: Made) -> None:
    args = [a for r in made.asked for a in ("--run", r)]
    ok = cli("replay", "--verify", "--all", *args, "--app", APP, "--json", "--nats", protocol_deployment.nats_url)
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.stdout)
    assert {r["run_id"]: r["outcome"] for r in doc["runs"]} == {
        **dict.fromkeys(made.asked, "verified"), made.continued["run_id"]: "verified"}
    assert doc["app_changed"] is False

    changed = cli("replay", "--verify", "--all", "--run", made.opened["run_id"], "--app", CHANGED,
                  "--nats", protocol_deployment.nats_url)
    assert changed.exit_code == 1, changed.output
    assert "0 verified, 1 diverged, 0 skipped of 1 run(s) (log)" in changed.stdout
    assert "(changed since recording)" in changed.stdout and "system prompt" in changed.stdout


def test_verify_all_over_a_file_exported_from_a_deployment(protocol_deployment: Deployment, made: Made,
                                                           tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    rec = export(protocol_deployment, path, *made.asked)
    ok = cli("replay", "--verify", "--file", str(path), "--app", APP)
    assert ok.exit_code == 0, ok.output
    assert "4 verified, 0 diverged, 0 skipped of 4 run(s)" in ok.stdout and "(unchanged)" in ok.stdout

    changed = cli("replay", "--verify", "--file", str(path), "--app", CHANGED, "--json")
    assert changed.exit_code == 1, changed.output
    doc = json.loads(changed.stdout)
    assert doc["counts"] == {"verified": 0, "diverged": 4, "skipped": 0}
    for verdict in doc["runs"]:
        # each at its first inference, named by the source log's event id
        assert verdict["report"]["divergence"]["position"] == first_inference(rec, verdict["run_id"])
