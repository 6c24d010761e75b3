"""Which server a CLI command talks to, wherever it runs from.

A client command never creates a data dir: run from a directory without one (no `--url`, no
`--nats`), `runs`, `threads`, `run start`, `run approve`, `agents` and `nats req` exit 1 with one
line naming every place they looked (the options, and the absolute data dir), and leave the
directory as it was. On a data dir that has a log but no server running, the API commands start
no nats-server (nothing would answer) and say so, while reads of the log still work. Every
command that reads a server also takes `--url` / `AGENTLOG_URL` (the HTTP API), so it works from
anywhere, against both topologies (the shared protocol deployment), and answers what the same
read over NATS answers; a URL where nothing answers is named in the error.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentlog.cli.core import app
from agentlog.gateway.operations.connection import ConnectionOptions, open_store

from tests.support.topology import Deployment

runner = CliRunner()
#: The environment a user's shell would have without agentlog variables (CliRunner: None unsets).
CLEAN = {"AGENTLOG_URL": None, "AGENTLOG_NATS_URL": None, "AGENTLOG_DATA_DIR": None, "AGENTLOG_API_TOKEN": None,
         "COLUMNS": "300", "NO_COLOR": "1"}

pytestmark = pytest.mark.usefixtures("keep_structlog_config")


def invoke(*args: str, env: dict[str, str | None] | None = None) -> Any:
    return runner.invoke(app, list(args), env={**CLEAN, **(env or {})})


CLIENT_COMMANDS = [
    ("runs",), ("threads",), ("run", "start", "hi", "--agent", "open"), ("run", "approve", "run-1"),
    ("agents",), ("nats", "req", "agentlog.api.agents.list"),
    ("thread", "show", "t-1"), ("thread", "messages", "t-1"), ("events", "tail"), ("replay", "run-1"),
    ("trace", "run-1"), ("profile", "show", "p-1"),
]
#: The reads that take `--url` besides the listings: each with a run or thread the server lacks.
URL_READS = [("thread", "show", "t-none"), ("thread", "messages", "t-none"), ("events", "tail", "--run", "r-none"),
             ("replay", "r-none"), ("trace", "r-none"), ("profile", "show", "p-none")]


@pytest.mark.parametrize("command", CLIENT_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_client_command_without_a_server_creates_nothing_and_says_where_it_looked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: tuple[str, ...]) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke(*command, "--timeout", "2")
    assert result.exit_code == 1, result.output
    error = result.stderr
    assert error.startswith("error [no_server]: "), error
    assert f"--data-dir / $AGENTLOG_DATA_DIR = {tmp_path / '.agentlog'} (no such directory)" in error
    assert "--nats / $AGENTLOG_NATS_URL (not set)" in error and "agentlog serve" in error
    if command[0] != "nats":  # every command that has --url names it among what it looked for
        assert "--url / $AGENTLOG_URL (not set)" in error
    assert list(tmp_path.iterdir()) == []  # no .agentlog, no nats-server


def test_api_commands_on_a_stopped_data_dir_start_no_server_and_reads_still_work(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"

    async def make_log() -> None:  # what a `serve` that has stopped leaves: a data dir with a log
        async with open_store(ConnectionOptions(data_dir=data), "serve"):
            pass

    asyncio.run(make_log())
    server_log = (data / "nats-server.log").read_text()
    monkeypatch.chdir(tmp_path)
    started = invoke("run", "start", "hi", "--agent", "open", "--data-dir", str(data))
    assert started.exit_code == 1, started.output
    assert f"= {data} (it has a log, but no agentlog server is running on it)" in started.stderr, started.stderr
    assert (data / "nats-server.log").read_text() == server_log  # no nats-server was started for it
    # a read of the log starts the data dir's server for the command (and stops it after)
    listed = invoke("runs", "--json", "--data-dir", str(data))
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout) == []
    assert not (data / "server.json").exists()


def test_runs_and_threads_over_the_http_api_from_anywhere(
        protocol_deployment: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    url = protocol_deployment.http_url
    resource = f"cli-target-{tmp_path.name[-12:]}".replace(".", "-")
    started = invoke("run", "start", "text: hi", "--agent", "open", "--resource-id", resource, "--follow", "--json",
                     env={"AGENTLOG_URL": url})
    assert started.exit_code == 0, started.output
    accepted = json.loads(started.stdout.splitlines()[0])
    runs = invoke("runs", "--thread", accepted["thread_id"], "--json", "--url", url)
    assert runs.exit_code == 0, runs.output
    [run] = json.loads(runs.stdout)
    assert (run["run_id"], run["status"], run["agent_id"]) == (accepted["run_id"], "done", "open")
    # the variable alone (a shell's `export AGENTLOG_URL=...`), and the table form
    threads = invoke("threads", "--resource-id", resource, env={"AGENTLOG_URL": url})
    assert threads.exit_code == 0, threads.output
    assert "threads (1)" in threads.stdout and accepted["thread_id"] in threads.stdout
    assert list(tmp_path.iterdir()) == []  # nothing created where the commands ran


def test_a_listing_over_a_url_nothing_answers_names_the_url(dead_nats_url: str) -> None:
    dead = dead_nats_url.replace("nats://", "http://")
    result = invoke("runs", "--url", dead, "--timeout", "2")
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(f"error [connection_failed]: the agentlog API at {dead} did not answer")


@pytest.mark.parametrize("command", URL_READS, ids=lambda c: " ".join(c[:2]))
def test_a_read_over_a_url_nothing_answers_names_the_url(dead_nats_url: str, command: tuple[str, ...]) -> None:
    dead = dead_nats_url.replace("nats://", "http://")
    result = invoke(*command, "--timeout", "2", env={"AGENTLOG_URL": dead})
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(f"error [connection_failed]: the agentlog API at {dead} did not answer"), \
        result.stderr


def test_events_tail_over_a_url_needs_a_thread_or_a_run() -> None:
    result = invoke("events", "tail", "--url", "http://127.0.0.1:9")
    assert result.exit_code == 2, result.output
    assert "give --thread or --run" in result.output


def _json_lines(text: str) -> list[Any]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_reads_over_the_http_api_answer_what_the_log_answers(
        protocol_deployment: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """thread show / messages, events tail, replay, trace and profile show with `--url` (and with
    `$AGENTLOG_URL` alone) print what the same command prints reading the log over NATS."""
    monkeypatch.chdir(tmp_path)
    url, nats = protocol_deployment.http_url, protocol_deployment.nats_url
    resource = f"cli-reads-{tmp_path.name[-12:]}".replace(".", "-")
    started = invoke("run", "start", "add: two numbers", "--agent", "open", "--resource-id", resource,
                     "--follow", "--json", "--url", url)
    assert started.exit_code == 0, started.output
    accepted = json.loads(started.stdout.splitlines()[0])
    thread_id, run_id = accepted["thread_id"], accepted["run_id"]

    def both(*args: str) -> tuple[Any, Any]:
        over_http = invoke(*args, env={"AGENTLOG_URL": url})
        over_nats = invoke(*args, "--nats", nats)
        assert over_http.exit_code == 0 and over_nats.exit_code == 0, (over_http.output, over_nats.output)
        return over_http.stdout, over_nats.stdout

    # the thread: its view (from the server's views), its run, and its state as of an event
    http_doc, nats_doc = (json.loads(out) for out in both("thread", "show", thread_id, "--json"))
    assert [r["run_id"] for r in http_doc["runs"]] == [run_id] and http_doc["runs"][0]["status"] == "done"
    assert http_doc["thread"]["thread_id"] == thread_id and http_doc["state"] == nats_doc["state"]
    events = _json_lines(both("events", "tail", "--run", run_id, "--json")[1])
    first_call = next(e["id"] for e in events if e["type"] == "ToolCallStarted")
    http_at, nats_at = (json.loads(out) for out in both("thread", "show", thread_id, "--at", first_call, "--json"))
    assert (http_at["at"], http_at["state"]) == (nats_at["at"], nats_at["state"]) == (first_call, nats_at["state"])
    table = invoke("thread", "show", thread_id, "--url", url)
    assert table.exit_code == 0 and f"thread {thread_id}" in table.stdout and run_id in table.stdout, table.output

    # messages, with their event ids, in log order
    http_messages, nats_messages = (json.loads(out) for out in both("thread", "messages", thread_id, "--json"))
    assert http_messages == nats_messages and [m["message"]["role"] for m in http_messages][:2] == ["user", "assistant"]

    # the run's events: all of them, from an event on, the last one; the lines read the same
    keep = ("id", "type", "thread_id", "run_id", "event")
    for args in ((), ("--from", first_call), ("-n", "1")):
        http_events, nats_events = (_json_lines(out) for out in both("events", "tail", "--run", run_id, *args, "--json"))
        assert [{k: e[k] for k in keep} for e in http_events] == [{k: e[k] for k in keep} for e in nats_events]
    assert http_events[-1]["type"] == "RunFinished" and len(http_events) == 1
    http_lines, nats_lines = both("events", "tail", "--thread", thread_id)
    assert http_lines == nats_lines and "ToolCallCompleted" in http_lines

    # replay: the same report, as JSON and as text; trace: the same spans
    assert both("replay", run_id, "--json")[0] == both("replay", run_id, "--json")[1]
    http_text, nats_text = both("replay", run_id, "--to", first_call)
    assert http_text == nats_text and f"as of {first_call}" in http_text
    http_trace, nats_trace = (json.loads(out) for out in both("trace", run_id, "--json"))
    assert http_trace == nats_trace and any(s["name"] == "execute_tool add" for s in http_trace["spans"])
    assert both("trace", run_id)[0] == both("trace", run_id)[1]

    # a profile (none written here: the empty profile, the same either way)
    assert both("profile", "show", resource, "--json")[0] == both("profile", "show", resource, "--json")[1]

    # an unknown thread is the API's own error, with the URL
    missing = invoke("thread", "show", "no-such-thread", "--url", url)
    assert missing.exit_code == 2 and missing.stderr.startswith("error [thread_not_found]: "), missing.output
    assert list(tmp_path.iterdir()) == []  # nothing created where the commands ran
