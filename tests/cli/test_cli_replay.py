"""`agentlog replay RUN --verify --app module:attr` against runs recorded on a real nats-server.

Runs are recorded with `tests/apps/replay_app.py:app` (and the HITL scenarios of `tests.support.hitl`)
through `JetStreamEventStore`; the CLI then re-executes them with the app named by `--app` and
checks every commit. Unchanged apps exit 0 with a success line; changed apps (a tool value, the
system prompt, a plugin adding context) exit 1 and print the diverging event; `--app` mistakes
exit 2 with one red line. Most cases use CliRunner; one goes through the installed script.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentlog.cli.core import app as cli_app
from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import InferenceCompleted, StatePatched, StoredCommit
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.runtime import DeterministicEntropy

from tests.apps import replay_app
from tests.runtime.test_hitl_scenarios import resume_in_process, start_waiting
from tests.support import hitl as S

AGENTLOG = str(Path(sys.executable).parent / "agentlog")
ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.replay_app"
runner = CliRunner()


pytestmark = pytest.mark.usefixtures("keep_structlog_config")


class Recorded:
    def __init__(self, url: str, run_id: str, log: list[StoredCommit]) -> None:
        self.url, self.run_id, self.log = url, run_id, log

    def position(self, kind: type, where: Any = lambda e: True) -> str:
        return next(str(p) for sc in self.log for p, e in sc.positioned() if isinstance(e, kind) and where(e))


async def _record(url: str) -> tuple[str, list[StoredCommit]]:
    store = await JetStreamEventStore.connect(url)
    try:
        rt = replay_app.app.runtime(store, entropy=DeterministicEntropy())
        async with asyncio.timeout(20):
            result = await rt.run("calc", "compute")
        assert result.termination.type == "natural_end"
        return result.run_id, [sc async for sc in store.read_thread(result.thread_id)]
    finally:
        await store.close()


@pytest.fixture
def recorded(nats_server: EmbeddedNatsServer) -> Recorded:
    run_id, log = asyncio.run(_record(nats_server.url))
    return Recorded(nats_server.url, run_id, log)


def verify(url: str, run_id: str, attr: str, *extra: str) -> Any:
    return runner.invoke(cli_app, ["replay", run_id, "--verify", "--app", f"{APP}:{attr}", *extra,
                                   "--nats", url, "--timeout", "5"])


# -- verified -------------------------------------------------------------------------------------


def test_unchanged_app_verifies_with_a_success_line(recorded: Recorded) -> None:
    result = verify(recorded.url, recorded.run_id, "app")
    assert result.exit_code == 0, result.output
    events = sum(len(sc.commit.events) for sc in recorded.log)
    line = result.stdout.strip()
    assert line.startswith(f"verified run {recorded.run_id}: {len(recorded.log)} commits, {events} events match")
    assert "termination natural_end" in line and "0 tool run(s) re-executed, 3 answered from the log" in line


def test_json_report(recorded: Recorded) -> None:
    result = verify(recorded.url, recorded.run_id, "app", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["ok"] is True and doc["run_id"] == recorded.run_id and doc["status"] == "done"
    assert doc["commits_verified"] == doc["commits_recorded"] == len(recorded.log)
    assert doc["termination"] == {"type": "natural_end"} and "divergence" not in doc


def test_a_factory_and_a_runtime_are_apps_too(recorded: Recorded) -> None:
    assert verify(recorded.url, recorded.run_id, "factory").exit_code == 0


# -- diverged -------------------------------------------------------------------------------------


def test_a_changed_tool_value_diverges_when_re_executed_and_prints_the_event(recorded: Recorded) -> None:
    result = verify(recorded.url, recorded.run_id, "app_tool_changed", "--reexecute-tools", "add")
    assert result.exit_code == 1, result.output
    # the tool's state edit is committed first in its completion commit: the first difference
    where = recorded.position(StatePatched, lambda e: (e.source or "").startswith("tool"))
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"replay of run {recorded.run_id} diverged at {where}")
    assert lines[1].split()[:3] == ["expected", "(log)", "StatePatched"] and '"value":3' in lines[1]
    assert lines[2].split()[:3] == ["actual", "(replay)", "StatePatched"] and '"value":4' in lines[2]
    assert "Traceback" not in result.output
    doc = json.loads(verify(recorded.url, recorded.run_id, "app_tool_changed", "--reexecute-tools", "*",
                            "--json").stdout)
    assert doc["ok"] is False and doc["divergence"]["position"] == where
    assert doc["divergence"]["expected"]["ops"][0]["value"] == 3


def test_tools_are_answered_from_the_log_by_default(recorded: Recorded) -> None:
    """Temporal's replayer never re-runs activities: by default no tool runs, so a changed (or
    side-effecting) tool is not executed; `--reexecute-tools` opts in per tool."""
    result = verify(recorded.url, recorded.run_id, "app_tool_changed")
    assert result.exit_code == 0, result.output
    assert "0 tool run(s) re-executed, 3 answered from the log" in result.stdout
    echo_only = verify(recorded.url, recorded.run_id, "app_tool_changed", "--reexecute-tools", "echo")
    assert echo_only.exit_code == 0, echo_only.output
    assert "2 tool run(s) re-executed, 1 answered from the log" in echo_only.stdout
    all_but_add = verify(recorded.url, recorded.run_id, "app_tool_changed", "--reexecute-tools", "*",
                         "--tools-from-log", "add")
    assert all_but_add.exit_code == 0, all_but_add.output
    assert "2 tool run(s) re-executed, 1 answered from the log" in all_but_add.stdout


def test_the_default_replay_never_runs_a_side_effecting_tool(recorded: Recorded) -> None:
    """`app_side_effect`'s tools append to a list each time they run: verify leaves it empty."""
    effects = importlib.import_module(APP).SIDE_EFFECTS  # the module --app loads
    effects.clear()
    assert verify(recorded.url, recorded.run_id, "app_side_effect").exit_code == 0
    assert effects == []
    assert verify(recorded.url, recorded.run_id, "app_side_effect", "--reexecute-tools", "*").exit_code == 0
    assert sorted(effects) == ["add", "echo", "echo"]


