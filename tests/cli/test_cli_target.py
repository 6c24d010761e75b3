"""Which server a CLI command talks to, wherever it runs from.

A client command never creates a data dir: run from a directory without one (no `--url`, no
`--nats`), `runs`, `threads`, `run start`, `run approve`, `agents` and `nats req` exit 1 with one
line naming every place they looked (the options, and the absolute data dir), and leave the
directory as it was. On a data dir that has a log but no server running, the API commands start
no nats-server (nothing would answer) and say so, while reads of the log still work. `runs` and
`threads` also take `--url` / `AGENTLOG_URL` (the HTTP API), so they work from anywhere, against
both topologies (the shared protocol deployment).
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
]


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
