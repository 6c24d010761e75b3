"""Two apps on one NATS never mix their runs: each run records the app that started it (name and
digest of its agents and tools), workers take only their app's commands, and `agentlog demo`
next to a running `serve` keeps its own data dir. Real `agentlog serve`, `gateway` and `worker`
subprocesses (tests/support/topology.py) on one nats-server; the apps are tests/apps/two_apps.py."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import MessageAppended, RunStarted
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.runtime.digest import app_digest

from tests.apps import two_apps
from tests.support import forkserver
from tests.support.topology import PYTHONPATH, REPO, deploy

AGENTLOG = Path(sys.executable).parent / "agentlog"
DIGESTS = {name: app_digest(rt.agents, rt.tools) for name, rt in
           (("alpha", two_apps.alpha(None)), ("beta", two_apps.beta(None)))}


def _args(name: str) -> list[str]:
    return ["--app-name", name]


async def _start(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.post(f"{url}/v1/runs", json={"agent_id": "greeter", "messages": "go"}) as resp:
        assert resp.status == 202, await resp.text()
        return await resp.json()


async def _wait_done(http: aiohttp.ClientSession, url: str, run_id: str, seq: int) -> None:
    """Until the run's view says done: each round follows its events until it pauses."""
    while True:
        async with http.get(f"{url}/v1/runs/{run_id}", params={"min_seq": str(seq)}) as resp:
            view = await resp.json()
        if resp.status == 200 and view["status"] == "done":
            return
        async with http.get(f"{url}/v1/runs/{run_id}/events", params={"follow": "true"}) as events:
            await events.read()


async def _driven_by(store: JetStreamEventStore, run_id: str) -> tuple[Any, list[str]]:
    """The app the run's `RunStarted` records, and the assistant texts of the run."""
    commits = [sc async for sc in store.read_run(run_id)]
    started = next(e for sc in commits for e in sc.commit.events if type(e) is RunStarted)
    texts = [e.message.content for sc in commits for e in sc.commit.events
             if type(e) is MessageAppended and e.message.role == "assistant" and e.message.content]
    return started.app, texts


def _verify(nats_url: str, run_id: str, app: str) -> subprocess.CompletedProcess[str]:
    return forkserver.run(["replay", run_id, "--verify", "--app", f"tests.apps.two_apps:{app}", "--nats", nats_url],
                          cwd=str(REPO), timeout=60, env={**os.environ, "PYTHONPATH": PYTHONPATH})


async def test_two_serve_processes_with_different_apps_drive_only_their_own_runs(tmp_path: Path) -> None:
    with EmbeddedNatsServer(tmp_path / "nats") as nats, \
            deploy("serve", tmp_path / "alpha", app="tests.apps.two_apps:alpha", args=_args("alpha"), nats=nats) as alpha, \
            deploy("serve", tmp_path / "beta", app="tests.apps.two_apps:beta", args=_args("beta"), nats=nats) as beta:
        urls = {"alpha": alpha.http_url, "beta": beta.http_url}
        async with aiohttp.ClientSession() as http:
            async with asyncio.timeout(120):
                accepted = {name: await asyncio.gather(*(_start(http, url) for _ in range(3)))
                            for name, url in urls.items()}
                await asyncio.gather(*(_wait_done(http, urls[name], a["run_id"], a["seq"])
                                       for name, runs in accepted.items() for a in runs))
        store = await JetStreamEventStore.connect(nats.url)
        try:
            for name, runs in accepted.items():
                for a in runs:
                    app, texts = await _driven_by(store, a["run_id"])
                    assert app is not None and (app.name, app.digest) == (name, DIGESTS[name]), \
                        (a, app, alpha.outputs(), beta.outputs())
                    assert texts and all(t.startswith(name) for t in texts), (a, texts)
        finally:
            await store.close()
        for name, other in (("alpha", "beta"), ("beta", "alpha")):
            run_id = accepted[name][0]["run_id"]
            ok = _verify(nats.url, run_id, name)
            assert ok.returncode == 0 and ok.stdout.startswith(f"verified run {run_id}:"), ok.stdout + ok.stderr
            wrong = _verify(nats.url, run_id, other)
            assert wrong.returncode == 1 and "diverged at" in wrong.stderr, wrong.stdout + wrong.stderr


