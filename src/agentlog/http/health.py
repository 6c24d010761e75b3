"""Health, liveness, metrics and the OpenAPI document: open routes (no token), for probes,
scrapers and clients discovering the API.

`/health/live` says the process answers (restart me if not); `/health` says it can serve
(NATS connected, projection lag known): 503 when NATS is unreachable so a load balancer stops
sending traffic that would only get 503s anyway; `degraded` (still 200: reads work) with
`reasons` when writes to the log fail (a full disk) and until they go through again, or when
an MCP server of this process is down (`mcp`: each server's status, reconnecting with backoff).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from agentlog.log.subjects import EVENTS_STREAM
from agentlog.runtime.commands import COMMANDS_STREAM
from agentlog.runtime.mcp import mcp_health

from .context import Services, services
from .replies import reply
from .routing import Route

#: Bound of the lag probe, so a health check never hangs on a dead server.
PROBE_TIMEOUT = 2.0


async def _lag(svc: Services) -> int | None:
    try:
        return await asyncio.wait_for(svc.runner.lag(), PROBE_TIMEOUT)
    except Exception:  # noqa: BLE001 - unknown lag is reported as null, the reason is NATS state
        return None


#: Streams whose writes the deployment depends on: the log and the command queue.
WRITTEN_STREAMS = (EVENTS_STREAM, COMMANDS_STREAM)


async def write_problems(svc: Services) -> list[str]:
    """Why writes to the log fail or would fail now: this process's last writes failed
    (`agentlog.log.write_health`), or a stream it writes to is at a `discard: new` limit (which
    a process that writes nothing meanwhile would not see). Empty when writes go through."""
    reasons: list[str] = []
    writes = getattr(svc.store, "writes", None)
    problem = writes.problem() if writes is not None else None
    if problem is not None:
        reasons.append(problem)
    stream_full = getattr(svc.store, "stream_full", None)
    if stream_full is not None:
        for name in WRITTEN_STREAMS:
            try:
                full = await asyncio.wait_for(stream_full(name), PROBE_TIMEOUT)
            except Exception:  # noqa: BLE001 - unknown is not degraded; NATS state says the rest
                continue
            if full is not None:
                reasons.append(full)
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
    reasons = await write_problems(svc) if ok else []
    mcp = mcp_health()
    reasons += [f"MCP server {name!r} is {h['status']}: {h['last_error']}"
                for name, h in mcp.items() if h["status"] != "ok"]
    body: dict[str, Any] = {
        "status": "unavailable" if not ok else "degraded" if reasons else "ok",
        "nats": {"connected": connected},
        "projection": {"applied_seq": applied, "lag": lag},
    }
    if mcp:
        body["mcp"] = mcp
    if reasons:
        body["reasons"] = reasons
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
    "reasons": {"type": "array", "items": {"type": "string"}},
    "mcp": {"type": "object", "additionalProperties": {"type": "object", "properties": {
        "status": {"type": "string"}, "restarts": {"type": "integer"}, "last_error": {"type": ["string", "null"]}}}},
    "nats": {"type": "object", "properties": {"connected": {"type": "boolean"}}},
    "projection": {"type": "object", "properties": {"applied_seq": {"type": "integer"},
                                                    "lag": {"type": ["integer", "null"]}}},
}}

ROUTES: list[Route] = [
    Route("GET", "/health", health, "Readiness: NATS connected and projection lag", "health",
          response=_HEALTH, auth=False, errors=(503,)),
    Route("GET", "/health/live", live, "Liveness", "health",
          response={"type": "object", "properties": {"status": {"type": "string"}}}, auth=False),
    Route("GET", "/metrics", metrics, "Prometheus metrics", "health", content_type="text/plain", auth=False),
]

__all__ = ["ROUTES"]
