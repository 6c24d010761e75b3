"""`agentlog run start|approve|deny|cancel|continue|show`, the global options, `--version`, `-h`
and `events tail --run/-n`, against a real `agentlog serve` (a subprocess on a real nats-server,
app `tests/apps/cli_runs_app.py`). The run commands go through CliRunner (same process, fast); they
talk to the server over its NATS API, or its HTTP API with --url.

Synchronisation: `--follow` returns when the run suspends or finishes (it reads the log), and
reads of a run's state go through the log, so no test waits on time.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentlog.cli.core import app
from agentlog.eventlog import EmbeddedNatsServer, JetStreamEventStore
from agentlog.eventlog.events import RunFinished, RunSuspended, ToolCallDecided

AGENTLOG = str(Path(sys.executable).parent / "agentlog")
ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


class Server:
    def __init__(self, nats_url: str, http_url: str) -> None:
        self.nats, self.http = nats_url, http_url


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One nats-server and one `agentlog serve` for the module (each test uses its own runs)."""
    nats_server = EmbeddedNatsServer(tmp_path_factory.mktemp("runs") / "nats")
    nats_server.start()
    proc = subprocess.Popen(
        ["timeout", "300", AGENTLOG, "serve", "--app", "tests.apps.cli_runs_app:app", "--nats", nats_server.url,
         "--host", "127.0.0.1", "--port", "0", "--tokens", ""],  # it takes a free port
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
    )
    try:
        assert proc.stdout is not None
        banner = ""
        while "parts" not in banner:  # the banner's last row: the server listens
            line = proc.stdout.readline()
            assert line, f"agentlog serve exited: {banner}"
            banner += line
        http = re.search(r"http://127\.0\.0\.1:\d+", banner)
        assert http, banner
        yield Server(nats_server.url, http[0])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        nats_server.stop()


pytestmark = pytest.mark.usefixtures("keep_structlog_config")


def cli(server: Server, *args: str, http: bool = False) -> Any:
    target = ["--url", server.http] if http else ["--nats", server.nats]
    return runner.invoke(app, [*args, *target, "--timeout", "10"])


def doc(result: Any) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def lines(result: Any) -> list[dict[str, Any]]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def run_events(url: str, run_id: str) -> list[Any]:
    async def read() -> list[Any]:
        store = await JetStreamEventStore.connect(url)
        try:
            return [e async for sc in store.read_run(run_id) for e in sc.commit.events]
        finally:
            await store.close()

    return asyncio.run(read())


def start_waiting(server: Server, http: bool = False) -> dict[str, Any]:
    """A `deployer` run followed until it waits for the approval of its deploy."""
    result = cli(server, "run", "start", "--agent", "deployer", "ship it", "--follow", "--json", http=http)
    out = lines(result)
    accepted, events = out[0], out[1:]
    assert set(accepted) >= {"thread_id", "run_id", "seq"}
    assert events[-1]["type"] == "RunSuspended" and all(e["run_id"] == accepted["run_id"] for e in events)
    return accepted


# -- start / show / approve ----------------------------------------------------------------------


@pytest.mark.parametrize("http", [False, True], ids=["nats", "http"])
def test_start_follow_show_approve_round_trip(server: Server, http: bool) -> None:
    accepted = start_waiting(server, http)
    run_id = accepted["run_id"]
    shown = doc(cli(server, "run", "show", run_id, "--json", http=http))
    assert shown["status"] == "waiting" and shown["agent_id"] == "deployer"
    [call] = shown["calls"].values()
    assert call["status"] == "suspended" and call["ticket"]["parameters"]["tool"] == "deploy"

    approved = lines(cli(server, "run", "approve", run_id, "--follow", "--json", http=http))
    assert approved[0]["decided"] == [call["call_id"]] and approved[0]["action"] == "resume"
    assert approved[-1]["type"] == "RunFinished" and approved[-1]["event"]["termination"]["type"] == "natural_end"
    assert "RunSuspended" not in [e["type"] for e in approved[1:]]  # the earlier suspension is not re-read
    done = doc(cli(server, "run", "show", run_id, "--json", http=http))
    assert done["status"] == "done" and done["calls"][call["call_id"]]["result"] == "deployed prod"


