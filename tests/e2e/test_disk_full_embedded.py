"""A real full disk under `agentlog serve`'s own nats-server (no `--nats`): its data dir on a
small tmpfs that a file fills up. Writes fail with 503 and `/health` says `degraded`; once the
file is gone, writes go through again and health is `ok` with neither agentlog nor nats-server
restarted (nats-server keeps a stream's write error after ENOSPC; agentlog restarts JetStream in
place, `agentlog.eventlog.embedded.revive`). Needs root to mount the tmpfs: skipped otherwise."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentlog.eventlog.embedded.revive import server_pid

from tests.support.serve import HTTP_ROW

pytestmark = pytest.mark.early  # many seconds: started first (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode(errors='replace')}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


async def _serve(data_dir: Path, hold: Path, log_path: Path) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "SERVE_APP_HOLD_DIR": str(hold), "NO_COLOR": "1", "COLUMNS": "200"}
    with open(log_path, "wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agentlog", "serve", "--data-dir", str(data_dir), "--host", "127.0.0.1",
            "--port", "0", "--tokens", "", "--app", "tests.apps.serve_app:app",
            stdout=asyncio.subprocess.PIPE, stderr=log, stdin=asyncio.subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    banner = ""
    try:
        async with asyncio.timeout(60):
            while not (found := HTTP_ROW.search(banner)) or "NATS" not in banner:
                line = (await proc.stdout.readline()).decode()
                assert line, f"serve exited: {log_path.read_text()}"
                banner += line
        yield proc, found.group(1)
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


async def _post(http: aiohttp.ClientSession, url: str, hold: Path, thread: str,
                text: str = "go") -> tuple[int, dict[str, Any]]:
    (hold / thread).touch()
    async with http.post(f"{url}/v1/runs", json={"agent_id": "held", "messages": text, "thread_id": thread}) as resp:
        return resp.status, await resp.json()


async def _until_done(http: aiohttp.ClientSession, url: str, run_id: str) -> dict[str, Any]:
    async with asyncio.timeout(120):
        while True:
            async with http.get(f"{url}/v1/runs/{run_id}/events", params={"follow": "true"}) as events:
                await events.read()  # ends when the run finishes (or pauses)
            async with http.get(f"{url}/v1/runs/{run_id}") as resp:
                view = await resp.json()
            if resp.status == 200 and view["status"] == "done":
                return view


async def test_a_full_disk_under_the_embedded_server_recovers_in_place(small_disk: Path, tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    hold.mkdir()
    data_dir = small_disk / "data"
    serve = _serve(data_dir, hold, tmp_path / "serve.log")
    proc, url = await anext(serve)
    try:
        nats_pid = server_pid(data_dir)
        async with aiohttp.ClientSession() as http:
            status, body = await _post(http, url, hold, "before")
            assert status == 202, body
            await _until_done(http, url, body["run_id"])

            filler = small_disk / "filler"
            with open(filler, "wb") as f:
                try:
                    f.write(b"\0" * os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize)
                except OSError:
                    pass  # ENOSPC: the disk is full, as wanted
            # the server's open block files still take what fits in their last page: write until refused
            for i in range(50):
                status, body = await _post(http, url, hold, f"during{i}", "x" * 8000)
                if status != 202:
                    break
            assert status == 503, body
            async with http.get(f"{url}/health") as resp:
                health = await resp.json()
            assert health["status"] == "degraded", health

            filler.unlink()  # room again
            async with asyncio.timeout(60):
                while (answer := await _post(http, url, hold, "after"))[0] != 202:
                    assert answer[0] == 503, answer  # until JetStream is back (bounded)
            view = await _until_done(http, url, answer[1]["run_id"])
            assert view["termination"]["type"] == "natural_end"
            async with http.get(f"{url}/health") as resp:
                health = await resp.json()
            assert health["status"] == "ok", health
        assert proc.returncode is None and server_pid(data_dir) == nats_pid
    finally:
        await serve.aclose()
