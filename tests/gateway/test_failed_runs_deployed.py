"""A run whose model failed is `failed` wherever users look, and the listings users keep open,
against real subprocesses: the shared `protocol_deployment` (`agentlog serve`, and `agentlog
gateway` + `agentlog worker`; tests/apps/protocol_app.py, whose `longfail` scenario's model refuses
the request with an error far longer than a line, `LONG_ERROR`).

- the run view, `GET /v1/runs?status=failed` (and `done` without it), newest first by default and
  `order=asc` on request, through the HTTP client (`agentlog.client`);
- the CLI: `agentlog runs --status failed`, `agentlog run start --follow` and `agentlog run show`,
  with the model's error whole (not cut at ~60 characters);
- the timeline's summary of the finish, whole, and its `spans`, equal to `agentlog trace --json`;
- `agentlog_runs_finished_total{status="failed"}` on /metrics;
- `GET /v1/changes`: a first frame that says reload, then the ids of what changed, each tenant
  told only of its own threads (the tokens deployment).
The inspector's side (red, the error panel, the live list, the waterfall) is
tests/gateway/test_inspector_live.py."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import aiohttp
import pytest
from typer.testing import CliRunner

from agentlog.cli.core import app
from agentlog.client import AsyncClient, get_sync_client

from tests.apps.protocol_app import LONG_ERROR
from tests.support.topology import Deployment

pytestmark = pytest.mark.usefixtures("keep_structlog_config")
WAIT = 90
runner = CliRunner()


def cli(*args: str) -> Any:
    result = runner.invoke(app, [*args, "--timeout", "10"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return result


def flat(text: str) -> str:
    """`text` with its line breaks and runs of spaces as one space (a terminal wraps long lines)."""
    return " ".join(text.split())


def test_a_failed_run_is_failed_in_the_api_the_client_the_cli_and_the_metrics(protocol_deployment: Deployment) -> None:
    d = protocol_deployment
    with get_sync_client(d.http_url) as client:
        first = client.runs.create("open", "add: one and two")
        done = client.runs.wait(first["run_id"], timeout=WAIT)
        assert done["status"] == "done", done
        thread = first["thread_id"]
        failing = client.runs.inputs(first["run_id"], messages="longfail: now")
        failed = client.runs.wait(failing["run_id"], timeout=WAIT)
        # the events keep the termination; what users see says failed
        assert failed["status"] == "failed", failed
        assert failed["termination"] == {"type": "error", "code": "model_request_rejected", "detail": LONG_ERROR}
        seq = failed["last_seq"]

        # listings: the failed filter, and newest first unless asked otherwise
        mine = {first["run_id"], failing["run_id"]}
        assert [r["run_id"] for r in client.runs.list(thread_id=thread)["runs"]] == [failing["run_id"], first["run_id"]]
        listed = client.runs.list(thread_id=thread, order="asc")
        assert [r["run_id"] for r in listed["runs"]] == [first["run_id"], failing["run_id"]]
        assert listed["order"] == "asc"
        assert [r["run_id"] for r in client.runs.list(thread_id=thread, status="failed")["runs"]] == [failing["run_id"]]
        assert [r["run_id"] for r in client.runs.list(thread_id=thread, status="done")["runs"]] == [first["run_id"]]
        everywhere = client.runs.list(status="failed", limit=200, min_seq=seq)["runs"]
        assert failing["run_id"] in {r["run_id"] for r in everywhere}
        assert all(r["status"] == "failed" for r in everywhere)
        assert first["run_id"] not in {r["run_id"] for r in everywhere}
        newest = client.runs.list(limit=200, min_seq=seq)["runs"]
        assert [r["run_id"] for r in newest if r["run_id"] in mine] == [failing["run_id"], first["run_id"]]
        newest_threads = client.threads.list(limit=1, min_seq=seq)
        assert newest_threads["order"] == "desc"
        oldest_threads = client.threads.list(limit=1, order="asc")
        def creation(t: dict[str, Any]) -> tuple[int, str]:  # the listings' order: creation, then id
            return t["created"], t["thread_id"]
        assert creation(newest_threads["threads"][0]) >= creation(oldest_threads["threads"][0])

    async def read(path: str) -> Any:
        async with aiohttp.ClientSession() as http, http.get(f"{d.http_url}{path}") as resp:
            assert resp.status == 200, await resp.text()
            return await (resp.json() if resp.content_type == "application/json" else resp.text())

    # the timeline's summary of the finish: the error whole
    timeline = asyncio.run(read(f"/v1/runs/{failing['run_id']}/timeline"))
    (finish,) = [e for g in timeline["steps"] for e in g["events"] if e["type"] == "RunFinished"]
    assert flat(LONG_ERROR) in finish["summary"]
    assert timeline["status"] == "failed"
    run_span = next(s for s in timeline["spans"] if s["key"].startswith("run:"))
    assert run_span["status"] == "error" and run_span["error"] == LONG_ERROR

    # the spans the inspector draws are what `agentlog trace --json` computes
    added = asyncio.run(read(f"/v1/runs/{first['run_id']}/timeline"))
    traced = json.loads(cli("trace", first["run_id"], "--json", "--nats", d.nats_url).stdout)
    assert added["spans"] == traced["spans"]
    assert {s["key"].split(":")[0] for s in added["spans"]} == {"run", "step", "chat", "tool"}

    # the CLI: listed failed, newest first; followed to its end with the error whole
    rows = json.loads(cli("runs", "--thread", thread, "--json", "--nats", d.nats_url).stdout)
    assert [(r["run_id"], r["status"]) for r in rows] == [(failing["run_id"], "failed"), (first["run_id"], "done")]
    rows = json.loads(cli("runs", "--thread", thread, "--status", "failed", "--json", "--nats", d.nats_url).stdout)
    assert [r["run_id"] for r in rows] == [failing["run_id"]]
    followed = cli("run", "start", "longfail: from the cli", "--agent", "open", "--follow", "--url", d.http_url)
    out = flat(followed.stdout)
    assert "RunFinished" in out and f"detail={flat(LONG_ERROR)}" in out, followed.stdout
    started = re.search(r"started run (\S+) ", followed.stdout)
    assert started, followed.stdout
    assert f"run {started[1]} failed (error, model_request_rejected): {flat(LONG_ERROR)}" in out
    shown = flat(cli("run", "show", started[1], "--url", d.http_url).stdout.replace("│", " "))  # a table's cells
    assert "status failed" in shown and flat(LONG_ERROR) in shown, shown

    # Prometheus: counted as failed (the gateway follows the log)
    metrics = asyncio.run(read("/metrics"))
    count = re.search(r'^agentlog_runs_finished_total\{status="failed",termination="error"\} (\S+)$', metrics, re.M)
    assert count and float(count[1]) >= 1, metrics


async def changes(http: aiohttp.ClientSession, url: str, token: str) -> tuple[Any, Any]:
    """`GET /v1/changes` as `token`: the response and an iterator of its frames' data."""
    resp = await http.get(f"{url}/v1/changes", headers={"Authorization": f"Bearer {token}"})
    assert resp.status == 200 and resp.content_type == "text/event-stream", await resp.text()

    async def frames() -> Any:
        buf = b""
        async for chunk in resp.content.iter_any():
            buf += chunk
            while b"\n\n" in buf:
                raw, buf = buf.split(b"\n\n", 1)
                lines = dict(line.split(": ", 1) for line in raw.decode().split("\n") if not line.startswith(":"))
                if lines.get("event") == "changes":
                    yield json.loads(lines["data"])

    return resp, frames()


