"""An `agentlog serve` process that stops (SIGKILL or SIGTERM) strands no run.

A real `agentlog serve` subprocess (against the test's real nats-server, so killing it does not
take NATS with it) starts two runs whose tool blocks; it is killed (or terminated) mid-tool; a new
`agentlog serve` starts against the same NATS. Then: run A (its thread released beforehand)
finishes naturally, run B (never released) is cancelled over HTTP and finishes `cancelled`, a new
run on A's thread is accepted and finishes, and nothing was committed twice.

Serve runs its runs through the command queue, not in-process outside it, so a run whose process
dies is redelivered: none stays `running` forever, holding its thread (a new run on it: 409) and
taking a cancel (202) that nobody acts on.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections import Counter
from collections.abc import Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import RunFinished, StoredCommit, ToolCallCompleted, ToolCallStarted
from agentlog.eventlog.jetstream.store import JetStreamEventStore

from tests.support.serve import HTTP_ROW, NATS_ROW, read_banner

REPO = Path(__file__).resolve().parents[2]
LIMIT = 60


async def spawn_serve(nats_url: str | None, tmp_path: Path, name: str) -> tuple[asyncio.subprocess.Process, str]:
    """`agentlog serve --app tests.apps.serve_app:app` on any free port, against `nats_url` or (None) its
    embedded nats-server on `tmp_path/data`; returns the process and its HTTP URL (from the
    banner; `banner_nats[proc.pid]` keeps its NATS URL). A 2 s command lease keeps the SIGKILL
    case short."""
    agentlog = str(Path(sys.executable).parent / "agentlog")
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1",
           "PYTHONPATH": str(REPO), "SERVE_APP_HOLD_DIR": str(tmp_path / "hold"),
           "AGENTLOG_WORKER_ACK_WAIT": "2", "AGENTLOG_SHUTDOWN_TIMEOUT": "1"}
    log = open(tmp_path / f"{name}.log", "wb")
    proc = await asyncio.create_subprocess_exec(
        agentlog, "serve", "--app", "tests.apps.serve_app:app", "--port", "0", "--tokens", "",
        *(["--nats", nats_url] if nats_url else ["--data-dir", str(tmp_path / "data")]),
        stdout=asyncio.subprocess.PIPE, stderr=log, stdin=asyncio.subprocess.DEVNULL, env=env, cwd=str(REPO))
    log.close()
    banner = await read_banner(proc)
    found = HTTP_ROW.search(banner)
    nats = NATS_ROW.search(banner)
    assert found and nats, banner
    banner_nats[proc.pid] = nats.group(1)
    return proc, found.group(1)


async def stop_all(procs: list[asyncio.subprocess.Process]) -> None:
    """SIGTERM what still runs (a serve stops its embedded nats-server with it), SIGKILL after 20 s."""
    for p in procs:
        if p.returncode is None:
            p.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(20):
                    await p.wait()
            except TimeoutError:
                p.kill()
                await p.wait()


#: pid of a spawned serve -> the NATS URL its banner named.
banner_nats: dict[int, str] = {}


async def until(store: Any, thread_id: str, pred: Callable[[StoredCommit], bool]) -> StoredCommit:
    """Follow the thread's log from the start until a commit satisfies `pred`."""
    async with aclosing(store.follow(thread_id, 0)) as commits:
        async for sc in commits:
            if pred(sc):
                return sc
    raise AssertionError("the log follow ended")


def finished(run_id: str) -> Callable[[StoredCommit], bool]:
    return lambda sc: sc.commit.run_id == run_id and any(isinstance(e, RunFinished) for e in sc.commit.events)


def termination(sc: StoredCommit) -> str:
    return next(e.termination.type for e in sc.commit.events if isinstance(e, RunFinished))


async def start_run(http: aiohttp.ClientSession, thread_id: str) -> str:
    async with http.post("/v1/runs", json={"agent_id": "held", "messages": "go", "thread_id": thread_id}) as r:
        assert r.status == 202, await r.text()
        return (await r.json())["run_id"]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
