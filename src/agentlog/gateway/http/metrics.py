"""The HTTP side of the gateway's Prometheus metrics: request latency, labelled by route
*template* (`/v1/threads/{id}`), never by raw path, so cardinality stays bounded whatever ids
clients send. The registry and the run metrics are `agentlog.gateway.operations.metrics.Metrics`.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from agentlog.gateway.http.errors import Handler
from agentlog.gateway.operations.metrics import Metrics, RunMetrics


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


__all__ = ["Metrics", "RunMetrics", "middleware"]
