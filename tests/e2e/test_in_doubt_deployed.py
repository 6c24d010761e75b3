"""A worker SIGKILLed (or stopped: its run handed back) during a call of a tool that is not
idempotent: the next worker does not run it again, it puts the call in doubt, and a human
resolves it (over HTTP, NATS, the CLI and `agentlog.client`: mark done, retry, cancel).

Both topologies (`agentlog serve`; `agentlog gateway` + `agentlog worker`), the app
tests/apps/serve_app.py (agent `paying`: its `pay` tool appends one line per execution to a file
outside the log, then blocks while its thread is held). Synchronised on the log (a follow until
the commit that matters) and on the processes' banners, never on time.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import aclosing
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from typer.testing import CliRunner

from agentlog.cli.core import app
from agentlog.client import AsyncClient
from agentlog.eventlog.events import IN_DOUBT_ACTION, RunFinished, RunSuspended, StoredCommit, ToolCallStarted
from agentlog.eventlog.jetstream.store import JetStreamEventStore

from tests.support.topology import Deployment

TIMEOUT = 90
pytestmark = pytest.mark.usefixtures("keep_structlog_config")


@pytest.fixture
def deployment_options(tmp_path: Path) -> dict[str, object]:
    (tmp_path / "hold").mkdir()
    return {"app": "tests.apps.serve_app:app", "env": {"SERVE_APP_HOLD_DIR": str(tmp_path / "hold"),
                                                        "AGENTLOG_WORKER_ACK_WAIT": "2",
                                                        "AGENTLOG_SHUTDOWN_TIMEOUT": "0.2"}}


async def until(store: JetStreamEventStore, thread_id: str, event: type) -> StoredCommit:
    """The first commit of the thread holding an `event`, waiting for it on the live log."""
    async with aclosing(store.follow(thread_id, 0)) as commits:
        async for sc in commits:
            if any(isinstance(e, event) for e in sc.commit.events):
                return sc
    raise AssertionError("the log follow ended")


def executions(hold: Path) -> list[tuple[str, str]]:
    path = hold / "executions"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(run, call) for run, call in (line.split() for line in lines)]


async def cli(*args: str) -> tuple[int, str]:
    """`agentlog ...` in this process (CliRunner), off the event loop (the CLI runs its own)."""
    result = await asyncio.to_thread(CliRunner().invoke, app, list(args), env={"COLUMNS": "250", "NO_COLOR": "1"})
    return result.exit_code, result.output


async def test_in_doubt_after_a_worker_sigkill_mid_call_then_resolved(deployment: Deployment, tmp_path: Path) -> None:
    d, hold = deployment, tmp_path / "hold"
    driver = "serve" if d.kind == "serve" else "worker-0"
    store = await JetStreamEventStore.connect(d.nats_url)
    try:
        async with asyncio.timeout(TIMEOUT):
            runs: dict[str, str] = {}
            async with aiohttp.ClientSession(d.http_url) as http:
                for thread in ("ta", "tb"):
                    async with http.post("/v1/runs", json={"agent_id": "paying", "messages": "pay",
                                                           "thread_id": thread}) as r:
                        assert r.status == 202, await r.text()
                        runs[thread] = (await r.json())["run_id"]
            calls = {}
            for thread in ("ta", "tb"):
                started = await until(store, thread, ToolCallStarted)
                calls[thread] = next(e.call_id for e in started.commit.events if isinstance(e, ToolCallStarted))
            # ToolCallStarted is committed before the tool runs: wait for both effects (the file
            # the tools append to, in another process: polled, there is nothing to subscribe to)
            while len(executions(hold)) < 2:
                await asyncio.sleep(0.02)
            for thread in ("ta", "tb"):
                (hold / thread).touch()  # released: a retry finishes
            await asyncio.to_thread(d.kill, driver)
            # the effect happened (the lines were appended before the tools blocked); it is in doubt
            assert sorted(executions(hold)) == sorted((runs[t], calls[t]) for t in ("ta", "tb"))
            await asyncio.to_thread(d.start, driver)
            suspended_at = 0  # the log position of the later suspension: reads below wait for it
            for thread in ("ta", "tb"):
                waiting = await until(store, thread, RunSuspended)
                suspended_at = max(suspended_at, waiting.seq)
                [suspended] = [e for e in waiting.commit.events if type(e).__name__ == "ToolCallSuspended"]
                assert suspended.ticket.action == IN_DOUBT_ACTION and suspended.call_id == calls[thread]
            assert len(executions(hold)) == 2, "an in-doubt call ran again"

            run_a, call_a = runs["ta"], calls["ta"]
            async with aiohttp.ClientSession(d.http_url) as http:
                async with http.get(f"/v1/runs/{run_a}?min_seq={suspended_at}") as r:
                    view = await r.json()
                assert view["status"] == "waiting" and view["calls"][call_a]["in_doubt"] is True
                assert view["calls"][call_a]["ticket"]["action"] == IN_DOUBT_ACTION
                before = [sc.seq async for sc in store.read_thread("ta")]
                for bad in ({"action": "done"}, {"action": "retry", "extra": 1}, {"action": "mark_done"}, None):
                    decision: dict[str, Any] = {"target_id": call_a, "decision_id": "bad", "action": "resume",
                                                "result": bad}
                    async with http.post(f"/v1/runs/{run_a}/inputs", json={"decisions": [decision]}) as r:
                        body = await r.json()
                        assert (r.status, body["code"]) == (400, "invalid_decision"), body
                # the NATS API: the same refusal, as a micro error
                bad_decision = {"target_id": call_a, "decision_id": "bad", "action": "resume",
                                "result": {"action": "mark_done"}}
                msg = await store.nc.request("agentlog.api.runs.inputs", json.dumps(
                    {"run_id": run_a, "decisions": [bad_decision]}).encode(), timeout=10)
                assert (msg.headers or {}).get("Nats-Service-Error-Code") == "400", msg.data
                assert json.loads(msg.data)["code"] == "invalid_decision"
                assert [sc.seq async for sc in store.read_thread("ta")] == before  # nothing written
                # the views have both suspensions before the CLI lists them (its read takes no min_seq)
                async with http.get(f"/v1/runs?min_seq={suspended_at}") as r:
                    assert r.status == 200, await r.text()

            code, listing = await cli("runs", "--url", d.http_url)
            assert code == 0 and f"(in doubt: {calls['tb']})" in listing, listing
            code, shown = await cli("run", "show", runs["tb"], "--url", d.http_url)
            assert code == 0 and "in doubt" in shown and "agentlog run resolve" in shown, shown
            code, out = await cli("run", "resolve", runs["tb"], calls["tb"], "--mark-done", '{"ref": "p-1"}',
                                  "--url", d.http_url)
            assert code == 0, out
            async with AsyncClient(d.http_url) as client:
                accepted = await client.runs.resolve(run_a, call_a, "retry")
                assert accepted["decided"] == [call_a]
            for thread in ("ta", "tb"):
                end = await until(store, thread, RunFinished)
                assert [e.termination.type for e in end.commit.events if isinstance(e, RunFinished)] == ["natural_end"]
            # tb: marked done, never run again; ta: run again once, by the human's retry, same call id
            assert sorted(executions(hold)) == sorted([(runs["tb"], calls["tb"]), (run_a, call_a), (run_a, call_a)])
            async with aiohttp.ClientSession(d.http_url) as http:
                async with http.get(f"/v1/runs/{runs['tb']}?min_seq={end.seq}") as r:
                    call_b = (await r.json())["calls"][calls["tb"]]
            assert call_b["status"] == "succeeded" and call_b["result"] == {"ref": "p-1"}

            # a stop (SIGTERM, a shutdown timeout shorter than the tool) hands the run back: in doubt too
            async with aiohttp.ClientSession(d.http_url) as http:
                async with http.get("/v1/agents") as r:
                    [paying] = [a for a in (await r.json())["agents"] if a["id"] == "paying"]
                assert paying["tools"][0]["name"] == "pay" and paying["tools"][0]["idempotent"] is False
                async with http.post("/v1/runs", json={"agent_id": "paying", "messages": "pay", "thread_id": "tc"}) as r:
                    assert r.status == 202, await r.text()
                    runs["tc"] = (await r.json())["run_id"]
            started = await until(store, "tc", ToolCallStarted)
            calls["tc"] = next(e.call_id for e in started.commit.events if isinstance(e, ToolCallStarted))
            await asyncio.to_thread(d.stop, driver)
            assert "handing 1 run back" in d.output(driver), d.output(driver)
            (hold / "tc").touch()
            await asyncio.to_thread(d.start, driver)
            await until(store, "tc", RunSuspended)
            code, out = await cli("run", "resolve", runs["tc"], calls["tc"], "--cancel", "--url", d.http_url)
            assert code == 0, out
            end = await until(store, "tc", RunFinished)
            assert [(r, c) for r, c in executions(hold) if r == runs["tc"]] == [(runs["tc"], calls["tc"])]
            async with aiohttp.ClientSession(d.http_url) as http:
                async with http.get(f"/v1/runs/{runs['tc']}?min_seq={end.seq}") as r:
                    assert (await r.json())["calls"][calls["tc"]]["status"] == "cancelled"

            # every run replays identically, the interruptions included
            code, out = await cli("replay", "--verify", "--all", "--strict", "--app", "tests.apps.serve_app:app",
                                  "--nats", d.nats_url)
            assert code == 0 and all(run in out for run in runs.values()), out
    finally:
        await store.close()
