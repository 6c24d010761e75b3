"""The `agentlog` CLI against a real nats-server, on a log written through `JetStreamEventStore`.

Most commands go through typer's CliRunner (same process, fast); the entry point, Ctrl-C while
following and the embedded default go through the installed `agentlog` script in a subprocess.
Synchronisation is by reading output, never by sleeping.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nats
import pytest
from typer.testing import CliRunner

from agentlog.cli.core import app
from agentlog.eventlog import Commit, EmbeddedNatsServer, JetStreamEventStore, collect, new_id
from agentlog.eventlog.events import (
    InferenceCompleted,
    Message,
    MessageAppended,
    RunFinished,
    RunStarted,
    StatePatched,
    StepFinished,
    StepStarted,
    Termination,
    ThreadCreated,
    ToolCall,
    ToolCallCompleted,
    ToolCallGated,
    ToolCallStarted,
    Usage,
)
from agentlog.gateway.operations.connection import ConnectionOptions, open_store
from agentlog.projections import fold_commits
from agentlog.projections.kv import KVViewStore

AGENTLOG = str(Path(sys.executable).parent / "agentlog")
runner = CliRunner()


@dataclass
class Log:
    """What the seeded log holds: the seq of each named commit."""

    url: str
    seqs: dict[str, int] = field(default_factory=dict)


async def _seed(url: str) -> dict[str, int]:
    """Thread t1: run r1 (two steps, a tool call, state patches, natural end), then a continuation
    r3 (cancelled). Thread t2 with run r2 interleaved, so filters and thread folds are exercised."""
    store = await JetStreamEventStore.connect(url)
    seqs: dict[str, int] = {}
    ts = 1_700_000_000_000

    async def put(name: str, thread: str, run: str | None, *events: object) -> None:
        nonlocal ts
        ts += 1000
        commit = Commit(commit_id=new_id(), thread_id=thread, run_id=run, ts=ts, events=list(events))
        result = await store.append(commit, await store.thread_version(thread))
        seqs[name] = result.seq

    try:
        await put("t1", "t1", None, ThreadCreated(resource_id="user-1", metadata={"title": "weather"}))
        await put("start", "t1", "r1", RunStarted(run_id="r1", agent_id="helper"),
                  MessageAppended(message=Message(id="m1", role="user", content="What is the weather in Paris?")),
                  StatePatched(ops=[{"op": "add", "path": "/city", "value": "Paris"}]))
        await put("infer1", "t1", "r1", StepStarted(step=1),
                  MessageAppended(message=Message(id="m2", role="assistant", tool_calls=[
                      ToolCall(id="c1", name="get_weather", arguments={"city": "Paris"})])),
                  InferenceCompleted(model="scripted", usage=Usage(input_tokens=10, output_tokens=5)))
        await put("t2", "t2", "r2", ThreadCreated(resource_id="user-2"), RunStarted(run_id="r2", agent_id="other"))
        await put("call", "t1", "r1", ToolCallGated(call_id="c1", verdict="allow", rule="get_*"),
                  ToolCallStarted(call_id="c1", name="get_weather", arguments={"city": "Paris"}))
        await put("done1", "t1", "r1", ToolCallCompleted(call_id="c1", outcome="succeeded", result={"temp": 21},
                                                         message_id="m3"),
                  MessageAppended(message=Message(id="m3", role="tool", content='{"temp": 21}', tool_call_id="c1")),
                  StatePatched(ops=[{"op": "add", "path": "/weather", "value": {"Paris": 21}}], source="tool"),
                  StepFinished(step=1))
        await put("infer2", "t1", "r1", StepStarted(step=2),
                  MessageAppended(message=Message(id="m4", role="assistant", content="It is 21 degrees in Paris.")),
                  InferenceCompleted(model="scripted", usage=Usage(input_tokens=20, output_tokens=8)),
                  StatePatched(ops=[{"op": "replace", "path": "/city", "value": "Lyon"}]),
                  StepFinished(step=2))
        await put("end", "t1", "r1", RunFinished(termination=Termination(type="natural_end"),
                                                 usage=Usage(input_tokens=30, output_tokens=13)))
        await put("r3", "t1", "r3", RunStarted(run_id="r3", agent_id="helper", parent_run_id="r1"),
                  MessageAppended(message=Message(id="m5", role="user", content="And tomorrow?")),
                  RunFinished(termination=Termination(type="cancelled", code="user", detail="stopped by user")))
    finally:
        await store.close()
    return seqs


pytestmark = pytest.mark.usefixtures("keep_structlog_config")


@pytest.fixture
def seeded(nats_server: EmbeddedNatsServer) -> Log:
    return Log(nats_server.url, asyncio.run(_seed(nats_server.url)))


def cli(log: Log, *args: str):
    # A wide terminal, whatever the test runner's own (pytest-xdist workers inherit a $COLUMNS)
    result = runner.invoke(app, [*args, "--nats", log.url, "--timeout", "5"], env={"COLUMNS": "200"})
    return result


# -- replay ---------------------------------------------------------------------------------------


def test_replay_json_groups_steps_with_state_diffs_and_termination(seeded: Log) -> None:
    s = seeded.seqs
    result = cli(seeded, "replay", "r1", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["run_id"] == "r1" and doc["thread_id"] == "t1"
    assert doc["lineage"] == {"agent_id": "helper", "parent_run_id": None, "parent_thread_id": None,
                              "origin": "user", "continued_by": ["r3"]}
    assert doc["status"] == "done" and doc["to"] is None
    assert doc["termination"] == {"type": "natural_end"}
    assert doc["usage"] == {"input_tokens": 30, "output_tokens": 13}
    assert [g["label"] for g in doc["steps"]] == ["start", "step 1", "step 2", "after step 2"]
    start, step1, step2, end = doc["steps"]
    assert [e["id"] for e in start["events"]] == [f"{s['start']}:0", f"{s['start']}:1", f"{s['start']}:2"]
    assert start["state_diff"] == [{"op": "add", "path": "/thread/city", "value": "Paris"}]
    # step 1 spans three commits of r1 and skips the commit of thread t2 in between
    ids = [e["id"] for e in step1["events"]]
    assert ids[0] == f"{s['infer1']}:0" and ids[-1] == f"{s['done1']}:3"
    assert not any(i.startswith(f"{s['t2']}:") for i in ids)
    types = [e["type"] for e in step1["events"]]
    assert types == ["StepStarted", "MessageAppended", "InferenceCompleted", "ToolCallGated", "ToolCallStarted",
                     "ToolCallCompleted", "MessageAppended", "StatePatched", "StepFinished"]
    completed = step1["events"][5]
    assert completed["event"] == {"type": "ToolCallCompleted", "call_id": "c1", "outcome": "succeeded",
                                  "result": {"temp": 21}, "message_id": "m3"}
    assert "get_weather succeeded" in completed["summary"]
    assert step1["state_diff"] == [{"op": "add", "path": "/thread/weather", "value": {"Paris": 21}}]
    assert step2["state_diff"] == [{"op": "replace", "path": "/thread/city", "value": "Lyon"}]
    assert [e["type"] for e in end["events"]] == ["RunFinished"] and end["state_diff"] == []
    assert doc["state"] == {"thread": {"city": "Lyon", "weather": {"Paris": 21}}, "run": {}}


def test_replay_text_shows_timeline_diffs_and_termination(seeded: Log) -> None:
    s = seeded.seqs
    result = cli(seeded, "replay", "r1")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "run r1" in out and "thread t1" in out and "agent helper" in out
    assert "continued by r3" in out
    for label in ("── start ──", "── step 1 ──", "── step 2 ──", "── after step 2 ──"):
        assert label in out
    assert out.index("── step 1 ──") < out.index(f"{s['call']}:1") < out.index("── step 2 ──")
    assert "user: What is the weather in Paris?" in out
    assert 'get_weather({"city": "Paris"})' in out
    assert "get_weather gate=allow rule=get_*" in out
    assert "add /thread/weather {\"Paris\": 21}" in out
    assert "replace /thread/city \"Lyon\"" in out
    assert "termination: natural_end" in out


def test_replay_to_stops_timeline_and_shows_state_as_of_it(seeded: Log) -> None:
    s = seeded.seqs
    to = f"{s['done1']}:1"  # after the tool completed and its message, before the weather patch
    result = cli(seeded, "replay", "r1", "--to", to, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["to"] == to
    assert [g["label"] for g in doc["steps"]] == ["start", "step 1"]
    assert doc["steps"][-1]["events"][-1]["id"] == to
    assert doc["steps"][-1]["state_diff"] == []
    assert doc["status"] == "running" and doc["termination"] is None
    assert doc["state"] == {"thread": {"city": "Paris"}, "run": {}}

    text = cli(seeded, "replay", "r1", "--to", to)
    assert text.exit_code == 0, text.output
    assert f"as of {to}" in text.stdout and "── step 2 ──" not in text.stdout
    assert "termination: none" in text.stdout


def test_replay_to_after_the_end_is_the_end_with_a_warning(seeded: Log) -> None:
    whole = json.loads(cli(seeded, "replay", "r1", "--json").stdout)
    far = "99999999999999999999:0"  # past any seq: the end, not a KeyError (exit 1, "internal error")
    result = cli(seeded, "replay", "r1", "--to", far, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["warning"]["code"] == "position_past_end" and doc["warning"]["requested"] == far
    assert doc["steps"] == whole["steps"] and doc["state"] == whole["state"] and doc["status"] == whole["status"]
    assert doc["to"] == doc["warning"]["end"]
    text = cli(seeded, "replay", "r1", "--to", far)
    assert text.exit_code == 0 and "warning: event id 99999999999999999999:0" in text.stdout


def test_replay_of_a_continuation_shows_its_parent_and_cancellation(seeded: Log) -> None:
    doc = json.loads(cli(seeded, "replay", "r3", "--json").stdout)
    assert doc["lineage"]["parent_run_id"] == "r1"
    assert doc["termination"] == {"type": "cancelled", "code": "user", "detail": "stopped by user"}
    assert doc["state"]["thread"] == {"city": "Lyon", "weather": {"Paris": 21}}


def test_replay_unknown_run_exits_2(seeded: Log) -> None:
    result = cli(seeded, "replay", "nope")
    assert result.exit_code == 2
    assert "error [run_not_found]" in result.stderr and "'nope'" in result.stderr


@pytest.mark.parametrize("bad", ["x:y", "0:0", "3:-1", "abc"])
def test_replay_malformed_event_id_exits_2_without_contacting_nats(bad: str, dead_nats_url: str) -> None:
    result = runner.invoke(app, ["replay", "r1", "--to", bad, "--nats", dead_nats_url, "--timeout", "1"])
    assert result.exit_code == 2
    assert "error [invalid_event_id]" in result.stderr
    assert "Traceback" not in result.output


def test_invalid_run_id_exits_2(dead_nats_url: str) -> None:
    result = runner.invoke(app, ["replay", "a.b", "--nats", dead_nats_url])
    assert result.exit_code == 2 and "error [invalid_id]" in result.stderr


def test_dead_nats_is_one_clear_line_and_exit_1(dead_nats_url: str) -> None:
    result = runner.invoke(app, ["replay", "r1", "--nats", dead_nats_url, "--timeout", "1"])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error [store_unavailable]: cannot connect to NATS")
    assert "Traceback" not in result.output


# -- events tail ----------------------------------------------------------------------------------


def test_events_tail_no_follow_json_prints_every_event_in_log_order(seeded: Log) -> None:
    s = seeded.seqs
    result = cli(seeded, "events", "tail", "--no-follow", "--json")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == 1 + 3 + 3 + 2 + 2 + 4 + 5 + 1 + 3
    assert rows[0]["id"] == f"{s['t1']}:0" and rows[0]["type"] == "ThreadCreated" and rows[0]["run_id"] is None
    assert rows[-1]["id"] == f"{s['r3']}:2" and rows[-1]["event"]["termination"]["type"] == "cancelled"
    t2 = [r for r in rows if r["thread_id"] == "t2"]
    assert [r["id"] for r in t2] == [f"{s['t2']}:0", f"{s['t2']}:1"] and t2[1]["run_id"] == "r2"
    positions = [tuple(map(int, r["id"].split(":"))) for r in rows]
    assert positions == sorted(positions)


def test_events_tail_thread_filter_and_from(seeded: Log) -> None:
    s = seeded.seqs
    result = cli(seeded, "events", "tail", "--thread", "t1", "--from", f"{s['done1']}:2", "--json")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert rows[0]["id"] == f"{s['done1']}:2" and rows[0]["type"] == "StatePatched"
    assert {r["thread_id"] for r in rows} == {"t1"}
    # a bare seq means seq:0
    bare = cli(seeded, "events", "tail", "--from", str(s["end"]), "--json")
    assert [json.loads(line)["id"] for line in bare.stdout.splitlines()][0] == f"{s['end']}:0"


def test_events_tail_from_after_the_end_starts_at_the_end_with_a_warning(seeded: Log) -> None:
    """Like time travel past the end (replay --to, the API's to/at): the end, and a warning."""
    for far in ("99999999999999999999:0", str(seeded.seqs["end"] + 1000)):
        for where in ((), ("--thread", "t1")):
            result = cli(seeded, "events", "tail", *where, "--from", far, "--json")
            assert result.exit_code == 0, result.output
            assert result.stdout == "" and f"warning: --from {far if ':' in far else far + ':0'} is after the end" \
                in result.stderr, result.stderr


def test_events_tail_text(seeded: Log) -> None:
    s = seeded.seqs
    result = cli(seeded, "events", "tail", "--thread", "t1")
    assert result.exit_code == 0, result.output
    line = next(ln for ln in result.stdout.splitlines() if ln.strip().startswith(f"{s['call']}:1"))
    assert "t1" in line and "r1" in line and "ToolCallStarted" in line and "get_weather" in line


def test_events_tail_bad_from_exits_2(dead_nats_url: str) -> None:
    result = runner.invoke(app, ["events", "tail", "--from", "1:x", "--nats", dead_nats_url])
    assert result.exit_code == 2 and "error [invalid_event_id]" in result.stderr


def test_events_tail_follow_prints_new_commits_and_exits_cleanly_on_sigint(seeded: Log) -> None:
    proc = subprocess.Popen(
        # --foreground: plain `timeout` forwards our SIGINT to the child AND to its process group,
        # i.e. twice, and a second Ctrl-C during clean-up is (rightly) a hard abort.
        ["timeout", "--foreground", "60", AGENTLOG, "events", "tail", "--follow", "--json", "--thread", "t2", "--nats", seeded.url],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        first = [json.loads(proc.stdout.readline()) for _ in range(2)]
        assert [r["type"] for r in first] == ["ThreadCreated", "RunStarted"]

        async def append() -> int:
            store = await JetStreamEventStore.connect(seeded.url)
            try:
                commit = Commit(commit_id=new_id(), thread_id="t2", run_id="r2", ts=1, events=[StepStarted(step=1)])
                return (await store.append(commit, await store.thread_version("t2"))).seq
            finally:
                await store.close()

        seq = asyncio.run(append())
        live = json.loads(proc.stdout.readline())
        assert live["id"] == f"{seq}:0" and live["type"] == "StepStarted"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 0, stderr
        assert "Traceback" not in stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


# -- listings -------------------------------------------------------------------------------------


def test_threads_listing(seeded: Log) -> None:
    result = cli(seeded, "threads", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [t["thread_id"] for t in rows] == ["t2", "t1"]  # newest first
    t1 = rows[1]
    assert t1["resource_id"] == "user-1" and t1["run_ids"] == ["r1", "r3"] and t1["message_count"] == 5
    filtered = json.loads(cli(seeded, "threads", "--json", "--resource-id", "user-2").stdout)
    assert [t["thread_id"] for t in filtered] == ["t2"]
    paged = json.loads(cli(seeded, "threads", "--json", "--limit", "1", "--offset", "1").stdout)
    assert [t["thread_id"] for t in paged] == ["t1"]
    table = cli(seeded, "threads")
    assert table.exit_code == 0 and "t1" in table.stdout and "user-1" in table.stdout


def test_runs_listing(seeded: Log) -> None:
    rows = json.loads(cli(seeded, "runs", "--json").stdout)
    assert [r["run_id"] for r in rows] == ["r3", "r2", "r1"]
    by_id = {r["run_id"]: r for r in rows}
    assert by_id["r1"]["status"] == "done" and by_id["r1"]["steps"] == 2
    assert by_id["r2"]["status"] == "running"
    assert by_id["r3"]["parent_run_id"] == "r1"
    t1 = json.loads(cli(seeded, "runs", "--json", "--thread", "t1", "--status", "done", "--limit", "1").stdout)
    assert [r["run_id"] for r in t1] == ["r3"]
    table = cli(seeded, "runs", "--thread", "t1")
    assert table.exit_code == 0
    assert "r1" in table.stdout and "natural_end" in table.stdout and "cancelled" in table.stdout
    bad = cli(seeded, "runs", "--status", "sleeping")
    assert bad.exit_code == 2


# -- projections rebuild --------------------------------------------------------------------------


def test_projections_rebuild_writes_kv_views_equal_to_the_fold(seeded: Log) -> None:
    result = cli(seeded, "projections", "rebuild", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["last_seq"], doc["commits"], doc["events"], doc["threads"], doc["runs"]) == (9, 9, 24, 2, 3)
    assert "9/9" in result.stderr  # the progress bar, driven by the rebuild's callback, reached the end

    async def check() -> None:
        nc = await nats.connect(seeded.url)
        try:
            store = await JetStreamEventStore.connect(nc)
            views = fold_commits([c for t in ("t1", "t2") for c in await collect(store.read_thread(t))])
            kv = await KVViewStore.open(nc)
            assert kv.generation == doc["generation"]
            assert {r.run_id: r for r in await kv.list_runs()} == views.runs
            assert {t.thread_id: t for t in await kv.list_threads()} == views.threads
        finally:
            await nc.close()

    asyncio.run(check())
    again = cli(seeded, "projections", "rebuild")
    assert again.exit_code == 0 and "2 threads, 3 runs up to seq 9" in again.stdout
    # the listings read the same views from KV with --source views
    for command in (["runs", "--json"], ["threads", "--json"], ["runs", "--json", "--thread", "t1"]):
        from_log = cli(seeded, *command)
        from_views = cli(seeded, *command, "--source", "views")
        assert from_views.exit_code == 0, from_views.output
        assert json.loads(from_views.stdout) == json.loads(from_log.stdout)
    assert cli(seeded, "runs", "--source", "cache").exit_code == 2


def test_projections_rebuild_of_an_empty_log(nats_server: EmbeddedNatsServer) -> None:
    result = runner.invoke(app, ["projections", "rebuild", "--json", "--nats", nats_server.url])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["commits"] == 0


# -- the installed entry point and the embedded default -------------------------------------------


def test_entry_point_starts_and_stops_the_embedded_server(tmp_path: Path) -> None:
    """A read of the log on a data dir with no server running (a stopped `serve`'s) starts its
    server for the command and stops it at exit (tests/cli/test_cli_target.py: never a new data dir)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLOG_")}
    data = tmp_path / "data"

    async def make_log() -> None:
        async with open_store(ConnectionOptions(data_dir=data), "serve"):
            pass

    asyncio.run(make_log())
    proc = subprocess.run(
        ["timeout", "60", AGENTLOG, "runs", "--json", "--data-dir", str(data)],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=90,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
    assert (data / "jetstream").is_dir()
    port = next(int(ln.split()[1]) for ln in (data / "nats-server.conf").read_text().splitlines()
                if ln.startswith("port:"))
    with pytest.raises(OSError):  # stopped at exit
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_entry_point_dead_nats_exit_1(tmp_path: Path, dead_nats_url: str) -> None:
    proc = subprocess.run(
        ["timeout", "60", AGENTLOG, "events", "tail", "--nats", dead_nats_url, "--timeout", "1"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=90,
    )
    assert proc.returncode == 1
    assert "error [store_unavailable]" in proc.stderr and "Traceback" not in proc.stderr
