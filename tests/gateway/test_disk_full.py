"""A full log (here: the events stream at a `discard: new` byte limit, as a full disk or a quota
leaves it) makes `/health` say `degraded`, and a start a worker took cannot commit: it is
answered accepted but `queued` (202); once there is room again, writes go through, the queued run
runs and health is `ok`, with no process restarted and nothing accepted lost."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest
from nats.js.api import DiscardPolicy

from agentlog.eventlog import JetStreamEventStore
from agentlog.eventlog.events import RunFinished
from agentlog.eventlog.subjects import EVENTS_STREAM

from tests.support.topology import Deployment


@pytest.fixture
def deployment_options(tmp_path: Path) -> dict[str, object]:
    hold = tmp_path / "hold"
    hold.mkdir()
    # the gateway answers a start that cannot commit `queued` after twice its dispatch timeout
    # (the worker's take, then the commit): 3 s instead of 10 s each
    return {"app": "tests.apps.serve_app:app",
            "env": {"SERVE_APP_HOLD_DIR": str(hold), "AGENTLOG_DISPATCH_TIMEOUT": "3"}}


async def limit_events_stream(nats_url: str, room: int | None) -> None:
    """Leave `room` bytes in the events stream (discard new: a write past it is refused), or
    lift the limit (None)."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(EVENTS_STREAM)
        config = info.config
        config.max_bytes = -1 if room is None else info.state.bytes + room
        config.discard = DiscardPolicy.NEW if room is not None else DiscardPolicy.OLD
        await js.update_stream(config)
    finally:
        await nc.close()


async def health(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(f"{url}/health") as resp:
        body = await resp.json()
        assert resp.status == (503 if body["status"] == "unavailable" else 200), body
        return body


async def wait_done(store: JetStreamEventStore, thread: str) -> RunFinished:
    """The end of the first run of `thread` that finishes, from the log (bounded)."""
    async with asyncio.timeout(90):
        async with contextlib.aclosing(store.follow(thread)) as commits:
            async for stored in commits:
                for event in stored.commit.events:
                    if isinstance(event, RunFinished):
                        return event
    raise AssertionError("unreachable")


async def post_run(http: aiohttp.ClientSession, url: str, hold: Path, thread: str) -> tuple[int, dict[str, Any]]:
    (hold / thread).touch()
    async with http.post(f"{url}/v1/runs", json={"agent_id": "held", "messages": "go", "thread_id": thread}) as resp:
        return resp.status, await resp.json()


async def test_a_full_log_degrades_and_recovers_without_a_restart(
        deployment: Deployment, deployment_options: dict[str, Any]) -> None:
    hold = Path(deployment_options["env"]["SERVE_APP_HOLD_DIR"])
    url = deployment.http_url
    pids = {name: proc.pid for name, proc in deployment.procs.items()}
    store = await JetStreamEventStore.connect(deployment.nats_url)
    async with store, aiohttp.ClientSession() as http:
        status, first = await post_run(http, url, hold, "before")
        assert status == 202, first
        await wait_done(store, "before")
        assert (await health(http, url))["status"] == "ok"

        await limit_events_stream(deployment.nats_url, 200)  # room for no run
        status, queued = await post_run(http, url, hold, "during")
        assert (status, queued.get("status")) == (202, "queued"), queued  # a worker took it; the log is full
        degraded = await health(http, url)
        assert degraded["status"] == "degraded", degraded
        assert any("full" in reason["detail"] for reason in degraded["reasons"]), degraded

        await limit_events_stream(deployment.nats_url, None)  # space is back
        status, after = await post_run(http, url, hold, "after")
        assert status == 202, after
        assert (await wait_done(store, "after")).termination.type == "natural_end"
        # the start queued while full runs once there is room (nothing lost)
        assert (await wait_done(store, "during")).termination.type == "natural_end"
        assert (await health(http, url))["status"] == "ok"
    assert {name: proc.pid for name, proc in deployment.procs.items()} == pids
    assert all(proc.poll() is None for proc in deployment.procs.values()), deployment.outputs()
