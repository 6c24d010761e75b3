"""A gateway that is told to stop (SIGTERM, Ctrl-C) ends its event streams at once.

An SSE stream is open until its client leaves, so the HTTP server's graceful stop waited out its
whole timeout (a minute) for each client still connected, an inspector left open say, before the
process could exit: a rolling restart stalled on every gateway. The streams are ended at the
start of the stop instead, and their clients resume with `Last-Event-ID`."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

import aiohttp
import pytest

from tests.support.topology import TOPOLOGIES, deploy

#: A bound on the test, not a sync: the stop and the stream's end take well under a second.
WAIT = 45.0


@pytest.mark.parametrize("kind", TOPOLOGIES)
async def test_a_stopping_gateway_ends_its_open_event_streams_and_exits(kind: str, tmp_path: Path) -> None:
    with deploy(kind, tmp_path) as deployment:  # type: ignore[arg-type]
        http_name = "serve" if kind == "serve" else "gateway"
        async with asyncio.timeout(WAIT), aiohttp.ClientSession() as http:
            # the live list an inspector keeps open: it never ends by itself
            async with http.get(f"{deployment.http_url}/v1/changes") as stream:
                assert stream.status == 200
                assert await stream.content.readany()  # its first frame: the stream is open
                stopped = threading.Thread(target=deployment.stop, args=(http_name,))
                stopped.start()
                with contextlib.suppress(aiohttp.ClientPayloadError):  # cut: the client resumes
                    while await stream.content.readany():
                        pass
            await asyncio.to_thread(stopped.join)
        # it exited by itself: `stop` SIGKILLs a process still there after 30 s
        assert deployment.procs[http_name].returncode == 0, deployment.output(http_name)
