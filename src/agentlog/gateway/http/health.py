"""Health, liveness, metrics and the OpenAPI document: open routes (no token), for probes,
scrapers and clients discovering the API.

`/health/live` says the process answers (restart me if not). `/health` says whether it can serve:

- `ok` (200): NATS connected, the views keep up with the log;
- `degraded` (200): it serves, but something is wrong that a caller or an operator should know;
  `reasons` says what, one `{code, detail}` each (codes below). Reads may lag writes then (a read
  with `min_seq` still waits for its write, bounded), so a load balancer keeps sending traffic;
- `unavailable` (503): NATS is unreachable, so a load balancer stops sending traffic that would
  only get 503s anyway.

`projection.writer` says whether this process writes the views (it holds the writer lease,
`agentlog.projections.lease`); the other gateways of a deployment follow its position.

Reason codes: `projection_catching_up` (the runner is still applying what the log got while no
runner ran, e.g. after a restart), `projection_lag` (more than `DEGRADED_LAG` commits behind),
`projection_failing` (its last batch failed, e.g. a KV write refused; it retries),
`log_writes_failing` (this process's last writes to the log or the command queue failed, e.g. a
full disk, until one goes through again), `log_stream_full` (a stream it writes to is at a
`discard: new` limit), `mcp_server_down` (an MCP server of this process is reconnecting with
backoff; `mcp` has each server's status).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from agentlog.eventlog.subjects import EVENTS_STREAM
from agentlog.gateway.http.replies import reply
from agentlog.gateway.http.requests import services
from agentlog.gateway.http.routing import Route
from agentlog.gateway.operations.services import Services
from agentlog.runtime import mcp_health
from agentlog.runtime.workers import COMMANDS_STREAM

#: Bound of the lag probe, so a health check never hangs on a dead server.
PROBE_TIMEOUT = 2.0
#: Commits the views may be behind the log before `/health` says degraded (a burst of writes
#: is applied within a batch or two; a lag this large means the runner is not keeping up).
DEGRADED_LAG = 1000


async def _lag(svc: Services) -> int | None:
    try:
        return await asyncio.wait_for(svc.runner.lag(), PROBE_TIMEOUT)
    except Exception:  # noqa: BLE001 - unknown lag is reported as null, the reason is NATS state
        return None


#: Streams whose writes the deployment depends on: the log and the command queue.
WRITTEN_STREAMS = (EVENTS_STREAM, COMMANDS_STREAM)


async def write_problems(svc: Services) -> list[dict[str, str]]:
    """Why writes to the log fail or would fail now: this process's last writes failed
    (`agentlog.eventlog.write_health`), or a stream it writes to is at a `discard: new` limit (which
    a process that writes nothing meanwhile would not see). Empty when writes go through."""
    reasons: list[dict[str, str]] = []
    writes = getattr(svc.store, "writes", None)
    problem = writes.problem() if writes is not None else None
    if problem is not None:
        reasons.append({"code": "log_writes_failing", "detail": problem})
    stream_full = getattr(svc.store, "stream_full", None)
    if stream_full is not None:
        for name in WRITTEN_STREAMS:
            try:
                full = await asyncio.wait_for(stream_full(name), PROBE_TIMEOUT)
            except Exception:  # noqa: BLE001 - unknown is not degraded; NATS state says the rest
                continue
            if full is not None:
                reasons.append({"code": "log_stream_full", "detail": full})
    return reasons


def degraded_reasons(svc: Services, lag: int) -> list[dict[str, str]]:
    """Why a connected process serves in a degraded way (empty: it does not)."""
    runner = svc.runner
    reasons = []
    if getattr(runner, "catching_up", False):
        reasons.append({"code": "projection_catching_up",
                        "detail": f"the views are catching up on the log ({lag} commits behind)"})
    elif lag > DEGRADED_LAG:
        reasons.append({"code": "projection_lag", "detail": f"the views are {lag} commits behind the log"})
    failing = getattr(runner, "failing", None)
    if failing:
        reasons.append({"code": "projection_failing", "detail": f"the views' last batch failed: {failing}"})
    return reasons


async def health(request: web.Request) -> web.Response:
    """`ok`; `degraded` (200: reads are served, writes fail, `reasons` says why); `unavailable`
    (503: NATS unreachable or the projection lag unknown)."""
    svc = services(request)
    connected = bool(svc.store.nc.is_connected)
    lag = await _lag(svc) if connected else None
    applied = svc.runner.applied_seq
    svc.metrics.projection_applied.set(applied)
    if lag is not None:
        svc.metrics.projection_lag.set(lag)
    ok = connected and lag is not None
    reasons = degraded_reasons(svc, lag) + await write_problems(svc) if ok and lag is not None else []
    mcp = mcp_health()
    reasons += [{"code": "mcp_server_down", "detail": f"MCP server {name!r} is {h['status']}: {h['last_error']}"}
                for name, h in mcp.items() if h["status"] != "ok"]
    body: dict[str, Any] = {
        "status": ("degraded" if reasons else "ok") if ok else "unavailable",
        "reasons": reasons,
        "nats": {"connected": connected},
        "projection": {"applied_seq": applied, "lag": lag,
                       "catching_up": bool(getattr(svc.runner, "catching_up", False)),
                       "writer": bool(getattr(svc.runner, "writer", True))},
    }
    if mcp:
        body["mcp"] = mcp
    return reply(body, status=200 if ok else 503)


async def live(request: web.Request) -> web.Response:
    return reply({"status": "ok"})


async def metrics(request: web.Request) -> web.Response:
    svc = services(request)
    svc.metrics.projection_applied.set(svc.runner.applied_seq)
    if svc.store.nc.is_connected:
        lag = await _lag(svc)
        if lag is not None:
            svc.metrics.projection_lag.set(lag)
    response = web.Response(body=svc.metrics.render())
    response.headers["Content-Type"] = svc.metrics.content_type
    return response


_HEALTH = {"type": "object", "properties": {
    "status": {"type": "string", "enum": ["ok", "degraded", "unavailable"]},
    "reasons": {"type": "array", "items": {"type": "object", "properties": {
        "code": {"type": "string"}, "detail": {"type": "string"}}}},
    "mcp": {"type": "object", "additionalProperties": {"type": "object", "properties": {
        "status": {"type": "string"}, "restarts": {"type": "integer"}, "last_error": {"type": ["string", "null"]}}}},
    "nats": {"type": "object", "properties": {"connected": {"type": "boolean"}}},
    "projection": {"type": "object", "properties": {"applied_seq": {"type": "integer"},
                                                    "lag": {"type": ["integer", "null"]},
                                                    "catching_up": {"type": "boolean"},
                                                    "writer": {"type": "boolean"}}},
}}

ROUTES: list[Route] = [
    Route("GET", "/health", health, "Readiness: ok, degraded (with reasons) or unavailable", "health",
          response=_HEALTH, auth=False, errors=(503,)),
    Route("GET", "/health/live", live, "Liveness", "health",
          response={"type": "object", "properties": {"status": {"type": "string"}}}, auth=False),
    Route("GET", "/metrics", metrics, "Prometheus metrics", "health", content_type="text/plain", auth=False),
]

__all__ = ["DEGRADED_LAG", "ROUTES", "degraded_reasons"]