async def test_live_changes_name_what_changed_and_only_to_whom_may_see_it(tokens_deployment: Deployment) -> None:
    url = tokens_deployment.http_url
    async with asyncio.timeout(WAIT), aiohttp.ClientSession() as http, \
            AsyncClient(url, token="te") as tenant_e, AsyncClient(url, token="tf") as tenant_f:
        resp_e, frames_e = await changes(http, url, "te")
        resp_f, frames_f = await changes(http, url, "tf")
        try:
            first_e, first_f = await anext(frames_e), await anext(frames_f)
            assert first_e["reload"] is True and first_e["threads"] == first_e["runs"] == []
            assert first_f["reload"] is True
            # E's run, then F's: F's first named change is its own, never E's
            run_e = await tenant_e.runs.create("open", "text: hi", resource_id="tenantE/x")
            await tenant_e.runs.wait(run_e["run_id"], timeout=WAIT)
            run_f = await tenant_f.runs.create("open", "text: hi", resource_id="tenantF/x")
            await tenant_f.runs.wait(run_f["run_id"], timeout=WAIT)
            seen_e: set[str] = set()
            while run_e["run_id"] not in seen_e:
                frame = await anext(frames_e)
                assert frame["seq"] > first_e["seq"] and not frame["reload"]
                assert run_f["thread_id"] not in frame["threads"] and run_f["run_id"] not in frame["runs"]
                seen_e.update(frame["runs"])
            frame = await anext(frames_f)
            assert run_e["thread_id"] not in frame["threads"] and run_e["run_id"] not in frame["runs"]
            assert run_f["thread_id"] in frame["threads"] or run_f["run_id"] in frame["runs"], frame
            # what a frame names reads as of its seq: the run as the change left it
            view = await tenant_f.runs.get(run_f["run_id"], min_seq=frame["seq"])
            assert view["thread_id"] == run_f["thread_id"]
        finally:
            resp_e.close()
            resp_f.close()
