"""`GET /v1/ops/queue`: the operations view of the inspector (`agentlog.gateway.operations.monitoring`): the command
queue, the workers' consumer and the newest dead letters.

Cross-tenant by nature (one queue serves every tenant, and a dead letter names any thread), so a
tenant-scoped token gets 403 `tenant_scoped_token`; an unscoped token (or none, without
`AGENTLOG_TOKENS`) reads it."""

from __future__ import annotations

from aiohttp import web

from agentlog.gateway.http.errors import ApiError
from agentlog.gateway.http.replies import reply
from agentlog.gateway.http.requests import principal, services
from agentlog.gateway.http.routing import Route
from agentlog.gateway.operations.monitoring import queue_report
from agentlog.gateway.operations.services import wait_min_seq


async def ops_queue(request: web.Request) -> web.Response:
    if principal(request).tenant is not None:
        raise ApiError(403, "tenant_scoped_token",
                       "the queue and dead letters span every tenant: they need an unscoped token")
    svc = services(request)
    await wait_min_seq(svc, None)  # 503 at once when NATS is down
    return reply(await queue_report(svc.store.nc.jetstream()))


_COUNTS = {"type": ["object", "null"]}
_QUEUE = {"type": "object", "required": ["commands", "workers", "dead_letters"], "properties": {
    "commands": {**_COUNTS, "description": "the AGENTLOG_COMMANDS work queue (null: nothing ever queued)",
                 "properties": {"stream": {"type": "string"}, "queued": {"type": "integer"},
                                "first_seq": {"type": "integer"}, "last_seq": {"type": "integer"}}},
    "workers": {**_COUNTS, "description": "the workers' shared consumer (null: no worker ever started)",
                "properties": {"consumer": {"type": "string"}, "open_pull_requests": {"type": "integer"},
                               "in_progress": {"type": "integer"}, "pending": {"type": "integer"},
                               "redelivered": {"type": "integer"}, "last_delivered": {"type": ["integer", "null"]}}},
    "dead_letters": {**_COUNTS, "description": "AGENTLOG_DLQ: commands given up on, newest first",
                     "properties": {"stream": {"type": "string"}, "count": {"type": "integer"},
                                    "recent": {"type": "array", "items": {"type": "object"}}}},
}}

ROUTES: list[Route] = [
    Route("GET", "/v1/ops/queue", ops_queue,
          "Operations: the command queue, the workers' consumer and the newest dead letters (unscoped tokens)",
          "ops", response=_QUEUE, errors=(403,)),
]

__all__ = ["ROUTES"]