async def test_a_stopped_serve_process_strands_no_run(nats_server: EmbeddedNatsServer, tmp_path: Path,
                                                      sig: signal.Signals) -> None:
    (tmp_path / "hold").mkdir()
    store = await JetStreamEventStore.connect(nats_server.url)
    procs: list[asyncio.subprocess.Process] = []
    try:
        async with asyncio.timeout(LIMIT):
            first, url = await spawn_serve(nats_server.url, tmp_path, "first")
            procs.append(first)
            async with aiohttp.ClientSession(url) as http:
                run_a, run_b = await start_run(http, "ta"), await start_run(http, "tb")
            for thread in ("ta", "tb"):  # both runs are inside their blocking tool
                await until(store, thread, lambda sc: any(isinstance(e, ToolCallStarted) for e in sc.commit.events))
            first.send_signal(sig)
            assert await first.wait() == (0 if sig == signal.SIGTERM else -signal.SIGKILL)

            (tmp_path / "hold" / "ta").touch()  # the next process may finish A (B stays blocked)
            second, url = await spawn_serve(nats_server.url, tmp_path, "second")
            procs.append(second)
            async with aiohttp.ClientSession(url) as http:
                async with http.post(f"/v1/runs/{run_b}/cancel", json={}) as r:
                    assert r.status == 202, await r.text()
                assert termination(await until(store, "ta", finished(run_a))) == "natural_end"
                assert termination(await until(store, "tb", finished(run_b))) == "cancelled"
                run_c = await start_run(http, "ta")  # the thread takes new runs again
                assert termination(await until(store, "ta", finished(run_c))) == "natural_end"
        for thread in ("ta", "tb"):
            commits = [sc async for sc in store.read_thread(thread)]
            ids = [sc.commit.commit_id for sc in commits]
            assert len(ids) == len(set(ids)), "a commit was written twice"
            completed = Counter((sc.commit.run_id, e.call_id) for sc in commits for e in sc.commit.events
                                if isinstance(e, ToolCallCompleted))
            assert set(completed.values()) == {1}, completed
            assert Counter(sc.commit.run_id for sc in commits
                           if any(isinstance(e, RunFinished) for e in sc.commit.events)) == \
                ({run_a: 1, run_c: 1} if thread == "ta" else {run_b: 1})
    finally:
        await stop_all(procs)
        await store.close()


async def test_cancel_finishes_a_run_that_no_command_holds(nats_server: EmbeddedNatsServer, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A run `running` in the log that nobody drives and no queued command leases (started
    in-process, outside the queue, or its command given up on): a cancel must finish it
    `cancelled`, not just record a request nobody acts on."""
    from agentlog.gateway.operations.dispatch import QueueDispatcher
    from agentlog.runtime.workers.worker import Worker

    from tests.apps import serve_app
    (tmp_path / "hold").mkdir()
    monkeypatch.setenv("SERVE_APP_HOLD_DIR", str(tmp_path / "hold"))
    store = await JetStreamEventStore.connect(nats_server.url)
    worker = Worker(store, runtime=serve_app.app(store), ack_wait=5)
    try:
        async with asyncio.timeout(LIMIT):
            crashed = serve_app.app(store)  # the process that started the run, outside the queue
            handle = await crashed.start("held", "go", thread_id="to")
            await until(store, "to", lambda sc: any(isinstance(e, ToolCallStarted) for e in sc.commit.events))
            assert handle._task is not None
            handle._task.cancel()  # it dies: nothing more is committed
            await asyncio.gather(handle._task, return_exceptions=True)
            await worker.start()
            accepted = await QueueDispatcher(store.nc, store).cancel(handle.run_id)
            assert accepted.run_id == handle.run_id
            assert termination(await until(store, "to", finished(handle.run_id))) == "cancelled"
    finally:
        await worker.stop(timeout=2)
        await store.close()


def _login(tmp_path: Path) -> dict[str, str]:
    """The embedded server is locked down: log in as the data dir's readonly user."""
    from agentlog.eventlog.roles import load_or_create_credentials

    return load_or_create_credentials(tmp_path / "data").login("readonly")


async def test_sigterm_with_the_embedded_server_hands_the_run_to_the_next_process(tmp_path: Path) -> None:
    """The default deployment: `agentlog serve` with its embedded nats-server. SIGTERM stops it
    in order (runs handed back to the queue, then NATS); a new `serve` on the same data dir
    finishes the run, and the thread takes new runs."""
    (tmp_path / "hold").mkdir()
    procs: list[asyncio.subprocess.Process] = []
    stores: list[JetStreamEventStore] = []
    try:
        async with asyncio.timeout(LIMIT):
            first, url = await spawn_serve(None, tmp_path, "first")
            procs.append(first)
            stores.append(await JetStreamEventStore.connect(banner_nats[first.pid], **_login(tmp_path)))
            async with aiohttp.ClientSession(url) as http:
                run_a = await start_run(http, "ta")
            await until(stores[-1], "ta", lambda sc: any(isinstance(e, ToolCallStarted) for e in sc.commit.events))
            await stores.pop().close()
            first.send_signal(signal.SIGTERM)
            assert await first.wait() == 0

            (tmp_path / "hold" / "ta").touch()
            second, url = await spawn_serve(None, tmp_path, "second")
            procs.append(second)
            stores.append(await JetStreamEventStore.connect(banner_nats[second.pid], **_login(tmp_path)))
            assert termination(await until(stores[-1], "ta", finished(run_a))) == "natural_end"
            async with aiohttp.ClientSession(url) as http:
                run_c = await start_run(http, "ta")
            assert termination(await until(stores[-1], "ta", finished(run_c))) == "natural_end"
    finally:
        for store in stores:
            await store.close()
        await stop_all(procs)
