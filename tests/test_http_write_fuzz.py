"""Hypothesis-generated bodies and ids on every write route: never a 5xx, never a write."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from test_http_support import TIMEOUT
from test_http_write_support import open_stack
from test_nats_service import examples, until

pytestmark = pytest.mark.asyncio

_ROUTES = {"runs.start": "/v1/runs", "runs.inputs": "/v1/runs/{id}/inputs", "runs.cancel": "/v1/runs/{id}/cancel"}
_PATH_IDS = ["ok-id", "unknown-run", "a.b", "_", "x" * 200, "%20", "ok-id%2Fx"]


@pytest.mark.parametrize("mode", ["inprocess", "queue"])
async def test_bad_write_requests(nats_server: Any, mode: str) -> None:
    async with asyncio.timeout(TIMEOUT * 3), open_stack(nats_server, mode, timeout=2.0) as s:
        from agentlog.gateway.nats.service import start_nats_service

        service = await start_nats_service(s.store, s.views, s.runner, s.dispatcher)
        try:
            from test_nats_service import call

            await call(s, "runs.start", {"agent_id": "approver", "run_id": "ok-id", "messages": "go"})
            await until(s, "ok-id", {"waiting"})
        finally:
            await service.stop()
        before = await s.store.last_seq()
        for i, (op, payload, raw) in enumerate(examples(list(_ROUTES), 40)):
            path = _ROUTES[op]
            if "{id}" in path:
                run_id = payload.pop("run_id", None) if isinstance(payload, dict) else None
                pid = run_id if isinstance(run_id, str) and run_id else _PATH_IDS[i % len(_PATH_IDS)]
                if op == "runs.cancel" and pid == "ok-id":
                    pid = "unknown-run"
                path = path.replace("{id}", pid.replace("/", "%2F").replace("?", "%3F").replace("#", "%23") or "x")
            data = raw if raw is not None else json.dumps(payload).encode()
            resp = await s.client.post(path, data=data)
            text = await resp.text()
            assert resp.status < 500, (op, path, data, text)
            if resp.status >= 400 and resp.status != 404:
                assert {"error", "code"} <= set(json.loads(text)), text
        assert await s.store.last_seq() == before, "a bad request wrote to the log"