def test_a_plugin_adding_context_diverges_at_the_first_inference(recorded: Recorded) -> None:
    _needs_request_digest(recorded)
    result = verify(recorded.url, recorded.run_id, "app_with_context")
    assert result.exit_code == 1, result.output
    assert f"diverged at {recorded.position(InferenceCompleted)}" in result.stderr
    assert "the model request differs from the recorded one: system prompt (incl. plugin context) changed" \
        in result.stderr


def test_a_changed_system_prompt_diverges_from_the_log_alone(recorded: Recorded) -> None:
    """No sidecar: the recorded `InferenceCompleted.request_digest` is all replay has."""
    _needs_request_digest(recorded)
    result = verify(recorded.url, recorded.run_id, "app_prompt_changed")
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert f"diverged at {recorded.position(InferenceCompleted)}" in lines[0]
    assert "InferenceCompleted" in lines[1] and "nothing" in lines[2]
    assert "request differs" in lines[3] and "system prompt (incl. plugin context) changed" in lines[3]
    assert "tool list" not in lines[3] and "conversation" not in lines[3]


def test_a_changed_tool_list_is_named(recorded: Recorded) -> None:
    result = verify(recorded.url, recorded.run_id, "app_tool_described")
    assert result.exit_code == 1, result.output
    assert "request differs from the recorded one: tool list changed" in result.stderr
    doc = json.loads(verify(recorded.url, recorded.run_id, "app_tool_described", "--json").stdout)
    assert doc["divergence"]["detail"].endswith(": tool list changed")


def test_another_execution_mode_diverges(recorded: Recorded) -> None:
    result = verify(recorded.url, recorded.run_id, "app_sequential")
    assert result.exit_code == 1 and "diverged at" in result.stderr


def _needs_request_digest(recorded: Recorded) -> None:
    """The loop records every request's digest: what makes request changes visible from the log."""
    digests = [(e.request_digest, e.request_digests) for sc in recorded.log for e in sc.commit.events
               if isinstance(e, InferenceCompleted)]
    assert digests and all(whole and parts for whole, parts in digests)


# -- HITL -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ask_approve", "pending_replay", "two_batch", "cancel_waiting", "continuation"])
def test_hitl_runs_verify(nats_server: EmbeddedNatsServer, name: str) -> None:
    async def record() -> None:
        store = await JetStreamEventStore.connect(nats_server.url)
        try:
            await start_waiting(store, name)
            await resume_in_process(store, name)
        finally:
            await store.close()

    asyncio.run(record())
    for run_id in ([S.RUN, "r2"] if name == "continuation" else [S.RUN]):
        result = verify(nats_server.url, run_id, f"hitl_{name}")
        assert result.exit_code == 0, result.output
        # (in this process the runtime's module logger predates the CLI's logging config and may
        # print to stdout; the installed script imports the runtime after configuring it)
        assert result.stdout.splitlines()[-1].startswith(f"verified run {run_id}:")
    assert verify(nats_server.url, S.RUN, f"hitl_changed_{name}").exit_code == 0  # deploy answered from the log
    changed = verify(nats_server.url, S.RUN, f"hitl_changed_{name}", "--reexecute-tools", "deploy")
    if name in ("ask_approve", "two_batch", "continuation"):  # deploy ran after a decision
        assert changed.exit_code == 1 and "(staging)" in changed.stderr, changed.output
    else:  # deploy never ran (another tool; or cancelled while waiting)
        assert changed.exit_code == 0, changed.output


