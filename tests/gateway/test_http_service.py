"""Health, metrics, OpenAPI completeness, the 500 path and 503 with NATS stopped.

Health, metrics and the NATS outage run against what users run (`agentlog serve`, and `agentlog
gateway` + `agentlog worker`; the outage on a deployment of its own, as it stops NATS). In
process: the OpenAPI check (it compares the document with the app's router) and the 500 path (it
needs a view store that fails with a bug)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from agentlog.gateway.http import Route, create_app
from agentlog.gateway.operations.models import CreateThread

from tests.support.http_stack import TIMEOUT, Api, Remote, api, body, error, open_remote, remote, uid  # noqa: F401
from tests.support.topology import Deployment


async def test_health_live_and_metrics(remote: Remote) -> None:
    async with asyncio.timeout(TIMEOUT):
        health = await body(await remote.client.get("/health"), 200)
        assert health["status"] == "ok" and health["nats"]["connected"] is True
        assert health["projection"]["lag"] >= 0
        assert await body(await remote.client.get("/health/live"), 200) == {"status": "ok"}
        await body(await remote.client.get("/v1/threads"), 200)
        await error(await remote.client.get(f"/v1/threads/{uid('t')}"), 404)
        resp = await remote.client.get("/metrics")
        text = await resp.text()
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
        assert 'agentlog_http_request_duration_seconds_count{method="GET",route="/v1/threads",status="200"}' in text
        assert 'route="/v1/threads/{id}",status="404"' in text
        assert "agentlog_projection_lag_commits" in text
        assert "agentlog_projection_applied_seq" in text


async def test_openapi_lists_every_route(api: Api) -> None:
    async with asyncio.timeout(TIMEOUT):
        doc = await body(await api.client.get("/openapi.json"), 200)
        assert doc["openapi"].startswith("3.1")
        registered = {
            (r.method.lower(), r.resource.canonical)
            for r in api.client.app.router.routes() if r.method != "HEAD"
        }
        documented = {(m, p) for p, ops in doc["paths"].items() for m in ops}
        assert registered == documented
        create = doc["paths"]["/v1/threads"]["post"]
        assert set(create["requestBody"]["content"]["application/json"]["schema"]["properties"]) == set(
            CreateThread.model_fields)
        params = {p["name"] for p in doc["paths"]["/v1/threads"]["get"]["parameters"]}
        assert params == {"limit", "offset", "order", "resource_id", "parent_thread_id", "min_seq"}
        assert "ThreadView" in doc["components"]["schemas"] and "RunView" in doc["components"]["schemas"]


class _Broken:
    """A view store whose list fails with a bug (not an agentlog error)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def thread_page(self, filters, limit, offset) -> tuple[list, int]:
        raise RuntimeError("boom: a bug")


async def test_unexpected_errors_are_500_internal_and_extra_routes_plug_in(api: Api) -> None:
    async def hello(request) -> Any:
        from agentlog.gateway.http.replies import reply
        return reply({"hello": "write side"})

    extra = [Route("POST", "/v1/runs", hello, "Start a run", "runs")]
    app = create_app(api.store, _Broken(api.views), api.runner, auth_tokens="", extra_routes=extra)
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        async with asyncio.timeout(TIMEOUT):
            data = await error(await client.get("/v1/threads"), 500, "internal")
            assert "boom" not in data["error"]
            assert await body(await client.post("/v1/runs"), 200) == {"hello": "write side"}
            doc = await body(await client.get("/openapi.json"), 200)
            assert "post" in doc["paths"]["/v1/runs"]
    finally:
        await client.close()


@pytest.fixture
def deployment_options() -> dict[str, object]:
    """`--timeout 2`: a log read waits that long for NATS to come back before its 503."""
    return {"args": ["--timeout", "2"]}


async def test_nats_stopped_gives_503(deployment: Deployment) -> None:
    """NATS goes away under a running gateway: health says so (503), liveness stays 200, every
    route that needs the log is a 503 `store_unavailable` (after `--timeout`: a reconnect within
    it is waited for), bad input is still a 400."""
    async with asyncio.timeout(TIMEOUT), open_remote(deployment) as remote:
        c = remote.client
        thread = uid("t")
        created = await body(await c.post("/v1/threads", json={"thread_id": thread}), 201)
        await body(await c.get(f"/v1/threads/{thread}", params={"min_seq": created["seq"]}), 200)
        await remote.store.close()
        deployment.nats.stop()
        try:
            # The gateway learns of the stop from its client's read loop a moment later: wait
            # for its health to say so (bounded), then ask.
            while (await c.get("/health")).status != 503:
                await asyncio.sleep(0.05)
            health = await body(await c.get("/health"), 503)
            assert health["status"] == "unavailable" and health["nats"]["connected"] is False
            assert (await c.get("/health/live")).status == 200
            routes = (
                ("POST", "/v1/threads", {"thread_id": uid("u")}),
                ("GET", f"/v1/threads/{thread}/messages", None),
                ("GET", f"/v1/threads/{thread}/state", None),
                ("GET", f"/v1/threads/{thread}/events", None),
                ("GET", f"/v1/runs/{uid('r')}/events", None),
                ("PATCH", f"/v1/threads/{thread}", {"metadata": {"a": 1}}),
                ("GET", "/v1/threads", None),
                ("GET", f"/v1/threads/{thread}", None),
            )

            async def refused(method: str, path: str, payload: Any) -> None:
                await error(await c.request(method, path, json=payload), 503, "store_unavailable")

            await asyncio.gather(*(refused(*route) for route in routes))  # each waits out --timeout
            # Bad input is still 400, even with NATS down: it never reaches NATS.
            await error(await c.get("/v1/threads/a.b"), 400, "invalid_id")
        finally:
            deployment.nats.start()
