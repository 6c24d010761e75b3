"""The HTTP side of Prometheus metrics: the gateway's request latency, labelled by route
*template* (`/v1/threads/{id}`), never by raw path, so cardinality stays bounded whatever ids
clients send; and `serve_metrics`, the `/metrics` endpoint of a process without a gateway (a
worker). The registry and the run metrics are `agentlog.gateway.operations.metrics.Metrics`.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from agentlog.gateway.http.errors import Handler
from agentlog.gateway.operations.metrics import Metrics


def middleware(metrics: Metrics) -> Middleware:
    """Request latency by route template (`agentlog_http_request_duration_seconds`)."""
    # The labelled child per (method, route template, status), looked up once: `labels()`
    # validates and takes a lock on every call. Bounded like the labels themselves.
    children: dict[tuple[str, str, int], Any] = {}
    labels = metrics.http_latency.labels

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            info = request.match_info
            route = info.route.resource.canonical if info.route.resource is not None else "unmatched"
            key = (request.method, route, status)
            child = children.get(key)
            if child is None:
                child = children[key] = labels(request.method, route, str(status))
            child.observe(time.perf_counter() - started)

    return middleware


async def serve_metrics(registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> web.AppRunner:
    """A tiny aiohttp server with `GET /metrics` for `registry` (a worker has no gateway).
    Returns the `AppRunner`; `await runner.cleanup()` stops it. Port 0 picks a free one
    (`runner.addresses`)."""

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


__all__ = ["middleware", "serve_metrics"]