def test_start_prints_ids_and_show_renders_tables(server: Server) -> None:
    result = cli(server, "run", "start", "-a", "deployer", "ship it", "-f")
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    assert first.startswith("started run ") and " on thread " in first
    run_id = first.split()[2]
    # the pause ends the output with the commands that decide it
    *_, suspended, hint = result.stdout.splitlines()
    assert "RunSuspended" in suspended
    assert hint == f"waiting for a human: agentlog run approve {run_id}   |   agentlog run deny {run_id} --reason ..."
    shown = cli(server, "run", "show", run_id)
    assert shown.exit_code == 0, shown.output
    for text in ("status", "waiting", "deployer", "calls (1)", "pending approvals (1)", "deploy", "usage",
                 f"agentlog run approve {run_id}"):
        assert text in shown.stdout, shown.stdout


def test_deny_with_a_reason_records_it_and_the_run_goes_on(server: Server) -> None:
    run_id = start_waiting(server)["run_id"]
    call_id = next(iter(doc(cli(server, "run", "show", run_id, "--json"))["calls"]))
    denied = lines(cli(server, "run", "deny", run_id, call_id, "--reason", "not on friday", "--follow", "--json"))
    assert denied[0]["action"] == "cancel" and denied[-1]["type"] == "RunFinished"
    decided = [e for e in run_events(server.nats, run_id) if isinstance(e, ToolCallDecided)]
    assert [(d.call_id, d.decision.action, d.decision.reason) for d in decided] == [(call_id, "cancel", "not on friday")]
    shown = doc(cli(server, "run", "show", run_id, "--json"))
    assert shown["status"] == "done" and shown["calls"][call_id]["status"] != "succeeded"


def test_cancel_a_waiting_run(server: Server) -> None:
    run_id = start_waiting(server)["run_id"]
    accepted = doc(cli(server, "run", "cancel", run_id, "--reason", "changed my mind", "--json"))
    assert accepted["run_id"] == run_id
    finished = [e for e in run_events(server.nats, run_id) if isinstance(e, RunFinished)]
    assert [f.termination.type for f in finished] == ["cancelled"]
    assert doc(cli(server, "run", "show", run_id, "--json"))["termination"]["type"] == "cancelled"


def test_continue_starts_a_child_run_on_the_same_thread(server: Server) -> None:
    first = lines(cli(server, "run", "start", "--agent", "chat", "hi", "--follow", "--json"))
    parent = first[0]
    assert first[-1]["type"] == "RunFinished"
    child = lines(cli(server, "run", "continue", parent["run_id"], "and again", "--follow", "--json"))
    accepted = child[0]
    assert accepted["thread_id"] == parent["thread_id"] and accepted["run_id"] != parent["run_id"]
    assert child[-1]["type"] == "RunFinished" and child[-1]["run_id"] == accepted["run_id"]
    shown = doc(cli(server, "run", "show", accepted["run_id"], "--json"))
    assert shown["parent_run_id"] == parent["run_id"] and shown["status"] == "done"


# -- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize("http", [False, True], ids=["nats", "http"])
def test_api_errors_are_one_line_and_exit_2(server: Server, http: bool) -> None:
    unknown = cli(server, "run", "show", "nosuchrun", http=http)
    assert unknown.exit_code == 2 and unknown.stderr.startswith("error [run_not_found]"), unknown.output
    agent = cli(server, "run", "start", "--agent", "nobody", "hi", http=http)
    assert agent.exit_code == 2 and "error [agent_not_found]" in agent.stderr, agent.output
    chat = lines(cli(server, "run", "start", "--agent", "chat", "hi", "--follow", "--json", http=http))[0]
    nothing = cli(server, "run", "approve", chat["run_id"], http=http)
    assert nothing.exit_code == 2 and "error [run_not_waiting]" in nothing.stderr, nothing.output
    assert "Traceback" not in unknown.output + agent.output + nothing.output


