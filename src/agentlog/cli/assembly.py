"""Assemble one running agentlog process: `agentlog serve`, `gateway` and `worker` (DESIGN 4.5).

    async with serve(ServerConfig(role="serve", app_spec="pkg.agents:app", port=0)) as server:
        print(server.http_url, server.nats_url)

Why one assembler for three commands: the parts (NATS, the store, the KV views and their runner,
the runtime, the dispatcher, the worker, the HTTP app, the NATS micro service) depend on each
other in one fixed order, and a process that stops must undo them in exactly the reverse order
(stop taking requests before the runtime goes, stop the runtime before the store closes, close
the store before the embedded nats-server exits). Keeping that order in one place is what makes
"stop the process while a run waits, start another, approve" safe: nothing but the log survives,
and nothing half-written is left in it.

Roles:
- `serve`: gateway + worker in one process. Every run goes through the durable command path:
  the dispatcher queues commands (`QueueDispatcher`) and this process's `Worker` takes them, so
  a run is always held by an unacked command (the lease) and a process that dies (SIGKILL) or
  stops (SIGTERM: drain, then nak) hands its runs to the next worker, which resumes them from
  the log. A run started in-process, outside the queue, would have no such lease and stay
  `running` forever after a crash.
- `gateway`: HTTP + NATS service only; commands go to the JetStream work queue (`QueueDispatcher`)
  for `agentlog worker` processes.
- `worker`: a `Worker` only (no HTTP).

The write routes (`agentlog.gateway.http.write`), the dispatcher (`agentlog.gateway.operations.dispatch`), the protocol
adapters (`agentlog.gateway.adapters.routes` / `nats_routes`) and the NATS micro service
(`agentlog.gateway.nats.service`) are imported at the top like any other dependency: a broken module fails
the process loudly at start instead of serving a quietly smaller API.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import structlog
from aiohttp import web

from agentlog.eventlog.embedded.datadir import SharedServer
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.subjects import DEFAULT_APP
from agentlog.gateway.nats import service as nats_service
from agentlog.gateway.operations import dispatch
from agentlog.gateway.operations.app_loader import AppSource, load_app, resolve_app
from agentlog.gateway.operations.connection import ConnectionOptions, connect
from agentlog.runtime import agent_catalog
from agentlog.runtime.agents.setup import check_models
from agentlog.runtime.inputs.run_input import OverrideScope
from agentlog.runtime.outage import OutagePolicy, is_transient, through_outage

if TYPE_CHECKING:
    from agentlog.eventlog.events import AppRef
    from agentlog.projections.kv import KVViewStore
    from agentlog.projections.runner import ProjectionRunner
    from agentlog.projections.store import ViewStore
    from agentlog.runtime.facade import Runtime
    from agentlog.runtime.live import LiveSink, NatsLiveSink
    from agentlog.runtime.snapshots.store import KVSnapshotStore, SnapshotStore
    from agentlog.runtime.workers.worker import Worker

log = structlog.get_logger("agentlog.server")

Role = Literal["serve", "gateway", "worker"]
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8480


@dataclass(frozen=True)
class ServerConfig:
    """Everything a server process needs. `app` (an already loaded app source) wins over
    `app_spec` (`module:attr`); with neither, the built-in demo app is served."""

    role: Role = "serve"
    app_spec: str | None = None
    app: AppSource | None = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    connection: ConnectionOptions = field(default_factory=ConnectionOptions)
    #: API tokens (`"tok1,tok2:tenant"`); None reads AGENTLOG_TOKENS; "" means no auth.
    tokens: str | None = None
    #: Commands (= runs being driven) a worker runs at once. None: 64 in `serve`, whose worker
    #: drives every run the process accepts (runs are I/O-bound tasks), 4 in `worker`.
    worker_concurrency: int | None = None
    #: Seconds a worker may drain in-flight commands on stop before it naks them. None reads
    #: AGENTLOG_SHUTDOWN_TIMEOUT, else 10.
    worker_shutdown_timeout: float | None = None
    #: The command lease: a command whose worker stops heartbeating is redelivered after this
    #: many seconds (JetStream ack_wait). None reads AGENTLOG_WORKER_ACK_WAIT, else 30.
    worker_ack_wait: float | None = None
    #: Failed deliveries of a command before it is dead-lettered (0: never). None: the worker's
    #: default (`agentlog.runtime.workers.worker.DEFAULT_MAX_DELIVER`).
    worker_max_deliver: int | None = None
    #: Serve Prometheus `/metrics` (the worker's commands and load, and the tokens, tool calls and
    #: model latency of the runs it executes) on 127.0.0.1:PORT: for the `worker` role, which has
    #: no gateway (0: any port).
    worker_metrics_port: int | None = None
    #: agentlog.gateway.http Settings (None: defaults).
    settings: Any = None
    #: Start the NATS micro service (and the adapters' NATS subjects).
    nats_service: bool = True
    #: The gateway's address as clients reach it, the base of the URLs it publishes (A2A cards;
    #: `agentlog.gateway.http.urls`). None reads AGENTLOG_PUBLIC_URL; unset: the listen address.
    public_url: str | None = None
    #: Retention policy of a gateway (`serve`, `gateway`): archive finished threads older than
    #: this many days (`agentlog.gateway.operations.retention`). None: no policy.
    archive_after: float | None = None
    #: The app's name (`agentlog.runtime.workers.commands`): the worker takes only its app's commands, the
    #: gateway queues new runs for its app's workers, runs record it. None: $AGENTLOG_APP_NAME,
    #: else "default".
    app_name: str | None = None

    def resolved_app_name(self) -> str:
        from agentlog.runtime.workers.commands import validate_app_name

        name = self.app_name or os.environ.get(ENV_APP_NAME, "").strip() or DEFAULT_APP
        return validate_app_name(name)


def _load_source(config: ServerConfig) -> AppSource:
    if config.app is not None:
        return config.app
    if config.app_spec:
        return load_app(config.app_spec)
    from agentlog.cli.demo import app as demo_factory

    return demo_factory


def build_runtime(source: AppSource, store: JetStreamEventStore, *, views: ViewStore, live: LiveSink,
                  snapshots: SnapshotStore | None = None) -> Runtime:
    """The user's app as a `Runtime` on this process's store, with the views snapshot, the
    run-context snapshots (fast cold resume) and the live sink. A `Runtime` returned by a
    factory is used as is: the factory was given this store, so its own wiring wins (it may wrap
    the store, e.g. to record or inject faults). A `Runtime` the app module made itself (at
    import time, on a store of its own) gives its agents, tools, models, entropy, summarizer,
    observers and outage deadline to a Runtime on this store: driving runs on the app's own
    store would commit them where no gateway, worker or projection of this deployment looks
    (the gateway then timed out waiting for a run that had finished elsewhere)."""
    from agentlog.runtime import Runtime

    obj = resolve_app(source, store)
    if isinstance(obj, Runtime):
        if obj is not source:  # a factory's
            return obj
        return Runtime(store, agents=obj.agents, tools=obj.tools, models=obj.models, views=views, live=live,
                       snapshots=snapshots, entropy=obj.entropy, summarizer=obj.summarizer,
                       observers=obj.observers, store_outage_deadline=obj.outage.deadline, breakers=obj.breakers)
    return Runtime(store, agents=obj.agents, tools=obj.tools, models=dict(getattr(obj, "models", {}) or {}),
                   views=views, live=live, snapshots=snapshots, breakers=getattr(obj, "breakers", None))


ENV_ACK_WAIT = "AGENTLOG_WORKER_ACK_WAIT"
ENV_APP_NAME = "AGENTLOG_APP_NAME"
ENV_SHUTDOWN_TIMEOUT = "AGENTLOG_SHUTDOWN_TIMEOUT"
#: How long the gateway waits for a worker to commit what a request queued (default 10 s); a
#: start no worker took by then is withdrawn (503 `dispatch_timeout`, it will not run).
ENV_DISPATCH_TIMEOUT = "AGENTLOG_DISPATCH_TIMEOUT"


def _seconds(value: float | None, env: str, default: float) -> float:
    """`value`, else the environment variable `env` (seconds), else `default`."""
    if value is not None:
        return value
    raw = os.environ.get(env, "").strip()
    try:
        return float(raw) if raw else default
    except ValueError:
        raise ValueError(f"{env} must be a number of seconds, not {raw!r}") from None


def app_ref(name: str, runtime: Runtime) -> AppRef:
    """What the runs of `runtime` record as their app (`RunStarted.app`): the name it serves
    under and the digest of its agents and tools."""
    from agentlog.eventlog.events import AppRef
    from agentlog.runtime.digest import app_digest

    return AppRef(name=name, digest=app_digest(runtime.agents, runtime.tools))


class Server:
    """One process's parts, started in dependency order by `start()` and stopped in reverse by
    `stop()` (idempotent; safe after a failed start)."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        #: This process's share of the data dir's embedded nats-server (None with a NATS URL).
        self.embedded: SharedServer | None = None
        #: Restarts the embedded server's JetStream once a full disk has room again (`agentlog.eventlog.embedded.revive`).
        self.disk_watch: Any = None
        self.store: JetStreamEventStore | None = None
        self.views: KVViewStore | None = None
        self.snapshots: KVSnapshotStore | None = None
        self.runner: ProjectionRunner | None = None
        self.live: NatsLiveSink | None = None
        self.runtime: Runtime | None = None
        self.dispatcher: dispatch.Dispatcher | None = None
        #: The app's agents (id -> AgentSpec) when known here (the A2A server's cards).
        self.agent_specs: dict[str, Any] = {}
        #: `GET /v1/agents` when the app is known here (ids, descriptions, tools).
        self.agent_catalog: list[dict[str, Any]] | None = None
        self.worker: Worker | None = None
        #: The worker role's /metrics server and the OTLP tracer provider (`agentlog.runtime.telemetry`).
        self.metrics_runner: web.AppRunner | None = None
        #: Where the worker's /metrics answers (its port as bound: `--metrics-port 0` picks one).
        self.metrics_url = ""
        self.tracer_provider: Any = None
        self.service: Any = None
        self.adapter_service: Any = None
        self.retention: Any = None
        #: `/v1/mcp` (agentlog.gateway.adapters.mcp.streamable_http) when the app's agents are known here.
        self.mcp: Any = None
        #: A2A push notification delivery (agentlog.gateway.adapters.a2a.push), with the A2A server.
        self.a2a_push: Any = None
        self.web_runner: web.AppRunner | None = None
        self.app: web.Application | None = None
        self.port: int | None = None
        #: Which optional parts were wired (for the banner and tests).
        self.parts: list[str] = []

    # -- addresses -----------------------------------------------------------------------------

    @property
    def nats_url(self) -> str:
        return self.embedded.url if self.embedded is not None else (self.config.connection.nats_url or "")

    @property
    def http_url(self) -> str:
        return f"http://{self.config.host}:{self.port}" if self.port is not None else ""

    @property
    def has_http(self) -> bool:
        return self.config.role in ("serve", "gateway")

    @property
    def has_worker(self) -> bool:
        return self.config.role in ("serve", "worker")

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> Server:
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def _start(self) -> None:
        from agentlog.projections.kv import KVViewStore
        from agentlog.projections.lease import WriterLease
        from agentlog.projections.runner import ProjectionRunner
        from agentlog.runtime import NatsLiveSink
        from agentlog.runtime.snapshots.store import KVSnapshotStore
        from agentlog.runtime.workers.commands import ensure_runtime_streams

        opts = self.config.connection
        app_name = self.config.resolved_app_name()  # fail on a bad name before anything starts
        source = _load_source(self.config)  # fail on a bad --app before anything starts
        # NATS may be starting or electing leaders (a compose file, a fresh cluster, a restarted
        # node): a server process waits for it like the loop waits through an outage (same
        # deadline, transient errors only) instead of exiting on the first timeout.
        policy = OutagePolicy.from_env()
        store, self.embedded = await through_outage(
            lambda: connect(opts, self.config.role, f"agentlog-{self.config.role}"),
            policy, log, "server.connect", is_transient)
        self.store = store
        nc = store.nc
        if self.embedded is not None:  # the data dir's own server: bring its JetStream back after a full disk
            from agentlog.eventlog.embedded.revive import DiskWatch

            self.disk_watch = DiskWatch(self.embedded.data_dir, store)
            self.disk_watch.start()

        async def layout() -> tuple[KVViewStore, KVSnapshotStore | None, WriterLease | None]:
            """The streams and buckets this process uses, each created if missing (so repeatable):
            on a cluster that has just elected its leaders, creating them can time out once more
            after the connect went through (a worker of the cluster benchmark exited so)."""
            if opts.replicas is not None:  # else the defaults are created lazily where they are used
                await ensure_runtime_streams(nc.jetstream(timeout=opts.timeout), replicas=opts.replicas)
            views = await KVViewStore.open(nc, replicas=opts.replicas)
            # the gateway reads them too (its dispatcher checks a decision on the run loaded from one)
            snapshots = await KVSnapshotStore.open(nc, replicas=opts.replicas)
            # every gateway runs a projection runner; the one holding this lease writes the views
            lease = await WriterLease.open(nc, replicas=opts.replicas) if self.has_http else None
            return views, snapshots, lease

        views, snapshots, lease = await through_outage(layout, policy, log, "server.layout", is_transient)
        registry: Any = None
        self.views, self.snapshots = views, snapshots
        if self.has_http:
            self.runner = ProjectionRunner(nc, views, quarantine=store.quarantine, lease=lease)
            # it reads the log's head and position: on a cluster still settling that can time
            # out too (start is repeatable: the lease it holds is kept, the feed opened again)
            await through_outage(self.runner.start, policy, log, "projections.start", is_transient)
        if self.has_worker:
            self.live = NatsLiveSink(nc)
            self.live.start()
            from agentlog.runtime.snapshots.store import SnapshotWriter

            self.runtime = build_runtime(source, self.store, views=views, live=self.live, snapshots=snapshots)
            # a key or provider SDK missing fails the start, as a YAML app's does at load
            check_models(self.runtime.agents, self.runtime.models)
            self.runtime.app = app_ref(app_name, self.runtime)
            if self.runner is not None and self.runtime.snapshots is not None:
                self.runner.after_batch = SnapshotWriter(self.runtime)
            # OTLP spans of the runs this process executes, when OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
            # is set (agentlog.runtime.telemetry); the gateway's /metrics counts tokens/tools from the log
            from agentlog.runtime.telemetry import instrument

            if self.config.worker_metrics_port is not None:
                from prometheus_client import CollectorRegistry

                from agentlog.gateway.http.metrics import serve_metrics
                from agentlog.gateway.operations.metrics import McpCollector

                registry = CollectorRegistry()
                registry.register(McpCollector())
                self.metrics_runner = await serve_metrics(registry, self.config.worker_metrics_port)
                host, bound = self.metrics_runner.addresses[0][:2]
                self.metrics_url = f"http://{host}:{bound}/metrics"
                self.parts.append("metrics")
            self.tracer_provider = instrument(self.runtime, registry)
        if self.has_http:
            self.dispatcher = self._dispatcher(source)
        if self.has_worker:
            from agentlog.runtime.workers.worker import DEFAULT_CONCURRENCY, DEFAULT_MAX_DELIVER, Worker

            max_deliver = self.config.worker_max_deliver
            self.worker = Worker(
                self.store, runtime=self.runtime, concurrency=self.config.worker_concurrency or DEFAULT_CONCURRENCY,
                ack_wait=_seconds(self.config.worker_ack_wait, ENV_ACK_WAIT, 30.0),
                shutdown_timeout=_seconds(self.config.worker_shutdown_timeout, ENV_SHUTDOWN_TIMEOUT, 10.0),
                max_deliver=DEFAULT_MAX_DELIVER if max_deliver is None else max_deliver, app_name=app_name)
            await through_outage(self.worker.start, policy, log, "worker.start", is_transient)
            self.parts.append("worker")
            if registry is not None:  # the worker's own /metrics
                from agentlog.runtime.workers.metrics import WorkerCollector

                registry.register(WorkerCollector(self.worker))
        if self.has_http:
            await self._start_http()
            if self.config.nats_service:
                await self._start_service()
            if self.config.archive_after is not None:
                from agentlog.gateway.operations.retention import RetentionLoop

                self.retention = RetentionLoop(opts, self.config.archive_after)
                self.retention.start()
                self.parts.append("retention")
        log.info("server.started", role=self.config.role, http=self.http_url, nats=self.nats_url, parts=self.parts)

    def _dispatcher(self, source: AppSource) -> Any:
        """Always the work queue, also in `serve` (its own worker takes the commands): a run
        is never driven outside a leased command. Unknown agents are refused here when the app
        is known (always in `serve`; with --app in `gateway`)."""
        assert self.store is not None
        self.parts.append("dispatch:queue")
        if self.runtime is not None:
            self.agent_specs = {spec.id: spec for spec in self.runtime.agents}
            self.agent_catalog = agent_catalog(self.runtime)
        elif self.config.app is not None or self.config.app_spec:
            resolved = resolve_app(source, self.store)
            self.agent_specs = {spec.id: spec for spec in resolved.agents}
            self.agent_catalog = agent_catalog(resolved)
        agents = list(self.agent_specs) if self.agent_specs else None
        return dispatch.QueueDispatcher(self.store.nc, self.store, agents=agents, descriptions={
            agent_id: spec.description for agent_id, spec in self.agent_specs.items()}, snapshots=self.snapshots,
            timeout=_seconds(None, ENV_DISPATCH_TIMEOUT, 10.0),
            app_name=self.config.resolved_app_name(), override_policies={
                agent_id: OverrideScope(spec.model_name, spec.overrides) for agent_id, spec in self.agent_specs.items()},
            handoff=getattr(self.runtime, "handoff", None))  # serve: this process's worker decides

    def _routes(self) -> list[Any]:
        # The adapters (and the AG-UI SDK they use) are imported by the processes that serve
        # them: a worker never does, and they were a third of its start.
        from agentlog.gateway.adapters import routes as adapter_routes
        from agentlog.gateway.adapters import session as adapter_session
        from agentlog.gateway.http.write import write_routes

        assert self.dispatcher is not None
        self.parts += ["write", "adapters"]
        routes = [*write_routes(self.dispatcher), *adapter_routes.ROUTES]
        # -- the A2A server (agentlog.gateway.adapters.a2a), when the `a2a` extra is installed --
        from agentlog.gateway.adapters.a2a.routes import a2a_routes, available

        if available() and self.agent_specs:
            from agentlog.gateway.http.urls import PUBLIC_URL_ENV, public_base_url

            specs = self.agent_specs
            configured = self.config.public_url
            public = public_base_url(configured if configured is not None else os.environ.get(PUBLIC_URL_ENV))
            from agentlog.gateway.adapters.a2a.push import PushConfigs, PushDelivery

            assert self.store is not None
            configs = PushConfigs(self.store.nc)
            self.a2a_push = PushDelivery(self.store, configs)
            routes += a2a_routes(self.dispatcher, lambda: specs, public_url=public, push=configs)
            self.parts.append("a2a")
        if self.agent_catalog is not None:  # the agents as MCP tools (agentlog.gateway.adapters.mcp.streamable_http)
            from agentlog.gateway.adapters.mcp.streamable_http import McpEndpoint

            catalog = self.agent_catalog
            assert self.store is not None
            self.mcp = McpEndpoint(adapter_session.backend_of(self.store, self.dispatcher), lambda: catalog)
            routes += self.mcp.routes()
            self.parts.append("mcp")
        return routes

    async def _start_http(self) -> None:
        from agentlog.gateway.http import Settings, create_app
        from agentlog.gateway.operations.metrics import Metrics

        assert self.store is not None and self.views is not None and self.runner is not None
        metrics = Metrics()
        if self.worker is not None:  # `serve`: the worker's metrics on the gateway's /metrics
            from agentlog.runtime.workers.metrics import WorkerCollector

            metrics.registry.register(WorkerCollector(self.worker))
        self.app = create_app(self.store, self.views, self.runner, auth_tokens=self.config.tokens,
                              dispatcher=self.dispatcher, metrics=metrics,
                              extra_routes=self._routes(), settings=self.config.settings or Settings())
        self.app[SERVER] = self
        if self.mcp is not None:
            self.app.on_shutdown.append(self.mcp.close)
        if self.agent_catalog is not None:
            from agentlog.gateway.adapters.routes import AGENT_CATALOG

            self.app[AGENT_CATALOG] = self.agent_catalog
        if self.runtime is not None:  # `POST /v1/runs/{id}/verify` replays with the worker's app
            from agentlog.gateway.http.inspector import REPLAY_APP

            self.app[REPLAY_APP] = self.runtime
        self.web_runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self.web_runner.setup()
        site = web.TCPSite(self.web_runner, self.config.host, self.config.port, reuse_address=True)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []  # noqa: SLF001 - the bound port
        self.port = sockets[0].getsockname()[1] if sockets else self.config.port
        if self.a2a_push is not None:  # its stream and consumers, created if missing (repeatable)
            await through_outage(self.a2a_push.start, OutagePolicy.from_env(), log, "a2a_push.start", is_transient)
            self.parts.append("a2a-push")

    async def _start_service(self) -> None:
        """The `agentlog` NATS micro service (DESIGN 5.2) and the adapters' NATS subjects, on the
        store's connection."""
        from agentlog.gateway.adapters import nats_routes as adapter_nats_routes
        from agentlog.gateway.adapters import session as adapter_session

        assert self.store is not None and self.dispatcher is not None
        assert self.views is not None and self.runner is not None
        self.service = await nats_service.start_nats_service(
            self.store, self.views, self.runner, self.dispatcher, auth_tokens=self.config.tokens,
            settings=self.config.settings, catalog=self.agent_catalog)
        self.parts.append("nats-service")
        backend = adapter_session.backend_of(self.store, self.dispatcher)
        self.adapter_service = adapter_nats_routes.AdapterService(
            self.store.nc, backend, auth_tokens=self.config.tokens)
        await self.adapter_service.start()
        self.parts.append("adapters-nats")

    async def stop(self) -> None:
        """Reverse order: stop taking requests (HTTP, NATS service), let the worker finish or hand
        back its commands, stop in-process runs uncommitted, flush live output, stop the
        projection runner, close the store, stop the embedded nats-server."""
        if self.retention is not None:
            await self.retention.stop()
            self.retention = None
        if self.disk_watch is not None:
            await self.disk_watch.stop()
            self.disk_watch = None
        if self.web_runner is not None:
            with contextlib.suppress(Exception):
                await self.web_runner.cleanup()
            self.web_runner = None
        for part in ("adapter_service", "service", "a2a_push"):
            obj = getattr(self, part)
            if obj is not None:
                with contextlib.suppress(Exception):
                    await obj.stop()
                setattr(self, part, None)
        if self.worker is not None:
            with contextlib.suppress(Exception):
                await self.worker.stop()
            self.worker = None
        if self.runtime is not None:
            # in-process runs stop uncommitted (fenced): the next process resumes them from the log;
            # a tool that ignores its cancellation is not waited for (the worker said so)
            from agentlog.runtime.workers.worker import ABANDON_GRACE

            abandoned = self.runtime.abandon_runs()
            if abandoned:
                await asyncio.wait(abandoned, timeout=ABANDON_GRACE)
        if self.metrics_runner is not None:
            with contextlib.suppress(Exception):
                await self.metrics_runner.cleanup()
            self.metrics_runner = None
        if self.tracer_provider is not None:
            with contextlib.suppress(Exception):
                self.tracer_provider.shutdown()  # flushes the batch exporter
            self.tracer_provider = None
        close = getattr(self.dispatcher, "aclose", None) or getattr(self.dispatcher, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                result = close()
                if inspect.isawaitable(result):
                    await result
        self.dispatcher = None
        if self.live is not None:
            with contextlib.suppress(Exception):
                await self.live.close()
            self.live = None
        if self.runner is not None:
            with contextlib.suppress(Exception):
                await self.runner.stop()
            self.runner = None
        if self.store is not None:
            with contextlib.suppress(Exception):
                await self.store.close()
            self.store = None
        if self.embedded is not None:
            await self.embedded.aclose()
            self.embedded = None
        log.info("server.stopped", role=self.config.role)

    def hand_back_now(self) -> None:
        """A stop under way hands its worker's runs back now instead of letting them finish
        within the shutdown timeout (a second Ctrl-C)."""
        if self.worker is not None:
            self.worker.hand_back_now()

    async def __aenter__(self) -> Server:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


SERVER = web.AppKey("agentlog.server", Server)


@contextlib.asynccontextmanager
async def serve(config: ServerConfig) -> AsyncIterator[Server]:
    """A started `Server`, stopped (in order) on exit."""
    server = Server(config)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def run_until_stopped(config: ServerConfig, on_ready: Any = None, stop: asyncio.Event | None = None) -> None:
    """Run a server until SIGINT/SIGTERM (or `stop` is set): the body of `agentlog serve`."""
    from agentlog.cli.demo import wait_for_signal

    async with serve(config) as server:
        if on_ready is not None:
            on_ready(server)
        if stop is not None:
            await stop.wait()
        else:
            await wait_for_signal(again=server.hand_back_now)


__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "Role", "SERVER", "Server", "ServerConfig", "build_runtime",
           "run_until_stopped", "serve"]
