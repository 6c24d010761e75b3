"""What a handler reads off an aiohttp request: the services its app was built with
(`services(request)`, set on the app under `SERVICES`) and the caller (`principal(request)`, set by
`auth_middleware`).

What the services are and the reads every route needs are `agentlog.gateway.operations.services`;
the tokens, the principal and the authenticator are `agentlog.gateway.operations.auth`, shared
with the NATS service. Only the aiohttp side lives here.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Middleware

from agentlog.gateway.http.errors import Handler
from agentlog.gateway.operations.auth import OPEN, Authenticator, Principal
from agentlog.gateway.operations.services import Services

SERVICES = web.AppKey("agentlog.services", Services)

PRINCIPAL_KEY = web.RequestKey("agentlog.principal", Principal)

#: The app's `Authenticator`, for routes that describe their own auth (the A2A agent card).
AUTHENTICATOR = web.AppKey("agentlog.authenticator", Authenticator)


def services(request: web.Request) -> Services:
    return request.app[SERVICES]


def principal(request: web.Request) -> Principal:
    return request.get(PRINCIPAL_KEY, OPEN)


def auth_middleware(auth: Authenticator) -> Middleware:
    """Bearer-token auth on HTTP: the caller's `Principal` on every /v1 and A2A request."""

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


__all__ = ["AUTHENTICATOR", "PRINCIPAL_KEY", "SERVICES", "auth_middleware", "principal", "services"]
