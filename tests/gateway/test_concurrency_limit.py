"""The gateway's concurrent-request limit (agentlog.gateway.http.limits) in process: requests over
it are answered 503 `overloaded` with Retry-After at once, health and metrics never count, a
place frees when a request ends; the option and its environment variable. (Both topologies:
tests/e2e/test_plugins_deployed.py.)"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from typer.testing import CliRunner

from agentlog.cli.core import app as cli_app
from agentlog.cli.serve import _server_config
from agentlog.gateway.http.limits import EXEMPT, ConcurrencyLimit
from agentlog.gateway.operations.connection import ConnectionOptions
from agentlog.gateway.operations.services import MAX_CONCURRENT_ENV, Settings, max_concurrent_from_env


async def held_app(limit: int | None) -> tuple[TestClient, ConcurrencyLimit, asyncio.Event, asyncio.Event]:
    gate = ConcurrencyLimit(limit)
    release, entered = asyncio.Event(), asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        entered.set()
        await release.wait()
        return web.json_response({"ok": True})

    async def fast(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application(middlewares=[gate.middleware])
    app.router.add_get("/slow", slow)
    app.router.add_get("/v1/runs", fast)
    for path in EXEMPT:
        app.router.add_get(path, fast)
    app.router.add_route("OPTIONS", "/v1/runs", fast)
    client = TestClient(TestServer(app))
    await client.start_server()
    return client, gate, release, entered


async def test_concurrency_limit_refuses_the_request_over_it_and_frees_a_place_when_one_ends() -> None:
    client, gate, release, entered = await held_app(2)
    try:
        held = [asyncio.ensure_future(client.get("/slow")) for _ in range(2)]
        while gate.in_flight < 2:  # both held in their handler
            entered.clear()
            await entered.wait()
        r = await client.get("/v1/runs")
        assert r.status == 503 and r.headers["Retry-After"] == "1"
        assert await r.json() == {"error": "the gateway is at its limit of 2 concurrent requests; retry shortly",
                                  "code": "overloaded"}
        for path in sorted(EXEMPT):
            assert (await client.get(path)).status == 200, path
        assert (await client.options("/v1/runs")).status == 200  # a CORS preflight is not counted
        release.set()
        assert [(await h).status for h in held] == [200, 200]
        assert (await client.get("/v1/runs")).status == 200 and gate.in_flight == 0 and gate.refused == 1
    finally:
        release.set()
        await client.close()


async def test_concurrency_limit_off_by_default() -> None:
    client, gate, release, _ = await held_app(None)
    try:
        held = [asyncio.ensure_future(client.get("/slow")) for _ in range(20)]
        assert (await client.get("/v1/runs")).status == 200
        release.set()
        assert {(await h).status for h in held} == {200}
    finally:
        await client.close()


def test_concurrency_limit_from_the_option_and_the_environment(monkeypatch: Any) -> None:
    config = _server_config("gateway", None, "127.0.0.1", 0, None, ConnectionOptions(), max_concurrent_requests=7)
    assert config.settings.max_concurrent_requests == 7
    monkeypatch.setenv(MAX_CONCURRENT_ENV, "12")
    assert max_concurrent_from_env() == 12 and Settings().max_concurrent_requests == 12
    for bad in ("0", "-3", "many"):
        monkeypatch.setenv(MAX_CONCURRENT_ENV, bad)
        with pytest.raises(ValueError, match=MAX_CONCURRENT_ENV):
            max_concurrent_from_env()
    monkeypatch.delenv(MAX_CONCURRENT_ENV)
    assert Settings().max_concurrent_requests is None
    with pytest.raises(ValueError, match="at least 1"):
        ConcurrencyLimit(0)


@pytest.mark.parametrize("command", ["serve", "gateway"])
def test_concurrency_limit_option_of_the_http_commands(command: str) -> None:
    result = CliRunner().invoke(cli_app, [command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "--max-concurrent-requests" in result.stdout
    refused = CliRunner().invoke(cli_app, [command, "--max-concurrent-requests", "0"])
    assert refused.exit_code == 2  # a usage error, before anything starts
