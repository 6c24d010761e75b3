"""CORS for browser clients (the official AG-UI / AI SDK clients run in a page on another origin).

Allowed origins come from `Settings.cors_origins` (default: `AGENTLOG_CORS_ORIGINS`, a comma
separated list, `*` for any origin; empty: no CORS headers at all, the safe default).

Why two hooks: a preflight (`OPTIONS` with `Access-Control-Request-Method`) carries no
`Authorization` and has no route, so a middleware placed OUTSIDE auth and routing answers it
(204) itself; the headers of real answers are added in `on_response_prepare`, because SSE
answers are `StreamResponse`s whose headers are sent before a middleware would see them.
A request from an origin not in the list gets no CORS headers (the browser then blocks it).
"""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import web

from agentlog.gateway.http.errors import Handler
from agentlog.gateway.operations.services import CORS_ENV, parse_origins
from agentlog.gateway.operations.services import cors_origins_from_env as origins_from_env

ALLOW_METHODS = "GET, POST, PATCH, DELETE, OPTIONS"
ALLOW_HEADERS = "Authorization, Content-Type, Accept, Last-Event-ID"
EXPOSE_HEADERS = "x-vercel-ai-ui-message-stream, Location"
MAX_AGE = "600"


class Cors:
    def __init__(self, origins: Iterable[str]) -> None:
        self.origins = frozenset(origins)
        self.any = "*" in self.origins

    def allowed(self, origin: str | None) -> str | None:
        """The `Access-Control-Allow-Origin` value for `origin`, or None (not allowed)."""
        if not origin:
            return None
        if self.any or origin.rstrip("/") in self.origins:
            return origin
        return None

    @web.middleware
    async def preflight(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            origin = self.allowed(request.headers.get("Origin"))
            if origin is None:
                return web.Response(status=403, text="origin not allowed")
            asked = request.headers.get("Access-Control-Request-Headers")
            return web.Response(status=204, headers={
                "Access-Control-Allow-Origin": origin,
                "Access-Control-Allow-Methods": ALLOW_METHODS,
                "Access-Control-Allow-Headers": asked or ALLOW_HEADERS,
                "Access-Control-Max-Age": MAX_AGE,
                "Vary": "Origin, Access-Control-Request-Headers",
            })
        return await handler(request)

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        origin = self.allowed(request.headers.get("Origin"))
        if origin is not None:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Expose-Headers"] = EXPOSE_HEADERS
            response.headers.add("Vary", "Origin")


def install(app: web.Application, origins: Iterable[str]) -> Cors | None:
    """Add CORS to `app` (call before the app is frozen); nothing when `origins` is empty."""
    cors = Cors(origins)
    if not cors.origins:
        return None
    app.middlewares.insert(0, cors.preflight)
    app.on_response_prepare.append(cors.on_prepare)
    return cors


__all__ = ["CORS_ENV", "Cors", "install", "origins_from_env", "parse_origins"]