# -- usage errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize("spec, code, text", [
    ("tests.no_such_module:app", "app_module_not_found", "no module named 'tests.no_such_module'"),
    (f"{APP}:nope", "app_attribute_missing", "has no attribute 'nope'"),
    (f"{APP}:not_an_app", "app_wrong_type", "is a int; expected an agentlog App"),
    (f"{APP}:bad_factory", "app_wrong_type", "returned a int"),
    ("tests.apps.replay_app", "invalid_app_spec", "module:attr"),
    (f"{APP}:hitl_ask_approve", "app_mismatch", "unknown agent 'calc'"),
])
def test_app_errors_are_one_red_line_and_exit_2(recorded: Recorded, spec: str, code: str, text: str) -> None:
    result = runner.invoke(cli_app, ["replay", recorded.run_id, "--verify", "--app", spec,
                                     "--nats", recorded.url, "--timeout", "5"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error [{code}]: ") and text in lines[0], lines
    assert "Traceback" not in result.output


def test_verify_usage(recorded: Recorded) -> None:
    def run(*args: str) -> Any:
        return runner.invoke(cli_app, ["replay", *args, "--nats", recorded.url, "--timeout", "5"])

    no_app = run(recorded.run_id, "--verify")  # no --app: the demo app, which has not this run's agent
    assert no_app.exit_code == 2 and "agentlog.cli.demo:app" in no_app.stderr and "app_mismatch" in no_app.stderr
    assert run(recorded.run_id, "--verify", "--app", f"{APP}:app", "--to", "1:0").exit_code == 2
    assert run(recorded.run_id, "--app", f"{APP}:app").exit_code == 2  # --app without --verify
    missing = run("nope", "--verify", "--app", f"{APP}:app")
    assert missing.exit_code == 2 and "error [run_not_found]" in missing.stderr
    unknown_tool = run(recorded.run_id, "--verify", "--app", f"{APP}:app", "--reexecute-tools", "nope")
    assert unknown_tool.exit_code == 2 and "error [app_mismatch]" in unknown_tool.stderr
    unknown_kept = run(recorded.run_id, "--verify", "--app", f"{APP}:app", "--tools-from-log", "nope")
    assert unknown_kept.exit_code == 2 and "--tools-from-log names tools" in unknown_kept.stderr
    assert run(recorded.run_id, "--tools-from-log", "add").exit_code == 2  # only with --verify


def test_installed_script_exit_codes(recorded: Recorded) -> None:
    """The real entry point, in a new process, from the project root (`tests.apps.replay_app` resolves
    from the current directory)."""
    def run(attr: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["timeout", "60", AGENTLOG, "replay", recorded.run_id, "--verify", "--app", f"{APP}:{attr}",
             "--nats", recorded.url], cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL,
        )

    ok = run("app")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"verified run {recorded.run_id}:")
    bad = run("app_prompt_changed")
    assert bad.returncode == 1 and "diverged at" in bad.stderr and "Traceback" not in bad.stderr


def test_installed_script_json_stays_clean_for_a_cancelled_hitl_run(nats_server: EmbeddedNatsServer) -> None:
    """Cancelling while waiting logs at info level inside the runtime: with --json, stdout must
    still be exactly one JSON document (the runtime logs to stderr, at the CLI's level)."""
    async def record() -> None:
        store = await JetStreamEventStore.connect(nats_server.url)
        try:
            await start_waiting(store, "cancel_waiting")
            await resume_in_process(store, "cancel_waiting")
        finally:
            await store.close()

    asyncio.run(record())
    proc = subprocess.run(
        ["timeout", "60", AGENTLOG, "--log-level", "info", "replay", S.RUN, "--verify", "--app",
         f"{APP}:hitl_cancel_waiting", "--json", "--nats", nats_server.url],
        cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True and doc["termination"]["type"] == "cancelled" and doc["status"] == "done"


YAML_APP = """
version: 1
models:
  main: {type: scripted, script: ["the answer"]}
agents:
  - {id: answerer, model: main, system_prompt: You answer.}
"""


def test_a_yaml_config_is_an_app_for_verify(nats_server: EmbeddedNatsServer, tmp_path: Path) -> None:
    """The docs: `replay --verify` takes a declarative config as `--app agents.yaml`; a changed
    config (another system prompt) diverges."""
    from agentlog.gateway.operations.app_loader import load_app

    config = tmp_path / "agents.yaml"
    config.write_text(YAML_APP)

    async def record() -> str:
        store = await JetStreamEventStore.connect(nats_server.url)
        try:
            async with asyncio.timeout(20):
                result = await load_app(str(config)).runtime(store).run("answerer", "question")
            assert result.termination.type == "natural_end"
            return result.run_id
        finally:
            await store.close()

    run_id = asyncio.run(record())
    args = ["replay", run_id, "--verify", "--app", str(config), "--nats", nats_server.url, "--timeout", "5"]
    verified = runner.invoke(cli_app, args)
    assert verified.exit_code == 0 and verified.stdout.startswith(f"verified run {run_id}"), verified.output
    config.write_text(YAML_APP.replace("You answer.", "You answer briefly."))
    assert runner.invoke(cli_app, args).exit_code == 1
