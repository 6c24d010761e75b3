"""Bearer-token auth on HTTP: the middleware that puts the caller's `Principal` on the request
(`agentlog.gateway.operations.auth` has the tokens, the principal and the authenticator; see there).
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Middleware

from agentlog.gateway.http.errors import Handler
from agentlog.gateway.operations.auth import (
    OPEN,
    TOKENS_ENV,
    Authenticator,
    Principal,
    parse_tokens,
    resolve_tokens,
)

PRINCIPAL_KEY = web.RequestKey("agentlog.principal", Principal)


def principal(request: web.Request) -> Principal:
    return request.get(PRINCIPAL_KEY, OPEN)


#: The app's `Authenticator`, for routes that describe their own auth (the A2A agent card).
AUTHENTICATOR = web.AppKey("agentlog.authenticator", Authenticator)


def auth_middleware(auth: Authenticator) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path.startswith("/v1/") or path == "/v1" or (
            # the A2A JSON-RPC endpoints (agentlog.gateway.adapters.a2a); agent cards stay public (discovery)
            path.startswith("/a2a/") and not path.endswith("/.well-known/agent-card.json")
        ):
            request[PRINCIPAL_KEY] = auth.authenticate(request.headers.get("Authorization"))
        return await handler(request)

    return middleware


__all__ = ["Authenticator", "OPEN", "Principal", "TOKENS_ENV", "auth_middleware", "parse_tokens",
           "principal", "resolve_tokens"]
