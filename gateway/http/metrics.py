"""Prometheus metrics of the gateway, on a registry owned by the app (not the global one).

One registry per app keeps several apps in one process (tests, embedded use) from colliding, and
gives the runtime a place to register its run counters: `app[METRICS].registry`.
Latency is labelled by route *template* (`/v1/threads/{id}`), never by raw path, so cardinality
stays bounded whatever ids clients send.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from eventlog.events import RunFinished, RunStarted
from runtime.telemetry import AgentMetrics

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

        self.runs = RunMetrics(self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    content_type = CONTENT_TYPE_LATEST

    def middleware(self) -> Middleware:
        # The labelled child per (method, route template, status), looked up once: `labels()`
        # validates and takes a lock on every call. Bounded like the labels themselves.
        children: dict[tuple[str, str, int], Any] = {}
        labels = self.http_latency.labels

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


class RunMetrics:
    """Runs started / finished (by termination) and active, counted from the LOG, not from the
    routes: whoever starts a run (HTTP, NATS, an adapter, a worker continuing it) and wherever it
    executes (this process or a worker), its `RunStarted`/`RunFinished` commits are the truth.
    Counted from when the gateway started following (`watch`); `active` is the runs seen started
    and not yet seen finished since then (a run started before the gateway does not show)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.started = Counter("agentlog_runs_started_total", "Runs started (RunStarted seen in the log)",
                               registry=registry)
        self.finished = Counter("agentlog_runs_finished_total", "Runs finished, by termination type",
                                ["termination"], registry=registry)
        self.active = Gauge("agentlog_runs_active", "Runs started and not finished (seen by this gateway)",
                            registry=registry)
        self._active: set[str] = set()
        self._changed = asyncio.Event()
        #: Token, tool call and model latency metrics, from the same followed commits.
        self.agent = AgentMetrics(registry)

    async def wait_until(self, pred: Any) -> None:
        """Wait until `pred()` holds after some observed commit (tests; no polling)."""
        while True:
            self._changed.clear()
            if pred():
                return
            await self._changed.wait()

    def observe(self, commit: Any) -> None:
        for event in commit.events:
            if type(event) is RunStarted:
                self.started.inc()
                self._active.add(event.run_id)
            elif type(event) is RunFinished:
                self.finished.labels(event.termination.type).inc()
                self._active.discard(commit.run_id)
        self.agent.observe(commit)
        self.active.set(len(self._active))
        self._changed.set()

    async def watch(self, store: Any) -> None:
        """Follow the whole log from its current end; reconnects are the store's job."""
        after = await store.last_seq()
        async for stored in store.follow(None, after=after):
            self.observe(stored.commit)

    def start(self, store: Any) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(self._watch_logged(store), name="agentlog-run-metrics")

    async def _watch_logged(self, store: Any) -> None:
        with contextlib.suppress(Exception):  # metrics must never take the gateway down
            await self.watch(store)


__all__ = ["Metrics", "RunMetrics"]
