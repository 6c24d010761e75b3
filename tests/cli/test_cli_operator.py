"""The operator's CLI against what users run, `agentlog serve` and `agentlog gateway` + `agentlog
worker` (tests/support/topology.py, app tests/apps/cli_runs_app.py: `deployer` asks before `deploy`, `chat`
answers "hello"): approve/deny record `{"approved": true|false}`, a followed pause ends with the
commands that decide it, `agents`, `thread show|messages`, one error code per condition, the
warnings of `replay --to` and `state?at=` out of range, `--verify` without `--app`, and the help.

The commands run in-process (CliRunner) over the deployment's NATS API, or its HTTP API with
`--url` (then through `agentlog.client`). Synchronisation: `--follow` and `runs.wait` follow the
log; no test waits on time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from agentlog.cli.core import app
from agentlog.client import get_sync_client

from tests.support.topology import TOPOLOGIES, Deployment, deploy

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("keep_structlog_config")


@pytest.fixture(scope="module", params=TOPOLOGIES)
def deployment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with deploy(request.param, tmp_path_factory.mktemp(f"cli-{request.param}"), app="tests.apps.cli_runs_app:app") as running:
        yield running


def cli(d: Deployment, *args: str, http: bool = False) -> Any:
    target = ["--url", d.http_url] if http else ["--nats", d.nats_url]
    return runner.invoke(app, [*args, *target, "--timeout", "10"], env={"COLUMNS": "200", "NO_COLOR": "1"})


def ok(result: Any) -> Any:
    assert result.exit_code == 0, result.output
    return result


def lines(result: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in ok(result).stdout.splitlines()]


def start_waiting(d: Deployment, http: bool = False) -> str:
    out = lines(cli(d, "run", "start", "--agent", "deployer", "ship it", "--follow", "--json", http=http))
    assert out[-1]["type"] == "RunSuspended"
    return str(out[0]["run_id"])


def decisions(d: Deployment, run_id: str) -> list[dict[str, Any]]:
    """The ToolCallDecided events of the run, as the log has them (read over HTTP)."""
    with get_sync_client(d.http_url) as client:
        return [e.event["decision"] for e in client.runs.stream(run_id, follow=False) if e.type == "ToolCallDecided"]


# -- approve / deny ----------------------------------------------------------------------------------


@pytest.mark.parametrize("http", [False, True], ids=["nats", "http"])
def test_approve_records_approved_true_and_follow_names_the_tool(deployment: Deployment, http: bool) -> None:
    run_id = start_waiting(deployment, http)
    followed = ok(cli(deployment, "run", "approve", run_id, "--follow", http=http)).stdout
    decided = next(line for line in followed.splitlines() if "ToolCallDecided" in line)
    assert 'deploy decided resume: {"approved": true}' in decided, followed
    assert "RunFinished" in followed.splitlines()[-1]
    assert [(d["action"], d["result"]) for d in decisions(deployment, run_id)] == [("resume", {"approved": True})]


@pytest.mark.parametrize("http", [False, True], ids=["nats", "http"])
def test_deny_records_approved_false(deployment: Deployment, http: bool) -> None:
    run_id = start_waiting(deployment, http)
    denied = lines(cli(deployment, "run", "deny", run_id, "--reason", "not today", "--follow", "--json", http=http))
    assert denied[0]["action"] == "cancel" and denied[-1]["type"] == "RunFinished"
    assert [(d["action"], d["result"], d["reason"]) for d in decisions(deployment, run_id)] == [
        ("cancel", {"approved": False}, "not today")]


def test_result_option_still_wins(deployment: Deployment) -> None:
    run_id = start_waiting(deployment)
    ok(cli(deployment, "run", "approve", run_id, "--result", '{"approved": true, "ticket": "OPS-1"}', "--follow"))
    assert [d["result"] for d in decisions(deployment, run_id)] == [{"approved": True, "ticket": "OPS-1"}]


def test_a_followed_pause_ends_with_the_commands_that_decide_it_over_http(deployment: Deployment) -> None:
    result = ok(cli(deployment, "run", "start", "--agent", "deployer", "ship it", "--follow", http=True))
    run_id = result.stdout.splitlines()[0].split()[2]
    url = deployment.http_url
    assert result.stdout.splitlines()[-1] == (f"waiting for a human: agentlog run approve {run_id} --url {url}   |   "
                                              f"agentlog run deny {run_id} --url {url} --reason ...")
    # a run that finishes prints no such line
    chat = ok(cli(deployment, "run", "start", "--agent", "chat", "hi", "--follow"))
    assert "RunFinished" in chat.stdout.splitlines()[-1] and "waiting for a human" not in chat.stdout


# -- agents, thread show / messages ------------------------------------------------------------------


@pytest.mark.parametrize("http", [False, True], ids=["nats", "http"])
def test_agents(deployment: Deployment, http: bool) -> None:
    listed = json.loads(ok(cli(deployment, "agents", "--json", http=http)).stdout)
    assert sorted(a["id"] for a in listed) == ["chat", "deployer"]
    table = ok(cli(deployment, "agents", http=http)).stdout
    assert "agents (2)" in table and "deployer" in table and "chat" in table


def test_thread_show_and_messages(deployment: Deployment) -> None:
    first = lines(cli(deployment, "run", "start", "--agent", "chat", "hi", "--follow", "--json"))
    thread_id, run_id = first[0]["thread_id"], first[0]["run_id"]
    child = lines(cli(deployment, "run", "continue", run_id, "again", "--follow", "--json"))[0]

    shown = json.loads(ok(cli(deployment, "thread", "show", thread_id, "--json")).stdout)
    assert shown["thread"]["thread_id"] == thread_id and shown["thread"]["message_count"] == 4
    assert [r["run_id"] for r in shown["runs"]] == [run_id, child["run_id"]] and shown["at"] is None
    text = ok(cli(deployment, "thread", "show", thread_id)).stdout
    assert f"thread {thread_id}" in text and "runs (2)" in text and "chat" in text and "state (now)" in text

    messages = json.loads(ok(cli(deployment, "thread", "messages", thread_id, "--json")).stdout)
    assert [(m["message"]["role"], m["message"]["content"]) for m in messages] == [
        ("user", "hi"), ("assistant", "hello"), ("user", "again"), ("assistant", "hello")]
    assert [m["run_id"] for m in messages] == [run_id, run_id, child["run_id"], child["run_id"]]
    only_child = json.loads(ok(cli(deployment, "thread", "messages", thread_id, "--run", child["run_id"], "--json")).stdout)
    assert only_child == messages[2:]
    after = json.loads(ok(cli(deployment, "thread", "messages", thread_id, "--after", messages[1]["event_id"],
                              "--json")).stdout)
    assert after == messages[2:]
    text = ok(cli(deployment, "thread", "messages", thread_id)).stdout
    assert [line.split()[1:] for line in text.splitlines()] == [
        ["user", "hi"], ["assistant", "hello"], ["user", "again"], ["assistant", "hello"]]

    missing = cli(deployment, "thread", "show", "nosuchthread")
    assert missing.exit_code == 2 and missing.stderr.startswith("error [thread_not_found]"), missing.output


# -- warnings ------------------------------------------------------------------------------------------


def test_state_at_past_the_thread_end_warns_in_the_cli_and_the_api(deployment: Deployment) -> None:
    out = lines(cli(deployment, "run", "start", "--agent", "chat", "hi", "--follow", "--json"))
    thread_id, last = out[0]["thread_id"], out[-1]["id"]
    seq = int(last.split(":")[0])

    inside = ok(cli(deployment, "thread", "show", thread_id, "--at", last, "--json"))
    assert "warning" not in json.loads(inside.stdout) and "warning" not in inside.stderr
    far = f"{seq + 1000}:0"
    past = ok(cli(deployment, "thread", "show", thread_id, "--at", far, "--json"))
    shown = json.loads(past.stdout)
    assert shown["warning"]["code"] == "position_past_end" and shown["warning"]["requested"] == far
    assert shown["at"] == last and shown["state"] == json.loads(inside.stdout)["state"]  # as of the end
    assert past.stderr.startswith(f"warning: event id {far} is after the last event")

    with get_sync_client(deployment.http_url) as client:  # the API answers alike
        assert "warning" not in client.threads.state(thread_id, at=last)
        state = client.threads.state(thread_id, at=far)
        assert state["warning"] == shown["warning"] and state["at"] == last


def test_replay_to_outside_the_run_warns(deployment: Deployment) -> None:
    first = lines(cli(deployment, "run", "start", "--agent", "chat", "hi", "--follow", "--json"))
    child = lines(cli(deployment, "run", "continue", first[0]["run_id"], "again", "--follow", "--json"))
    first_id, child_id = first[0]["run_id"], child[0]["run_id"]

    inside = ok(cli(deployment, "replay", child_id, "--to", child[2]["id"], "--json"))
    assert inside.stderr == "" and "warning" not in json.loads(inside.stdout)
    before = ok(cli(deployment, "replay", child_id, "--to", first[1]["id"], "--json"))
    assert before.stderr.startswith(f"warning: --to {first[1]['id']} is outside run '{child_id}': before its first")
    after = ok(cli(deployment, "replay", first_id, "--to", child[2]["id"], "--json"))
    assert after.stderr.startswith(f"warning: --to {child[2]['id']} is outside run '{first_id}': after its last")
    # past the thread's end: the report's own warning (the end, as the API answers), not a second one
    past = ok(cli(deployment, "replay", child_id, "--to", "999999:0", "--json"))
    assert json.loads(past.stdout)["warning"]["code"] == "position_past_end" and past.stderr == ""


# -- one code per condition ---------------------------------------------------------------------------


def test_an_unknown_run_is_run_not_found_everywhere(deployment: Deployment) -> None:
    for args, http in ((["run", "show", "nosuchrun"], False), (["run", "show", "nosuchrun"], True),
                       (["events", "tail", "--run", "nosuchrun"], False), (["replay", "nosuchrun"], False),
                       (["trace", "nosuchrun"], False)):
        result = cli(deployment, *args, http=http)
        assert result.exit_code == 2 and result.stderr.startswith("error [run_not_found]"), (args, result.output)
    with get_sync_client(deployment.http_url) as client, pytest.raises(Exception) as api:
        client.runs.get("nosuchrun")
    assert api.value.code == "run_not_found"  # type: ignore[attr-defined]


def test_nothing_to_decide_is_the_api_code(deployment: Deployment) -> None:
    run_id = lines(cli(deployment, "run", "start", "--agent", "chat", "hi", "--follow", "--json"))[0]["run_id"]
    cli_code = cli(deployment, "run", "approve", run_id)
    assert cli_code.exit_code == 2 and cli_code.stderr.startswith("error [run_not_waiting]"), cli_code.output
    with get_sync_client(deployment.http_url) as client, pytest.raises(Exception) as api:
        client.runs.decide(run_id, [{"target_id": "c1", "action": "resume"}])  # the server's own refusal
    assert api.value.code == "run_not_waiting"  # type: ignore[attr-defined]


# -- verify without --app -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", TOPOLOGIES)
def test_verify_without_app_uses_and_names_the_default_app(kind: str, tmp_path: Path) -> None:
    with deploy(kind, tmp_path, app="") as d, get_sync_client(d.http_url) as client:  # type: ignore[arg-type]
        run = client.runs.create("deployer", "ship 1.4.2")
        assert client.runs.wait(run["run_id"], timeout=60)["status"] == "waiting"
        approved = client.runs.approve(run["run_id"])
        assert client.runs.wait(run["run_id"], min_seq=approved["seq"], timeout=60)["status"] == "done"
        result = runner.invoke(app, ["replay", run["run_id"], "--verify", "--nats", d.nats_url, "--timeout", "10"])
        assert result.exit_code == 0, result.output
        assert result.stderr.startswith("warning: no --app: verifying with agentlog.cli.demo:app,"), result.stderr
        assert f"verified run {run['run_id']}" in result.stdout


# -- help ----------------------------------------------------------------------------------------------


def _commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command path under a (typer's click) group."""
    for name, command in group.commands.items():
        yield (*path, name)
        if hasattr(command, "commands"):
            yield from _commands(command, (*path, name))


def test_help_shows_choices_and_no_bool_placeholders() -> None:
    root = get_command(app)
    everything = [(), *_commands(root)]
    assert ("agents",) in everything and ("thread", "show") in everything and ("thread", "messages") in everything
    for path in everything:
        helped = runner.invoke(app, [*path, "-h"], env={"COLUMNS": "200"})
        assert helped.exit_code == 0 and "Usage: agentlog" in helped.stdout, (path, helped.output)
        assert "<bool>" not in helped.stdout, (path, helped.stdout)
    assert "--status <running|waiting|done|failed>" in runner.invoke(app, ["runs", "-h"], env={"COLUMNS": "200"}).stdout
    assert "--source <log|views>" in runner.invoke(app, ["threads", "-h"], env={"COLUMNS": "200"}).stdout
    bad = runner.invoke(app, ["runs", "--status", "sleeping"])
    assert bad.exit_code == 2 and "running" in bad.output


def test_no_http_server_is_store_unavailable() -> None:
    result = runner.invoke(app, ["run", "show", "r1", "--url", "http://127.0.0.1:1", "--timeout", "5"])
    assert result.exit_code == 1 and result.stderr.startswith("error [store_unavailable]: the agentlog API at"), \
        result.output
