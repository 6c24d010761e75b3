"""`create_app`: the aiohttp application of DESIGN 5.1, wired from its parts.

Middlewares, outermost first: metrics (times everything, including error answers), the
concurrent-request limit (`limits`: 503 `overloaded` beyond it), errors (the one place failures
become JSON), auth (only /v1). The route table is the list of `Route`s from the
route modules plus `extra_routes`; the same list feeds the router and `/openapi.json`.

The app does not own the store, the views or the runner: whoever built them closes them (the
`serve` command, or a test fixture). That keeps the app cheap to build per test and lets one
process host the gateway next to a worker on the same connection.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.gateway.http import (
    changes,
    cors,
    health,
    inspector,
    openapi,
    ops,
    profiles,
    runs,
    sse,
    threads,
    ui,
)
from agentlog.gateway.http.errors import error_middleware
from agentlog.gateway.http.limits import ConcurrencyLimit
from agentlog.gateway.http.metrics import middleware as metrics_middleware
from agentlog.gateway.http.replies import reply
from agentlog.gateway.http.requests import AUTHENTICATOR, SERVICES, auth_middleware
from agentlog.gateway.http.routing import Route
from agentlog.gateway.operations.auth import Authenticator, resolve_tokens
from agentlog.gateway.operations.dispatch import Dispatcher
from agentlog.gateway.operations.metrics import Metrics
from agentlog.gateway.operations.services import Runner, Services, Settings
from agentlog.projections.store import ViewStore

ROUTES = web.AppKey("agentlog.routes", list)
LIMIT = web.AppKey("agentlog.limit", ConcurrencyLimit)
OPENAPI = web.AppKey("agentlog.openapi", openapi.Documents)


async def openapi_json(request: web.Request) -> web.Response:
    return reply(request.app[OPENAPI].v31)


OPENAPI_ROUTE = Route("GET", "/openapi.json", openapi_json, "This document (OpenAPI 3.1)", "health",
                      response={"type": "object"}, auth=False)


async def openapi_30_json(request: web.Request) -> web.Response:
    return reply(request.app[OPENAPI].v30)


OPENAPI_30_ROUTE = Route("GET", "/openapi-3.0.json", openapi_30_json,
                         "This document in OpenAPI 3.0 terms (what the Swagger UI at /docs reads)", "health",
                         response={"type": "object"}, auth=False)


def route_table(extra_routes: Sequence[Route] = ()) -> list[Route]:
    return [*health.ROUTES, OPENAPI_ROUTE, OPENAPI_30_ROUTE, *threads.ROUTES, *profiles.ROUTES, *runs.ROUTES,
            *inspector.ROUTES, *changes.ROUTES, *ops.ROUTES, *ui.ROUTES, *extra_routes]


def create_app(
    store: JetStreamEventStore,
    views: ViewStore,
    runner: Runner,
    *,
    auth_tokens: str | Mapping[str, str | None] | None = None,
    dispatcher: Dispatcher | None = None,
    extra_routes: Sequence[Route] = (),
    settings: Settings | None = None,
    metrics: Metrics | None = None,
    count_runs: bool = True,
) -> web.Application:
    """Build the app.

    `auth_tokens`: `"tok1,tok2:tenantA"` or `{token: tenant_prefix_or_None}`; None reads
    `AGENTLOG_TOKENS`; empty means no auth. `dispatcher` is how the protocol adapters' routes start
    and decide runs (`services(request).dispatcher`; the write routes in `extra_routes` hold their
    own), and, when it runs them in this process, what verified replay replays with. `metrics.registry` is where
    other parts register their own collectors. `count_runs`: follow the log to count runs
    started/finished/active (`metrics.RunMetrics`).
    """
    settings = settings or Settings()
    metrics = metrics or Metrics()
    metrics.log_health.watch_quarantine(getattr(store, "quarantine", None))
    metrics.log_health.watch_quarantine(getattr(runner, "quarantine", None))
    metrics.log_health.watch_writes(getattr(store, "writes", None))
    auth = Authenticator(resolve_tokens(auth_tokens))
    limit = ConcurrencyLimit(settings.max_concurrent_requests)
    app = web.Application(
        middlewares=[metrics_middleware(metrics), limit.middleware, error_middleware, auth_middleware(auth)],
        client_max_size=settings.max_body,
    )
    app[LIMIT] = limit
    app[AUTHENTICATOR] = auth
    cors.install(app, settings.cors_origins)
    app[SERVICES] = Services(store=store, views=views, runner=runner, metrics=metrics,
                             settings=settings, dispatcher=dispatcher)
    table = route_table(extra_routes)
    for route in table:
        app.router.add_route(route.method, route.path, route.handler)
    app[ROUTES] = table
    app[OPENAPI] = openapi.Documents(table)
    # one shared log follow per followed thread for every SSE client of this app (sse.FollowHub)
    hub = app[sse.HUB] = sse.FollowHub(store, queue_size=settings.sse_queue)
    app.on_cleanup.append(lambda _app: hub.close())
    app[sse.STREAMS] = set()
    app.on_shutdown.append(sse.end_streams)
    # what changed in the views, live, for lists kept open (the inspector's)
    changes.install(app, runner)
    if count_runs:
        app.cleanup_ctx.append(_run_metrics(store, metrics))
    return app


def _run_metrics(store: JetStreamEventStore, metrics: Metrics) -> Any:
    """Count runs from the log while the app runs (see `metrics.RunMetrics`)."""

    async def ctx(_app: web.Application) -> Any:
        import asyncio
        import contextlib

        task = metrics.runs.start(store)
        yield
        task.cancel()
        with contextlib.suppress(BaseException):
            async with asyncio.timeout(2):
                await task

    return ctx


__all__ = ["OPENAPI_ROUTE", "create_app", "route_table"]
