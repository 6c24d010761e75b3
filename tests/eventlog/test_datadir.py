"""One embedded nats-server per data dir, with real `agentlog` processes.

* Two `agentlog serve` on one data dir: the second uses the first one's nats-server (no second
  server on the same store) and its banner says it joined it; a run accepted by the second finishes after the first has stopped,
  and is in the log afterwards; the last process to leave stops the server.
* A dead owner: its orphaned nats-server is used (and stopped) by the next command; with the
  server gone too, the next command takes the lock over and starts a fresh one on the same log.
* `agentlog demo` stops its nats-server on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.support.serve import HTTP_ROW, read_banner

pytestmark = pytest.mark.early  # many seconds: started first (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
AGENTLOG = str(Path(sys.executable).parent / "agentlog")
LIMIT = 90
ENV = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "PYTHONPATH": str(ROOT)}


def nats_servers_of(data: Path) -> list[int]:
    """pids of the nats-server processes running `data`'s config (whoever started them)."""
    conf = str(data.resolve() / "nats-server.conf").encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"nats-server" in cmdline and conf in cmdline:
                pids.append(int(entry.name))
    return pids


async def until(predicate, what: str, limit: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    """Wait (bounded) for a condition about other processes (polled: they cannot signal us)."""
    async with asyncio.timeout(limit):
        while not predicate():
            await asyncio.sleep(0.05)


async def start_serve(data: Path, *, own_group: bool = False,
                      banners: list[str] | None = None) -> tuple[asyncio.subprocess.Process, str]:
    """`agentlog serve` on `data` (worker_app's agents); returns it and its HTTP URL once up.
    `own_group`: in its own process group, as a command in a terminal is (for Ctrl-C).
    `banners`: where to put what it printed up to its NATS row."""
    proc = await asyncio.create_subprocess_exec(
        AGENTLOG, "serve", "--port", "0", "--data-dir", str(data), "--tokens", "", "--app", "tests.apps.worker_app:app",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, stdin=asyncio.subprocess.DEVNULL,
        env=ENV, cwd=str(ROOT), start_new_session=own_group)
    banner = await read_banner(proc)
    if banners is not None:  # the whole banner, to the line after its table
        assert proc.stdout is not None
        while "Ctrl-C stops it" not in banner:
            line = (await proc.stdout.readline()).decode()
            assert line, banner
            banner += line
        banners.append(banner)
    http = HTTP_ROW.search(banner)
    assert http, banner
    return proc, http.group(1)


async def stop(proc: asyncio.subprocess.Process) -> int:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    async with asyncio.timeout(30):
        return await proc.wait()


def agentlog_runs(data: Path) -> list[dict[str, object]]:
    out = subprocess.run([AGENTLOG, "runs", "--json", "--data-dir", str(data)], capture_output=True, text=True,
                         env=ENV, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


async def start_run(url: str) -> str:
    """POST /v1/runs (worker_app's `quick` agent); the accepted run's id."""
    async with aiohttp.ClientSession(url) as http:
        async with http.post("/v1/runs", json={"agent_id": "quick", "messages": "hi"}) as r:
            assert r.status == 202, await r.text()
            return str((await r.json())["run_id"])


async def finished_runs(data: Path) -> list[tuple[object, object]]:
    """(run_id, status) of the log's runs once the newest is done, read by `agentlog runs` (a
    process of its own, using the data dir's running server)."""
    while (runs := await asyncio.to_thread(agentlog_runs, data)) != [] and runs[0]["status"] != "done":
        pass
    return [(r["run_id"], r["status"]) for r in runs]


@contextlib.asynccontextmanager
async def processes(data: Path) -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """The test's agentlog processes (put them in the list), and whatever nats-server runs `data`,
    killed at the end whatever happened; the body is bounded by LIMIT."""
    procs: list[asyncio.subprocess.Process] = []
    try:
        async with asyncio.timeout(LIMIT):
            yield procs
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.wait()
        for pid in nats_servers_of(data):
            os.kill(pid, signal.SIGKILL)


async def test_two_serves_on_one_data_dir_share_one_server_and_lose_no_run(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with processes(data) as procs:
        banners: list[str] = []
        first, _ = await start_serve(data, banners=banners)
        procs.append(first)
        second, url = await start_serve(data, banners=banners)
        procs.append(second)
        assert len(nats_servers_of(data)) == 1, "a second nats-server was started on the same store"
        # the second says that it joined the server already running there; the first started it
        assert "this serve joined it" in banners[1] and "joined" not in banners[0]
        run_id = await start_run(url)
        assert await stop(first) == 0  # the first leaves; its server stays for the second
        assert len(nats_servers_of(data)) == 1
        assert await finished_runs(data) == [(run_id, "done")]
        assert len(nats_servers_of(data)) == 1
        assert await stop(second) == 0
        await until(lambda: not nats_servers_of(data), "the last user to stop the server")
        assert not (data / "server.json").exists()
        assert await finished_runs(data) == [(run_id, "done")]


async def test_ctrl_c_on_the_first_serve_leaves_the_shared_server_to_the_second(tmp_path: Path) -> None:
    """Ctrl-C in a terminal signals the whole process group: the nats-server the first serve
    started must not get it (it serves the second serve too)."""
    data = tmp_path / "data"
    async with processes(data) as procs:
        first, _ = await start_serve(data, own_group=True)
        procs.append(first)
        second, url = await start_serve(data)
        procs.append(second)
        os.killpg(first.pid, signal.SIGINT)  # the terminal's Ctrl-C
        assert await first.wait() == 0
        assert len(nats_servers_of(data)) == 1
        run_id = await start_run(url)
        assert await finished_runs(data) == [(run_id, "done")]
        assert await stop(second) == 0
        await until(lambda: not nats_servers_of(data), "the last user to stop the server")


async def test_a_dead_owners_server_is_reused_then_a_free_lock_is_taken_over(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with processes(data) as procs:
        owner, url = await start_serve(data)
        procs.append(owner)
        run_id = await start_run(url)
        assert await finished_runs(data) == [(run_id, "done")]
        [orphan] = nats_servers_of(data)
        owner.kill()  # SIGKILL: no cleanup; its nats-server lives on, holding the lock
        await owner.wait()
        assert nats_servers_of(data) == [orphan]
        # The next command uses the orphan (no second server) and, as its last user, stops it.
        assert await finished_runs(data) == [(run_id, "done")]
        await until(lambda: not nats_servers_of(data), "the orphaned server to be stopped")
        # Owner and server both killed: the lock is free, server.json stale; taken over.
        owner, _ = await start_serve(data)
        procs.append(owner)
        [server] = nats_servers_of(data)
        owner.kill()
        os.kill(server, signal.SIGKILL)
        await owner.wait()
        await until(lambda: not nats_servers_of(data), "the killed server to go")
        assert (data / "server.json").exists()  # stale
        assert await finished_runs(data) == [(run_id, "done")]
        assert not nats_servers_of(data)


async def test_demo_stops_its_nats_server_on_sigterm(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with processes(data) as procs:
        proc = await asyncio.create_subprocess_exec(
            AGENTLOG, "demo", "--port", "0", "--data-dir", str(data), "--tokens", "",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, stdin=asyncio.subprocess.DEVNULL,
            env=ENV, cwd=str(tmp_path))
        procs.append(proc)
        assert proc.stdout is not None
        output = ""
        while "waiting for the decision" not in output:  # the run waits for an approval
            line = (await proc.stdout.readline()).decode()
            assert line, output
            output += line
        assert len(nats_servers_of(data)) == 1
        proc.send_signal(signal.SIGTERM)
        await proc.wait()
        await until(lambda: not nats_servers_of(data), "demo's nats-server to stop", limit=15)
