"""Prometheus metrics of the gateway, on a registry owned by the app (not the global one).

One registry per app keeps several apps in one process (tests, embedded use) from colliding, and
gives the runtime a place to register its run counters: `app[METRICS].registry`. The NATS service
counts runs here too; the HTTP latency middleware is `agentlog.gateway.http.metrics.middleware`.
Latency is labelled by route *template* (`/v1/threads/{id}`), never by raw path, so cardinality
stays bounded whatever ids clients send.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agentlog.eventlog.events import RunFinished, RunStarted
from agentlog.eventlog.store import EventStore
from agentlog.projections import finished_status
from agentlog.runtime import AgentMetrics, mcp_health


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
        self.log_health = LogHealthCollector()
        self.registry.register(self.log_health)
        self.registry.register(McpCollector())

    def render(self) -> bytes:
        return generate_latest(self.registry)

    content_type = CONTENT_TYPE_LATEST


class LogHealthCollector(Collector):
    """Figures read at scrape time from the parts that keep them (no copy to keep in sync):
    the commits quarantined by this process's readers (`agentlog.eventlog.quarantine`), whether its
    writes to the log go through (`agentlog.eventlog.write_health`)."""

    def __init__(self) -> None:
        self.quarantines: list[Any] = []
        self.writes: Any = None

    def watch_writes(self, writes: Any) -> None:
        self.writes = writes

    def watch_quarantine(self, quarantine: Any) -> None:
        if quarantine is not None and all(q is not quarantine for q in self.quarantines):
            self.quarantines.append(quarantine)

    def collect(self) -> Iterator[Metric]:
        counter = CounterMetricFamily(
            "agentlog_commits_quarantined", "Undecodable messages of the log this process's readers "
            "quarantined (distinct seqs; each is shown as a CommitQuarantined marker)")
        counter.add_metric([], float(sum(q.total for q in self.quarantines)))
        yield counter
        if self.writes is not None:
            failing = GaugeMetricFamily("agentlog_log_writes_failing",
                                        "1 while this process's writes to the log fail (a full disk), else 0")
            failing.add_metric([], 1.0 if self.writes.failing else 0.0)
            yield failing
            failures = CounterMetricFamily("agentlog_log_write_failures", "Writes to the log that failed")
            failures.add_metric([], float(self.writes.failures))
            yield failures


class McpCollector(Collector):
    """Each MCP server of this process (`agentlog.runtime.toolkits.mcp.mcp_health`): up or not, and how
    many times its session was reopened after being lost."""

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("agentlog_mcp_server_up", "1 while the MCP server's session is open, else 0",
                               labels=["server"])
        restarts = CounterMetricFamily("agentlog_mcp_server_restarts",
                                       "MCP sessions reopened after one was lost (the server exited or hung)",
                                       labels=["server"])
        for name, health in sorted(mcp_health().items()):
            up.add_metric([name], 1.0 if health["status"] == "ok" else 0.0)
            restarts.add_metric([name], float(health["restarts"]))
        yield up
        yield restarts


class RunMetrics:
    """Runs started / finished (by termination) and active, counted from the LOG, not from the
    routes: whoever starts a run (HTTP, NATS, an adapter, a worker continuing it) and wherever it
    executes (this process or a worker), its `RunStarted`/`RunFinished` commits are the truth.
    Counted from when the gateway started following (`watch`); `active` is the runs seen started
    and not yet seen finished since then (a run started before the gateway does not show)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.started = Counter("agentlog_runs_started_total", "Runs started (RunStarted seen in the log)",
                               registry=registry)
        self.finished = Counter("agentlog_runs_finished_total",
                                "Runs finished, by status (done, or failed: an error or blocked termination) "
                                "and termination type", ["status", "termination"], registry=registry)
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
                self.finished.labels(finished_status(event.termination), event.termination.type).inc()
                self._active.discard(commit.run_id)
        self.agent.observe(commit)
        self.active.set(len(self._active))
        self._changed.set()

    async def watch(self, store: EventStore) -> None:
        """Follow the whole log from its current end; reconnects are the store's job."""
        after = await store.last_seq()
        async for stored in store.follow(None, after=after):
            self.observe(stored.commit)

    def start(self, store: EventStore) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(self._watch_logged(store), name="agentlog-run-metrics")

    async def _watch_logged(self, store: EventStore) -> None:
        with contextlib.suppress(Exception):  # metrics must never take the gateway down
            await self.watch(store)


__all__ = ["LogHealthCollector", "McpCollector", "Metrics", "RunMetrics"]
