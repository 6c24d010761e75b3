"""Token, tool call and model-latency Prometheus metrics on a real worker process (its own
`/metrics` on 127.0.0.1) and on the gateway (counted from the followed log)."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.gateway.http.requests import SERVICES
from agentlog.runtime.inputs.commands import StartRun
from agentlog.runtime.workers.commands import CommandClient

from tests.gateway.test_http_write import until_status
from tests.support.http_stack import TIMEOUT, body
from tests.support.http_write import open_stack
from tests.support.topology import PYTHONPATH, REPO
from tests.support.worker import Watch, kill_all

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize("command", [
    [sys.executable, "-m", "agentlog", "worker"],
    [str(Path(sys.executable).parent / "agentlog"), "worker"],
])
async def test_worker_serves_agent_metrics(nats_server: EmbeddedNatsServer, tmp_path: Path, command: list[str]) -> None:
    proc = await asyncio.create_subprocess_exec(  # --metrics-port 0: the banner names the port taken
        *command, "--nats", nats_server.url, "--app", "tests.apps.worker_app:app",
        "--metrics-port", "0", stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL, cwd=str(REPO),
        env={**os.environ, "PYTHONPATH": PYTHONPATH, "COLUMNS": "200", "NO_COLOR": "1"},
    )
    store = await JetStreamEventStore.connect(nats_server.url)
    watch = Watch(store, "tm")
    try:
        async with asyncio.timeout(30):
            assert proc.stdout is not None
            banner = ""
            while "parts" not in banner:  # the banner's last row: the worker consumes
                line = (await proc.stdout.readline()).decode()
                assert line, f"the worker exited: {banner}"
                banner += line
            metrics_url = re.search(r"http://127\.0\.0\.1:\d+/metrics", banner)
            assert metrics_url, banner
            await CommandClient(store.nc).submit(StartRun(thread_id="tm", run_id="rm", agent_id="quick", messages=["go"]))
            await watch.status_in("rm", {"done"})
            # The metrics server is up before the worker takes its first command. The observers
            # count a commit after its append returns, so the last one may land just after the
            # log shows the run done: read until the run's last inference is counted.
            async with aiohttp.ClientSession() as http:
                while True:
                    async with http.get(metrics_url[0]) as resp:
                        assert resp.status == 200
                        text = await resp.text()
                    if ('agentlog_model_calls_total{model="quick"} 2.0' in text
                            and 'agentlog_worker_commands_total{outcome="acked"} 1.0' in text):
                        break
                    await asyncio.sleep(0.02)  # polling another process's endpoint, bounded above
        assert 'agentlog_tool_calls_total{outcome="succeeded",tool="work"} 1.0' in text
        # the worker's own: how full it is, and what became of its commands
        assert "agentlog_worker_concurrency 64.0" in text and "agentlog_worker_commands_in_flight 0.0" in text
        assert 'agentlog_worker_commands_total{outcome="naked"} 0.0' in text
        assert 'agentlog_model_calls_total{model="quick"} 2.0' in text
        assert 'agentlog_model_latency_seconds_count{model="quick"} 2.0' in text
        assert 'agentlog_model_tokens_total{model="quick",type="input"}' in text
    finally:
        await kill_all([proc])
        await watch.close()
        await store.close()


async def test_gateway_metrics_count_tokens_tools_and_latency(nats_server: Any) -> None:
    async with asyncio.timeout(TIMEOUT), open_stack(nats_server, "queue") as s:
        a = await body(await s.client.post("/v1/runs", json={"agent_id": "quick", "messages": "hi"}), 202)
        await until_status(s, a["run_id"], {"done"})
        runs = s.client.app[SERVICES].metrics.runs  # type: ignore[union-attr]
        await runs.wait_until(lambda: runs.finished.labels("done", "natural_end")._value.get() >= 1)
        text = await (await s.client.get("/metrics")).text()
        assert 'agentlog_model_calls_total{model="quick"} 1.0' in text
        assert 'agentlog_model_latency_seconds_count{model="quick"} 1.0' in text
        assert 'agentlog_model_tokens_total{model="quick",type="output"}' in text
