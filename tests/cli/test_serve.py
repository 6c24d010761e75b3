"""`agentlog.cli.assembly`: one process assembled from its parts, answering HTTP; clean, ordered stop;
and the point of the whole design: a run waiting for approval survives the process. The server
is stopped while the run waits, a new one starts on the same embedded data dir, the approval goes
to the new one over HTTP, and the run finishes. Gateway and worker as separate roles too."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentlog.cli.assembly import Server, ServerConfig, serve
from agentlog.cli.demo import DEMO_AGENT, approval_for, follow_run, suspended_calls
from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import RunFinished, RunSuspended, StoredCommit
from agentlog.gateway.operations.connection import ConnectionOptions

from tests.support.serve import HTTP_ROW, read_banner

LIMIT = 60


def _config(tmp_path: Path, **kw: Any) -> ServerConfig:
    kw.setdefault("connection", ConnectionOptions(data_dir=tmp_path / "data"))
    return ServerConfig(port=0, tokens="", **kw)


def _closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


async def _until(store: Any, thread_id: str, run_id: str, after: int = 0) -> tuple[int, StoredCommit]:
    async with asyncio.timeout(LIMIT):
        return await follow_run(store, thread_id, run_id, after, lambda _c: None)


async def test_serve_answers_and_stops_cleanly(tmp_path: Path) -> None:
    async with asyncio.timeout(LIMIT):
        server = await Server(_config(tmp_path)).start()
        port, nats = server.port, server.embedded
        assert port and nats is not None and nats.running
        assert {"worker", "dispatch:queue", "write", "nats-service", "adapters"} <= set(server.parts)
        try:
            assert server.store is not None  # the micro service answers discovery on the same NATS
            pong = await server.store.nc.request("$SRV.PING.agentlog", b"", timeout=5)
            assert json.loads(pong.data)["name"] == "agentlog"
            got = await server.store.nc.request("agentlog.api.runs.list", b"{}", timeout=5)
            assert "runs" in json.loads(got.data)
            async with aiohttp.ClientSession(server.http_url) as http:
                async with http.get("/health") as r:
                    assert r.status == 200
                async with http.get("/openapi.json") as r:
                    paths = (await r.json())["paths"]
                assert {"/v1/runs", "/v1/runs/{id}", "/v1/runs/{id}/inputs", "/v1/threads",
                        "/v1/ag-ui/agents/{agent_id}/runs", "/v1/ai-sdk/agents/{agent_id}/runs"} <= set(paths)
                async with http.post("/v1/runs", json={"agent_id": DEMO_AGENT, "messages": "ship it"}) as r:
                    assert r.status == 202, await r.text()
                    started = await r.json()
                async with http.get("/v1/runs", params={"min_seq": str(started["seq"])}) as r:
                    assert r.status == 200
                    assert [x["run_id"] for x in (await r.json())["runs"]] == [started["run_id"]]
                async with http.get("/v1/runs/nope.bad") as r:
                    assert r.status == 400
                async with http.get("/metrics") as r:
                    assert r.status == 200 and "agentlog_runs_started_total" in await r.text()
        finally:
            await server.stop()
        assert _closed(port)
        assert not nats.running
        assert server.store is None and server.worker is None and server.runner is None
        await server.stop()  # idempotent


async def test_approval_after_the_whole_process_restarted(tmp_path: Path) -> None:
    config = _config(tmp_path)
    async with asyncio.timeout(LIMIT * 2):
        async with serve(config) as first:
            async with aiohttp.ClientSession(first.http_url) as http:
                async with http.post("/v1/runs", json={"agent_id": DEMO_AGENT, "messages": "ship it"}) as r:
                    assert r.status == 202, await r.text()
                    started = await r.json()
            run_id, thread_id = started["run_id"], started["thread_id"]
            seq, paused = await _until(first.store, thread_id, run_id)
            assert any(isinstance(e, RunSuspended) for e in paused.commit.events)
            calls = suspended_calls([paused])
            assert calls
        # everything of the first process is gone: NATS, store, runtime, HTTP
        async with serve(config) as second:
            assert second.http_url != ""
            approval = approval_for(second.http_url, run_id, calls)
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{second.http_url}/v1/runs/{run_id}", params={"min_seq": str(seq)}) as r:
                    assert (await r.json())["status"] == "waiting"
                async with http.post(approval.url, json=approval.body) as r:
                    assert r.status == 202, await r.text()
                    decided = await r.json()
                assert decided["run_id"] == run_id
                end_seq, end = await _until(second.store, thread_id, run_id, seq)
                finished = [e for e in end.commit.events if isinstance(e, RunFinished)]
                assert finished and finished[0].termination.type == "natural_end"
                async with http.get(f"{second.http_url}/v1/runs/{run_id}", params={"min_seq": str(end_seq)}) as r:
                    view = await r.json()
                assert view["status"] == "done" and view["steps"] == 3
                # the same approval again is an idempotent no-op (same decision_id), not a new decision
                async with http.post(approval.url, json=approval.body) as r:
                    assert r.status == 200, await r.text()
                    assert (await r.json())["duplicate"] is True


@pytest.fixture
def nats(tmp_path: Path) -> Any:
    server = EmbeddedNatsServer(tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_gateway_and_worker_roles_apart(tmp_path: Path, nats: EmbeddedNatsServer) -> None:
    connection = ConnectionOptions(nats_url=nats.url)
    async with asyncio.timeout(LIMIT * 2):
        async with serve(_config(tmp_path, role="worker", connection=connection)) as worker, \
                serve(_config(tmp_path, role="gateway", connection=connection, app_spec="agentlog.cli.demo:app")) as gateway:
            assert worker.http_url == "" and worker.worker is not None and worker.embedded is None
            assert gateway.worker is None and gateway.runtime is None and "dispatch:queue" in gateway.parts
            async with aiohttp.ClientSession(gateway.http_url) as http:
                async with http.post("/v1/runs", json={"agent_id": DEMO_AGENT, "messages": "ship it"}) as r:
                    assert r.status == 202, await r.text()
                    started = await r.json()
                # the gateway knows the app's agents (--app): an unknown one is refused, nothing queued
                async with http.post("/v1/runs", json={"agent_id": "nobody", "messages": "x"}) as r:
                    assert r.status == 404, await r.text()
                run_id, thread_id = started["run_id"], started["thread_id"]
                assert gateway.store is not None
                seq, paused = await _until(gateway.store, thread_id, run_id)
                approval = approval_for(gateway.http_url, run_id, suspended_calls([paused]))
                async with http.post(approval.url, json=approval.body) as r:
                    assert r.status == 202, await r.text()
                _, end = await _until(gateway.store, thread_id, run_id, seq)
                assert any(isinstance(e, RunFinished) for e in end.commit.events)
        assert nats.running  # a URL server is the user's: never stopped by us


async def test_agentlog_serve_command_prints_urls_and_stops_on_sigterm(tmp_path: Path) -> None:
    """The installed `agentlog serve`: the banner names HTTP, docs and NATS; SIGTERM stops it
    in order with exit 0 and takes the embedded nats-server with it."""
    import re
    import signal
    import sys

    agentlog = str(Path(sys.executable).parent / "agentlog")
    env = {"COLUMNS": "200", "NO_COLOR": "1", "PATH": "/usr/bin:/bin"}
    proc = await asyncio.create_subprocess_exec(
        "timeout", "120", agentlog, "serve", "--port", "0", "--data-dir", str(tmp_path / "data"), "--tokens", "",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, stdin=asyncio.subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(LIMIT):
            banner = await read_banner(proc)
            http = HTTP_ROW.search(banner)
            nats_port = re.search(r"nats://127\.0\.0\.1:(\d+)\s+\(embedded", banner)
            assert http and nats_port and f"{http.group(1)}/docs" in banner and "/openapi.json" in banner, banner
            async with aiohttp.ClientSession() as client:
                async with client.get(f"{http.group(1)}/health") as r:
                    assert r.status == 200
            proc.send_signal(signal.SIGTERM)  # timeout(1) forwards it to agentlog
            assert await proc.wait() == 0
        assert _closed(int(http.group(1).rsplit(":", 1)[1])) and _closed(int(nats_port.group(1)))
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