async def test_a_gateway_queues_new_runs_for_its_apps_workers_only(tmp_path: Path) -> None:
    """Gateway + workers: alpha's gateway with no alpha worker yet, beta's serve running. Beta's
    worker never takes alpha's start; no alpha worker does in time (3 s here,
    `AGENTLOG_DISPATCH_TIMEOUT`), so the gateway withdraws it (503: it will not run). Once an alpha
    worker runs, the same start sent again runs there."""
    with EmbeddedNatsServer(tmp_path / "nats") as nats, \
            deploy("serve", tmp_path / "beta", app="tests.apps.two_apps:beta", args=_args("beta"), nats=nats), \
            deploy("split", tmp_path / "alpha", app="tests.apps.two_apps:alpha", args=_args("alpha"), nats=nats,
                   workers=0, env={"AGENTLOG_DISPATCH_TIMEOUT": "3"}) as alpha:
        async with aiohttp.ClientSession() as http:
            async with asyncio.timeout(120):
                body = {"agent_id": "greeter", "messages": "go", "run_id": "r-alpha", "thread_id": "t-alpha"}
                async with http.post(f"{alpha.http_url}/v1/runs", json=body) as resp:
                    answer = await resp.json()
                # no worker of alpha runs: the gateway gives up waiting and withdraws the start
                assert resp.status == 503 and answer["code"] == "dispatch_timeout", answer
                assert answer["run_id"] == "r-alpha"
                store = await JetStreamEventStore.connect(nats.url)
                try:
                    assert [sc async for sc in store.read_run("r-alpha")] == []
                    alpha.workers = 1
                    alpha.start("worker-0")
                    async with http.post(f"{alpha.http_url}/v1/runs", json=body) as resp:
                        assert resp.status == 202, await resp.text()
                    async with contextlib.aclosing(store.follow("t-alpha")) as follow:
                        async for sc in follow:
                            if any(type(e).__name__ == "RunFinished" for e in sc.commit.events):
                                break
                    app, texts = await _driven_by(store, "r-alpha")
                finally:
                    await store.close()
        assert app is not None and app.name == "alpha" and texts[-1] == "alpha done", (app, texts, alpha.outputs())


BANNER_DATA = re.compile(r"keeps its data in (\S+)")


@pytest.mark.timeout(300)
async def test_demo_next_to_a_running_serve_uses_its_own_data_dir(tmp_path: Path) -> None:
    from tests.support.serve import HTTP_ROW, read_banner

    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLOG_")}
    env.update(COLUMNS="300", NO_COLOR="1")
    serve = await asyncio.create_subprocess_exec(
        str(AGENTLOG), "serve", "--port", "0", cwd=tmp_path, env=env,
        stdin=subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        async with asyncio.timeout(90):
            banner = await read_banner(serve)
        serve_http = HTTP_ROW.search(banner)
        assert serve_http, banner
        demo = await asyncio.create_subprocess_exec(
            "timeout", "150", str(AGENTLOG), "demo", "--auto-approve", "--port", "0", cwd=tmp_path, env=env,
            stdin=subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await demo.communicate()
        text = out.decode()
        assert demo.returncode == 0, text + err.decode()
        moved = BANNER_DATA.search(text)
        assert moved and moved.group(1) == ".agentlog-demo", text
        assert (tmp_path / ".agentlog-demo" / "jetstream").is_dir()
        # serve's log has none of the demo's runs
        async with aiohttp.ClientSession() as http, http.get(f"{serve_http.group(1)}/v1/runs") as resp:
            listing = await resp.json()
        assert resp.status == 200 and listing["total"] == 0, listing
    finally:
        if serve.returncode is None:
            serve.terminate()
        await serve.wait()
