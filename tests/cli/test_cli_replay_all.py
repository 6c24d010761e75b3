"""`agentlog replay RUN --verify --app module:attr` (the CLI, in-process) on EVERY scenario that
test_replay / test_replay_hitl verify through the library, so the CLI and the library agree on each.

Each runtime-loop scenario (test_replay's cases: test_runtime_scenarios + test_runtime_stop, every
mode) is recorded on a real nats-server exactly as test_replay records it
(`replay_scenarios_app.record`), then every run it started is verified by the CLI with
`--app tests.apps.replay_scenarios_app:<scenario>[__run<k>]`: exit 0 and the success line naming the
commit and event counts of the log. Each HITL scenario (tests.support.hitl.SCENARIOS) is recorded as
test_replay_hitl records it and verified with `--app tests.apps.replay_app:hitl_<scenario>`.
Tampered apps (one per family: sequential tool run, each parallel mode, a stop condition, plugin
actions, HITL runs incl. a continuation) exit 1 and print the diverging event's `seq:index`: the
first completion of a tampered tool in the log, and where the library's `verify_run` diverges too.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentlog.cli.core import app as cli_app
from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import StoredCommit, ToolCallCompleted
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.runtime.replay.verify import plan_replay, verify_run

from tests.runtime.test_hitl_scenarios import resume_in_process, start_waiting
from tests.runtime.test_replay import _scenario_cases, all_commits
from tests.support import hitl as S

#: These tests prove re-executed tools are checked: opt in to re-execution (the default answers
#: every tool from the log, see tests/cli/test_cli_replay.py); an explicit `tools_from_log=` still wins.
verify_run = functools.partial(verify_run, tools_from_log=False)

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# the module the CLI loads (`tests.apps.replay_scenarios_app`): the same object, so the same registry
APP_MODULE = "tests.apps.replay_scenarios_app"
apps = importlib.import_module(APP_MODULE)
runner = CliRunner()

SCENARIOS = [apps.attr_name(p.id) for p in _scenario_cases()]


pytestmark = pytest.mark.usefixtures("keep_structlog_config")


def verify(url: str, run_id: str, spec: str, *extra: str) -> Any:
    return runner.invoke(cli_app, ["replay", run_id, "--verify", "--app", spec, "--reexecute-tools", "*", *extra,
                                   "--nats", url, "--timeout", "5"])


def record(url: str, name: str, nats_server: EmbeddedNatsServer) -> tuple[list[tuple[str, str]], list[StoredCommit]]:
    async def go() -> tuple[list[tuple[str, str]], list[StoredCommit]]:
        store = await JetStreamEventStore.connect(url)
        try:
            async with asyncio.timeout(30):
                runs = await apps.record(name, store, nats_server)
                return runs, await all_commits(store)
        finally:
            await store.close()

    return asyncio.run(go())


def assert_verified(result: Any, run_id: str, log: list[StoredCommit]) -> None:
    assert result.exit_code == 0, result.output
    plan = plan_replay(log, run_id)
    # (the runtime's module logger may print to stdout in this process: the report is the last line)
    line = result.stdout.splitlines()[-1]
    assert line.startswith(f"verified run {run_id}: {len(plan.loop)} commits, {plan.events} events match the log "
                           f"({len(plan.segment) - len(plan.loop)} external); "), line
    t = plan.termination
    assert (f"termination {t.type}" if t else "status ") in line, line
    assert "Traceback" not in result.output


# -- every runtime-loop scenario ------------------------------------------------------------------


def test_every_scenario_of_test_replay_is_covered() -> None:
    assert len(SCENARIOS) == len(set(SCENARIOS)) >= 29 and all(s.isidentifier() for s in SCENARIOS)


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_recorded_scenario_verifies_through_the_cli(nats_server: EmbeddedNatsServer, name: str) -> None:
    runs, log = record(nats_server.url, name, nats_server)
    assert runs, "the scenario started no run"
    for run_id, attr in runs:
        assert_verified(verify(nats_server.url, run_id, f"{APP_MODULE}:{attr}"), run_id, log)


# -- tampered runtime scenarios -------------------------------------------------------------------


@pytest.mark.parametrize("name, run", [
    ("test_multi_step_tool_run_with_state", 0),                                        # sequential tools
    ("test_parallel_calls_run_concurrently_and_commit_as_they_finish__parallel_streaming", 0),
    ("test_parallel_calls_run_concurrently_and_commit_as_they_finish__parallel_batch_approval", 0),
    ("test_max_rounds", 0),                                                            # a stop condition
    ("test_plugin_actions_context_patch_and_user_message", 0),                         # plugin actions
])
def test_a_tampered_tool_exits_1_and_prints_the_diverging_event(nats_server: EmbeddedNatsServer, name: str,
                                                                 run: int) -> None:
    runs, log = record(nats_server.url, name, nats_server)
    run_id, attr = runs[run]
    spec = f"{APP_MODULE}:tampered__{attr}"
    result = verify(nats_server.url, run_id, spec)
    assert result.exit_code == 1, result.output
    # where the log first completes a tool of this run: the tampered value is committed there
    where, expected = next((p, e) for sc in log if sc.commit.run_id == run_id for p, e in sc.positioned()
                           if isinstance(e, ToolCallCompleted) and e.outcome == "succeeded")
    # and exactly where the library diverges with the same app
    report = asyncio.run(verify_run(log, run_id, getattr(apps, f"tampered__{attr}"), raise_on_divergence=False))
    assert not report.ok and report.divergence.position == where
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"replay of run {run_id} diverged at {where} after "), lines
    result_of = lambda value: f'"result":{json.dumps(value, separators=(",", ":"), ensure_ascii=False)}'  # noqa: E731
    assert lines[1].split()[:3] == ["expected", "(log)", "ToolCallCompleted"], lines
    assert result_of(expected.result) in lines[1], lines
    assert lines[2].split()[:3] == ["actual", "(replay)", "ToolCallCompleted"], lines
    assert result_of(apps._changed(expected.result)) in lines[2], lines
    assert "Traceback" not in result.output
    # the untampered app still verifies the same run
    assert_verified(verify(nats_server.url, run_id, f"{APP_MODULE}:{attr}"), run_id, log)


# -- HITL scenarios ------------------------------------------------------------------------------


def record_hitl(url: str, name: str) -> list[StoredCommit]:
    async def go() -> list[StoredCommit]:
        store = await JetStreamEventStore.connect(url)
        try:
            async with asyncio.timeout(30):
                await start_waiting(store, name)
                await resume_in_process(store, name)
                return await all_commits(store)
        finally:
            await store.close()

    return asyncio.run(go())


@pytest.mark.parametrize("name", list(S.SCENARIOS))
def test_every_hitl_scenario_verifies_through_the_cli(nats_server: EmbeddedNatsServer, name: str) -> None:
    log = record_hitl(nats_server.url, name)
    runs = list(dict.fromkeys(sc.commit.run_id for sc in log if sc.commit.run_id))
    assert runs == ([S.RUN, "r2"] if name == "continuation" else [S.RUN])
    for run_id in runs:
        assert_verified(verify(nats_server.url, run_id, f"tests.apps.replay_app:hitl_{name}"), run_id, log)


@pytest.mark.parametrize("name", ["ask_approve", "two_streaming", "two_sequential", "continuation"])
def test_a_tampered_tool_in_a_hitl_run_exits_1_at_its_completion(nats_server: EmbeddedNatsServer, name: str) -> None:
    log = record_hitl(nats_server.url, name)
    deployed = [(p, e) for sc in log if sc.commit.run_id == S.RUN for p, e in sc.positioned()
                if isinstance(e, ToolCallCompleted) and e.outcome == "succeeded"]
    result = verify(nats_server.url, S.RUN, f"tests.apps.replay_app:hitl_changed_{name}")
    assert deployed and str(deployed[0][1].result).startswith("deployed"), deployed
    where = deployed[0][0]
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"replay of run {S.RUN} diverged at {where} after "), lines
    assert "ToolCallCompleted" in lines[1] and "ToolCallCompleted" in lines[2] and "(staging)" in lines[2], lines
    assert "Traceback" not in result.output
