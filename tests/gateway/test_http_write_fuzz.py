"""Hypothesis-generated bodies and ids on every write route, against what users run (`agentlog
serve`, and `agentlog gateway` + `agentlog worker`: the shared `protocol_deployment`): never a
5xx, never a write."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.gateway.test_http_write import until_status
from tests.gateway.test_nats_service import examples
from tests.support.http_stack import TIMEOUT, Remote, body, remote, uid  # noqa: F401

pytestmark = pytest.mark.asyncio

_ROUTES = {"runs.start": "/v1/runs", "runs.inputs": "/v1/runs/{id}/inputs", "runs.cancel": "/v1/runs/{id}/cancel"}


async def test_bad_write_requests(remote: Remote) -> None:
    s = remote
    async with asyncio.timeout(TIMEOUT * 3):
        ok = uid("ok-id")  # a waiting run the generated requests may name
        path_ids = [ok, "unknown-run", "a.b", "_", "x" * 200, "%20", f"{ok}%2Fx"]
        await body(await s.client.post("/v1/runs", json={"agent_id": "sequential", "run_id": ok,
                                                         "messages": "approval: go"}), 202)
        await until_status(s, ok, {"waiting"})
        before = await s.store.last_seq()
        for i, (op, payload, raw) in enumerate(examples(list(_ROUTES), 40)):
            path = _ROUTES[op]
            if "{id}" in path:
                run_id = payload.pop("run_id", None) if isinstance(payload, dict) else None
                pid = run_id if isinstance(run_id, str) and run_id else path_ids[i % len(path_ids)]
                if op == "runs.cancel" and pid == ok:
                    pid = "unknown-run"
                path = path.replace("{id}", pid.replace("/", "%2F").replace("?", "%3F").replace("#", "%23") or "x")
            data = raw if raw is not None else json.dumps(payload).encode()
            resp = await s.client.post(path, data=data)
            text = await resp.text()
            assert resp.status < 500, (op, path, data, text)
            if resp.status >= 400 and resp.status != 404:
                assert {"error", "code"} <= set(json.loads(text)), text
        assert await s.store.last_seq() == before, "a bad request wrote to the log"
