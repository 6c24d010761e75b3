"""`GET /v1/changes` is live on every gateway of a deployment, whichever one writes the views.

Two deployments on one nats-server: A is `agentlog gateway` + `agentlog worker`, B is `agentlog
serve` (gateway and worker in one); A started first, so A's gateway holds the projections' writer
lease and B's follows. Then:

- a run made through A appears on B's `/v1/changes` stream (B folds nothing: the writer's notice),
  and reads on B with the frame's `min_seq` (each step below reads it so too);
- A's gateway is SIGKILLed with B's stream open: B takes the lease over, and a run made through B
  appears on the same stream (now B's own batches);
- A's gateway restarts and follows B: a run made through B appears on A's stream.

Every wait is on a frame or an answer, bounded by `WAIT`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentlog.client import AsyncClient
from agentlog.eventlog.embedded.server import EmbeddedNatsServer

from tests.gateway.test_failed_runs_deployed import changes
from tests.support.topology import Deployment, deploy

pytestmark = pytest.mark.usefixtures("keep_structlog_config")
WAIT = 90
APP = "tests.apps.protocol_app:app"


async def named(frames: Any, run: dict[str, Any], url: str) -> int:
    """The seq of the next frame naming `run` (its thread and the run itself), or saying reload
    from past its start (what a gateway that may have missed a notice says); then the run reads on
    `url` with that `min_seq`, as a client told of it does."""
    while True:
        frame = await anext(frames)
        if (run["run_id"] in frame["runs"] and run["thread_id"] in frame["threads"]) or \
                (frame["reload"] and frame["seq"] >= run["seq"]):
            break
    async with AsyncClient(url) as client:
        view = await client.runs.get(run["run_id"], min_seq=frame["seq"])
    assert view["thread_id"] == run["thread_id"] and view["last_seq"] >= run["seq"], view
    return int(frame["seq"])


async def writer(url: str) -> bool:
    async with AsyncClient(url) as client:
        return bool((await client.health())["projection"]["writer"])


async def scenario(a: Deployment, b: Deployment) -> None:
    async with asyncio.timeout(WAIT), aiohttp.ClientSession() as http:
        assert await writer(a.http_url) and not await writer(b.http_url)
        resp_b, frames_b = await changes(http, b.http_url, "")
        try:
            first = await anext(frames_b)
            assert first["reload"] is True
            async with AsyncClient(a.http_url) as via_a:
                run = await via_a.runs.create("open", "text: through A")
            assert await named(frames_b, run, b.http_url) > first["seq"]
            async with AsyncClient(b.http_url) as via_b:

                # the writer dies: B takes over, and its stream goes on with B's own batches
                await asyncio.to_thread(a.kill, "gateway")
                run = await via_b.runs.create("open", "text: through B, A down")
                await named(frames_b, run, b.http_url)
                assert await writer(b.http_url)

                # A comes back as a standby: its stream is told of B's batches
                await asyncio.to_thread(a.start, "gateway")
                assert not await writer(a.http_url)
                resp_a, frames_a = await changes(http, a.http_url, "")
                try:
                    assert (await anext(frames_a))["reload"] is True
                    run = await via_b.runs.create("open", "text: through B, A back")
                    await named(frames_a, run, a.http_url)
                finally:
                    resp_a.close()
        finally:
            resp_b.close()


def test_a_change_through_one_gateway_is_live_on_the_others_changes_and_after_a_takeover(tmp_path: Path) -> None:
    with EmbeddedNatsServer(tmp_path / "nats") as nats, \
            deploy("split", tmp_path / "a", app=APP, nats=nats) as a, \
            deploy("serve", tmp_path / "b", app=APP, nats=nats) as b:
        try:
            asyncio.run(scenario(a, b))
        except BaseException as exc:
            exc.add_note(a.outputs() + b.outputs())
            raise