def test_bad_ids_exit_2_before_contacting_anything() -> None:
    result = runner.invoke(app, ["run", "show", "bad id!", "--nats", "nats://127.0.0.1:1"])
    assert result.exit_code == 2 and "error [invalid_id]" in result.stderr, result.output


def test_no_server_on_the_nats_is_a_clear_error(nats_server: EmbeddedNatsServer) -> None:
    result = runner.invoke(app, ["run", "show", "r1", "--nats", nats_server.url, "--timeout", "2"])
    assert result.exit_code == 1 and "no agentlog server answers" in result.stderr, result.output


# -- global options, version, help ---------------------------------------------------------------


def test_global_nats_option_before_the_command(server: Server) -> None:
    run_id = start_waiting(server)["run_id"]
    before = runner.invoke(app, ["--nats", server.nats, "run", "show", run_id, "--json"])
    assert doc(before)["run_id"] == run_id
    # the command's own option wins over the global one
    dead = runner.invoke(app, ["--nats", "nats://127.0.0.1:1", "run", "show", run_id, "--json", "--nats", server.nats])
    assert doc(dead)["run_id"] == run_id
    tail = runner.invoke(app, ["--nats", server.nats, "events", "tail", "--run", run_id, "--json"])
    assert lines(tail)[-1]["type"] == "RunSuspended"
    # the environment variable is the global option's default
    from_env = runner.invoke(app, ["run", "show", run_id, "--json"], env={"AGENTLOG_NATS_URL": server.nats})
    assert doc(from_env)["run_id"] == run_id


def test_version_and_h_alias() -> None:
    from importlib.metadata import version

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"agentlog {version('agentlog')}"
    for args in (["-h"], ["run", "-h"], ["run", "start", "-h"], ["events", "tail", "-h"], ["replay", "-h"]):
        helped = runner.invoke(app, args)
        assert helped.exit_code == 0 and "Usage: agentlog" in helped.stdout, (args, helped.output)


def test_installed_version() -> None:
    proc = subprocess.run([AGENTLOG, "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("agentlog ")


# -- events tail --run / -n ----------------------------------------------------------------------


def test_events_tail_run_and_last_n(server: Server) -> None:
    one = start_waiting(server)["run_id"]
    other = start_waiting(server)["run_id"]
    mine = lines(cli(server, "events", "tail", "--run", one, "--json"))
    assert mine and {e["run_id"] for e in mine} == {one}
    assert "RunStarted" in [e["type"] for e in mine[:2]] and mine[-1]["type"] == "RunSuspended"
    last2 = lines(cli(server, "events", "tail", "--run", one, "-n", "2", "--json"))
    assert last2 == mine[-2:]
    everything = lines(cli(server, "events", "tail", "-n", "3", "--json"))
    assert len(everything) == 3 and everything[-1]["run_id"] == other
    missing = cli(server, "events", "tail", "--run", "nosuchrun")
    assert missing.exit_code == 2 and "error [run_not_found]" in missing.stderr, missing.output
    assert [e for e in run_events(server.nats, one) if isinstance(e, RunSuspended)]


@pytest.mark.parametrize("answer", [[], ["--retry", "--cancel"], ["--mark-done", "{not json"]],
                         ids=["none", "two", "bad-json"])
def test_run_resolve_in_doubt_takes_exactly_one_answer_before_contacting_anything(answer: list[str]) -> None:
    result = runner.invoke(app, ["run", "resolve", "r1", "c1", *answer, "--nats", "nats://127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert "--mark-done" in result.output or "not JSON" in result.output, result.output
