"""`agentlog export`, `agentlog import` and `agentlog replay --verify --all / --file` (the CLI, in
process) on real nats-servers: a recording written from one log and loaded into another, where
`agentlog runs` lists its runs; the summary table and `--json` of a verification over a file and
over a live log, exit 1 on a divergence; refusals (a corrupt file, a conflicting thread) with
nothing written; usage errors.

Runs are recorded in-process with `tests/apps/replay_app.py:app` under an app name, so their
`RunStarted.app` carries the digest a recording's header and the summary's app line show.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentlog.cli.core import app as cli_app
from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import AppRef, Commit, InferenceCompleted, StoredCommit, ThreadCreated
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.recording import read_recording
from agentlog.runtime import AgentSpec, DeterministicEntropy, Runtime
from agentlog.runtime.models import ScriptedModel
from agentlog.runtime.replay.verify import replay_app_digest

from tests.apps import replay_app

APP = "tests.apps.replay_app"
runner = CliRunner()

pytestmark = pytest.mark.usefixtures("keep_structlog_config")


@pytest.fixture
def second_server(tmp_path: Path) -> Iterator[EmbeddedNatsServer]:
    server = EmbeddedNatsServer(tmp_path / "second")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def cli(*args: str) -> Any:
    return runner.invoke(cli_app, list(args))


class Recorded:
    def __init__(self, url: str, calc: list[str], other: str, log: list[StoredCommit]) -> None:
        self.url, self.calc, self.other, self.log = url, calc, other, log

    def first_inference(self, run_id: str) -> str:
        return next(str(p) for sc in self.log if sc.commit.run_id == run_id for p, e in sc.positioned()
                    if type(e) is InferenceCompleted)


async def _record(url: str) -> Recorded:
    """Two `calc` runs of replay_app and one run of an agent that app lacks."""
    store = await JetStreamEventStore.connect(url)
    try:
        rt = replay_app.app.runtime(store, entropy=DeterministicEntropy())
        rt.app = AppRef(name="calc-app", digest=replay_app_digest(rt))
        calc = [(await rt.run("calc", f"compute {i}")).run_id for i in range(2)]
        other = Runtime(store, agents=[AgentSpec(id="greeter", model=ScriptedModel(["hi"]))],
                        entropy=DeterministicEntropy(prefix="g"))
        other_run = (await other.run("greeter", "hello")).run_id
        log = [sc async for sc in store.read_log()]
        return Recorded(url, calc, other_run, log)
    finally:
        await store.close()


@pytest.fixture
def recorded(nats_server: EmbeddedNatsServer) -> Recorded:
    return asyncio.run(_record(nats_server.url))


def _runs(url: str) -> list[dict[str, Any]]:
    result = cli("runs", "--json", "--nats", url, "--timeout", "5")
    assert result.exit_code == 0, result.output
    runs: list[dict[str, Any]] = json.loads(result.stdout)
    return runs


# -- export / import ------------------------------------------------------------------------------


def test_export_runs_to_a_file_and_import_runs_into_another_log(recorded: Recorded, second_server: EmbeddedNatsServer,
                                                                tmp_path: Path) -> None:
    out = tmp_path / "calc.jsonl"
    exported = cli("export", "--agent", "calc", "-o", str(out), "--json", "--nats", recorded.url)
    assert exported.exit_code == 0, exported.output
    summary = json.loads(exported.stdout)
    assert summary["runs"] == recorded.calc and summary["threads"] == 2
    rec = read_recording(out.read_bytes())
    assert rec.header.runs == recorded.calc and rec.header.filters == {"agent": "calc"}
    assert rec.header.app_digest == replay_app_digest(replay_app.app)
    assert [a.name for a in rec.header.apps] == ["calc-app"] and rec.header.agentlog_version
    assert [sc.commit for sc in rec.commits] == [sc.commit for sc in recorded.log
                                                 if sc.commit.thread_id in rec.threads()]

    imported = cli("import", str(out), "--nats", second_server.url)
    assert imported.exit_code == 0, imported.output
    assert f"imported 2 run(s) on 2 thread(s): {len(rec.commits)} commit(s) written, 0 already in the log" \
        in imported.stdout
    listed = {r["run_id"]: r for r in _runs(second_server.url)}
    assert sorted(listed) == sorted(recorded.calc)
    assert all(r["status"] == "done" and r["agent_id"] == "calc" for r in listed.values())

    again = cli("import", str(out), "--json", "--nats", second_server.url)
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout) == {"threads": 2, "runs": recorded.calc, "written": 0, "present": len(rec.commits)}


def test_export_runs_to_stdout_by_run_and_time(recorded: Recorded) -> None:
    result = cli("export", "--run", recorded.calc[1], "--since", "2023-11-14", "--until", "2100-01-01T00:00:00Z",
                 "--nats", recorded.url)
    assert result.exit_code == 0, result.output
    rec = read_recording(result.stdout_bytes)
    assert rec.header.runs == [recorded.calc[1]] and rec.run_ids() == [recorded.calc[1]]
    none = cli("export", "--since", "2100-01-01", "--nats", recorded.url)
    assert none.exit_code == 0 and read_recording(none.stdout_bytes).commits == ()
    assert "no run matched" in none.stderr
    bad = cli("export", "--since", "yesterday", "--nats", recorded.url)
    assert bad.exit_code == 2 and "--since" in bad.output


def test_import_runs_refuses_a_corrupt_file_and_a_conflicting_thread_and_writes_nothing(
        recorded: Recorded, second_server: EmbeddedNatsServer, tmp_path: Path) -> None:
    out = tmp_path / "all.jsonl"
    assert cli("export", "-o", str(out), "--nats", recorded.url).exit_code == 0
    lines = out.read_bytes().splitlines()
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_bytes(b"\n".join([*lines[:3], lines[3][:-5], *lines[4:]]))
    refused = cli("import", str(corrupt), "--nats", second_server.url)
    assert refused.exit_code == 1 and "error [recording_corrupt]: line 4 of the recording" in refused.stderr
    assert _runs(second_server.url) == []

    async def occupy() -> None:  # the second recorded thread, with other content
        store = await JetStreamEventStore.connect(second_server.url)
        try:
            thread = next(sc.commit.thread_id for sc in recorded.log if sc.commit.run_id == recorded.calc[1])
            await store.append(Commit(commit_id="mine", thread_id=thread, ts=1, events=[ThreadCreated()]), 0)
        finally:
            await store.close()

    asyncio.run(occupy())
    conflict = cli("import", str(out), "--nats", second_server.url)
    assert conflict.exit_code == 1 and "error [import_conflict]" in conflict.stderr, conflict.output
    assert "nothing was imported" in conflict.stderr
    assert _runs(second_server.url) == []  # the other threads were not written either


# -- replay --verify --all / --file ---------------------------------------------------------------


def test_verify_all_over_a_file_prints_a_table_and_exits_1_naming_the_first_differing_event(
        recorded: Recorded, tmp_path: Path) -> None:
    out = tmp_path / "all.jsonl"
    assert cli("export", "-o", str(out), "--nats", recorded.url).exit_code == 0
    ok = cli("replay", "--verify", "--file", str(out), "--app", f"{APP}:app")
    assert ok.exit_code == 0, ok.output
    assert "replay --verify: 2 verified, 0 diverged, 1 skipped of 3 run(s)" in ok.stdout
    rows = {line.split("│")[1].strip(): line for line in ok.stdout.splitlines() if line.count("│") > 3}
    assert "verified" in rows[recorded.calc[0]] and "verified" in rows[recorded.calc[1]]
    assert "skipped" in rows[recorded.other] and "the app has no agent 'greeter'" in rows[recorded.other]
    assert f"digest {replay_app_digest(replay_app.app)} (unchanged)" in ok.stdout
    strict = cli("replay", "--verify", "--file", str(out), "--app", f"{APP}:app", "--strict")
    assert strict.exit_code == 1

    changed = cli("replay", "--verify", "--file", str(out), "--app", f"{APP}:app_prompt_changed")
    assert changed.exit_code == 1, changed.output
    assert "0 verified, 2 diverged, 1 skipped of 3 run(s)" in changed.stdout and "(changed since recording)" in changed.stdout
    for run_id in recorded.calc:
        position = recorded.first_inference(run_id)
        assert f"run {run_id} (agent calc, thread " in changed.stdout
        assert f"diverged at {position}" in changed.stdout  # the source log's event id
    assert "system prompt (incl. plugin context) changed" in changed.stdout

    as_json = cli("replay", "--verify", "--file", str(out), "--app", f"{APP}:app_prompt_changed", "--json",
                  "--run", recorded.calc[0])
    assert as_json.exit_code == 1
    doc = json.loads(as_json.stdout)
    assert doc["counts"] == {"verified": 0, "diverged": 1, "skipped": 0} and doc["app_changed"] is True
    [only] = doc["runs"]
    assert only["run_id"] == recorded.calc[0] and only["outcome"] == "diverged"
    assert only["report"]["divergence"]["position"] == recorded.first_inference(recorded.calc[0])


def test_verify_all_over_the_live_log_with_filters(recorded: Recorded) -> None:
    ok = cli("replay", "--verify", "--all", "--agent", "calc", "--app", f"{APP}:app", "--json",
             "--nats", recorded.url)
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.stdout)
    assert doc["source"] == "log" and [r["run_id"] for r in doc["runs"]] == recorded.calc
    assert doc["counts"] == {"verified": 2, "diverged": 0, "skipped": 0} and doc["app_changed"] is False
    tool = cli("replay", "--verify", "--all", "--status", "done", "--app", f"{APP}:app_tool_changed",
               "--reexecute-tools", "*", "--nats", recorded.url)
    assert tool.exit_code == 1, tool.output
    assert "0 verified, 2 diverged, 1 skipped of 3 run(s) (log)" in tool.stdout
    assert "StatePatched" in tool.stdout


def test_verify_all_usage_errors(recorded: Recorded, tmp_path: Path) -> None:
    def run(*args: str) -> Any:
        return cli("replay", *args, "--nats", recorded.url, "--timeout", "5")

    out = tmp_path / "r.jsonl"
    assert cli("export", "-o", str(out), "--nats", recorded.url).exit_code == 0
    for args in (["--all"],  # without --verify
                 ["--verify", "--all", recorded.calc[0]],  # a run id too
                 ["--verify", "--all", "--file", str(out)],  # both sources
                 ["--verify", "--agent", "calc"],  # a filter without --all
                 ["--verify", "--all", "--to", "1:0"],
                 []):  # nothing at all
        result = run(*args, "--app", f"{APP}:app")
        assert result.exit_code == 2, (args, result.output)
    missing = run("--verify", "--file", str(tmp_path / "nope.jsonl"), "--app", f"{APP}:app")
    assert missing.exit_code == 2
    unknown = run("--verify", "--all", "--run", "nope", "--app", f"{APP}:app")
    assert unknown.exit_code == 2 and "error [run_not_found]" in unknown.stderr
