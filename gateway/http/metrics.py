"""Prometheus metrics of the gateway, on a registry owned by the app (not the global one).

One registry per app keeps several apps in one process (tests, embedded use) from colliding, and
gives the runtime a place to register its run counters: `app[METRICS].registry`.
Latency is labelled by route *template* (`/v1/threads/{id}`), never by raw path, so cardinality
stays bounded whatever ids clients send.
"""

from __future__ import annotations

import time

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, Histogram, generate_latest

from .errors import Handler


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.http_latency = Histogram(
            "agentlog_http_request_duration_seconds",
            "HTTP request latency (to the end of the handler; SSE streams count their whole life)",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.projection_lag = Gauge(
            "agentlog_projection_lag_commits", "Commits in the log not yet folded into the views",
            registry=self.registry,
        )
        self.projection_applied = Gauge(
            "agentlog_projection_applied_seq", "Highest log seq folded into the views", registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)

    content_type = CONTENT_TYPE_LATEST

    def middleware(self) -> object:
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
                self.http_latency.labels(request.method, route, str(status)).observe(
                    time.perf_counter() - started)

        return middleware


__all__ = ["Metrics"]
