"""The gateway's limit on concurrent HTTP requests (`--max-concurrent-requests`,
`AGENTLOG_MAX_CONCURRENT_REQUESTS`): a request beyond it is answered at once with 503 and code
`overloaded`, with `Retry-After`, instead of queueing until every client times out.

A request counts from its arrival until its answer is complete: an SSE stream holds its place
for as long as it is open. Health, liveness and metrics (`EXEMPT`) and CORS preflights are never
counted nor refused: an overloaded gateway must still say it is alive, and be measured.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from agentlog.gateway.operations.errors import error_body

#: Paths the limit never applies to.
EXEMPT = frozenset({"/health", "/health/live", "/metrics"})
#: Seconds a refused client is told to wait (`Retry-After`).
RETRY_AFTER_S = 1

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ConcurrencyLimit:
    """Counts the requests in flight; `middleware` refuses those over `limit` (None: no limit)."""

    def __init__(self, limit: int | None) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"the concurrent request limit must be at least 1, not {limit}")
        self.limit = limit
        self.in_flight = 0
        #: Requests refused so far (for metrics and tests).
        self.refused = 0

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.limit is None or request.path in EXEMPT or request.method == "OPTIONS":
            return await handler(request)
        if self.in_flight >= self.limit:
            self.refused += 1
            body = error_body(f"the gateway is at its limit of {self.limit} concurrent requests; retry shortly",
                              "overloaded")
            return web.json_response(body, status=503, headers={"Retry-After": str(RETRY_AFTER_S)})
        self.in_flight += 1
        try:
            return await handler(request)
        finally:
            self.in_flight -= 1


__all__ = ["EXEMPT", "RETRY_AFTER_S", "ConcurrencyLimit"]
