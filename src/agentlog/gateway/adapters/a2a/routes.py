"""The A2A server mounted on the gateway's aiohttp app.

    GET  /.well-known/agent-card.json             the default agent's card
    GET  /a2a/{agent_id}/.well-known/agent-card.json   an agent's card
    POST /a2a/{agent_id}                          A2A JSON-RPC (SendMessage, SendStreamingMessage,
                                                  GetTask, CancelTask, SubscribeToTask)

The JSON-RPC endpoint is the a2a-sdk's own `JsonRpcDispatcher` (Starlette) over our
`RunTaskHandler`, served through a small ASGI bridge (`asgi.serve_asgi`), so request parsing,
protocol-version checks, error codes and SSE framing are the SDK's.

The card is public (no token: a client reads it to learn how to authenticate), so it shows only
what an operator chose to publish: the agent's `description` (never its system prompt, which
holds instructions and often internal details), and URLs on the configured public base URL or
the listen address (`agentlog.gateway.http.urls`), never on the request's `Host` header.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from agentlog.gateway.adapters.a2a.asgi import serve_asgi
from agentlog.gateway.http.errors import ApiError
from agentlog.gateway.http.requests import AUTHENTICATOR, principal, services
from agentlog.gateway.http.routing import Route
from agentlog.gateway.http.urls import listen_base_url
from agentlog.gateway.operations.dispatch import Dispatcher
from agentlog.gateway.operations.json_input import InvalidJson, parse_json
from agentlog.gateway.operations.services import Services

if TYPE_CHECKING:
    from agentlog.gateway.adapters.a2a.push import PushConfigs

#: JSON-RPC 2.0 "Parse error": the answer to a body that is not JSON we take (`agentlog.gateway.operations.json_input`).
JSONRPC_PARSE_ERROR = -32700


#: The card's name for the gateway's bearer tokens (`AGENTLOG_TOKENS`).
BEARER_SCHEME = "bearer"


def agent_card(spec: Any, url: str, *, bearer: bool = False, extended: bool = False, push: bool = False) -> Any:
    """The A2A card of an agent (`AgentSpec`), served at `url` over JSON-RPC. `bearer`: the
    endpoint wants `Authorization: Bearer <token>` (the gateway has tokens), which the card
    declares so that a client knows before its first call is refused. `extended`: the card for
    an authenticated caller (GetExtendedAgentCard), with a skill per tool of the agent. `push`: the
    gateway delivers push notifications (`push.PushDelivery`)."""
    from a2a.types.a2a_pb2 import (
        AgentCapabilities,
        AgentCard,
        AgentInterface,
        AgentSkill,
        HTTPAuthSecurityScheme,
        SecurityRequirement,
        SecurityScheme,
        StringList,
    )

    description = spec.description or f"agentlog agent {spec.id}"
    security: dict[str, Any] = {}
    if bearer:
        security = {
            "security_schemes": {BEARER_SCHEME: SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(
                scheme="Bearer", description="an agentlog gateway token (AGENTLOG_TOKENS); a tenant-scoped "
                                             "token sees and starts its tenant's tasks only"))},
            "security_requirements": [SecurityRequirement(schemes={BEARER_SCHEME: StringList()})],
        }
    return AgentCard(
        name=spec.id, description=description, version="1.0.0",
        supported_interfaces=[AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=True, push_notifications=push, extended_agent_card=True),
        default_input_modes=["text/plain", "application/json"], default_output_modes=["text/plain"],
        skills=[AgentSkill(id=spec.id, name=spec.id, description=description, tags=["agentlog"])] + (
            [AgentSkill(id=f"{spec.id}.{name}", name=name, description=f"the agent's tool {name}", tags=["tool"])
             for name in (str(getattr(t, "name", t)) for t in (spec.tools or ()))] if extended else []),
        **security,
    )


def a2a_routes(dispatcher: Dispatcher, agents: Callable[[], Mapping[str, Any]], default_agent: str | None = None,
               *, public_url: str | None = None, push: PushConfigs | None = None) -> list[Route]:
    """Routes of the A2A server; `agents()` gives the agents served (id -> AgentSpec).
    `public_url`: the base of the card's URLs (`agentlog.gateway.http.urls.public_base_url`); None: the
    listen address of the socket each request came in on."""

    #: One SDK JSON-RPC app per (store, agent), built on first use.
    apps: dict[tuple[int, str], Any] = {}

    def spec_of(agent_id: str) -> Any:
        spec = agents().get(agent_id)
        if spec is None:
            raise ApiError(404, "agent_not_found", f"unknown agent {agent_id!r}")
        return spec

    def base(request: web.Request) -> str:
        return public_url or listen_base_url(request)

    async def card(request: web.Request) -> web.Response:
        from a2a.server.request_handlers.response_helpers import agent_card_to_dict

        agent_id = request.match_info.get("agent_id") or default_agent or next(iter(agents()), None)
        if agent_id is None:
            raise ApiError(404, "agent_not_found", "no agent to describe")
        spec = spec_of(agent_id)
        bearer = request.app[AUTHENTICATOR].enabled
        card = agent_card(spec, f"{base(request)}/a2a/{spec.id}", bearer=bearer, push=push is not None)
        return web.json_response(agent_card_to_dict(card))

    async def rpc(request: web.Request) -> web.StreamResponse:
        agent_id = request.match_info["agent_id"]
        spec_of(agent_id)
        try:  # the project's one request decoder first: the SDK's parser recurses (RecursionError
            parse_json(await request.read())  # on deep nesting became -32603 "internal error")
        except InvalidJson as exc:
            return web.json_response({"jsonrpc": "2.0", "id": None, "error": {
                "code": JSONRPC_PARSE_ERROR, "message": str(exc), "data": {"code": exc.code}}})
        svc = services(request)
        app = apps.get((id(svc.store), agent_id))
        if app is None:
            spec, bearer, url = spec_of(agent_id), request.app[AUTHENTICATOR].enabled, f"{base(request)}/a2a/{agent_id}"
            app = apps[(id(svc.store), agent_id)] = _jsonrpc_app(
                agent_id, dispatcher, svc, lambda: agent_card(spec, url, bearer=bearer, extended=True, push=push is not None), push)
        return await serve_asgi(app, request, {PRINCIPAL_SCOPE: principal(request)})

    return [
        Route("GET", "/.well-known/agent-card.json", card, "A2A agent card (default agent)", "a2a",
              response={"type": "object"}, auth=False),
        Route("GET", "/a2a/{agent_id}/.well-known/agent-card.json", card, "A2A agent card", "a2a",
              response={"type": "object"}, auth=False),
        Route("POST", "/a2a/{agent_id}", rpc, "A2A JSON-RPC endpoint of an agent", "a2a",
              response={"type": "object"}),
    ]


#: Where the route puts the caller (`agentlog.gateway.operations.auth.Principal`) in the ASGI scope.
PRINCIPAL_SCOPE = "agentlog.principal"


def _jsonrpc_app(agent_id: str, dispatcher: Dispatcher, svc: Services, extended_card: Callable[[], Any],
                 push: PushConfigs | None) -> Any:
    from a2a.server.routes.common import DefaultServerCallContextBuilder
    from a2a.server.routes.jsonrpc_routes import create_jsonrpc_routes
    from starlette.applications import Starlette

    from agentlog.gateway.adapters.a2a.handler import PRINCIPAL_STATE, RunTaskHandler

    class WithCaller(DefaultServerCallContextBuilder):
        """The SDK's call context plus the caller the gateway authenticated."""

        def build(self, request: Any) -> Any:
            context = super().build(request)
            context.state[PRINCIPAL_STATE] = request.scope.get(PRINCIPAL_SCOPE)
            return context

    handler = RunTaskHandler(agent_id, dispatcher, svc.store, services=svc, extended_card=extended_card, push=push)
    return Starlette(routes=create_jsonrpc_routes(handler, rpc_url=f"/a2a/{agent_id}", context_builder=WithCaller()))


def available() -> bool:
    """Is the `a2a` extra installed? Looked up, not imported: the SDK's server modules cost a
    process more CPU at start than the rest of the gateway, and they are first needed by the
    first A2A request (`_jsonrpc_app`)."""
    try:
        return all(importlib.util.find_spec(name) is not None for name in ("a2a.server.routes", "starlette"))
    except ImportError:  # no `a2a` package at all
        return False
