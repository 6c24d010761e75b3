"""The MCP server (`mcp_server`) on the gateway: streamable HTTP at `/v1/mcp`.

The SDK's `StreamableHTTPSessionManager` (sessions for handshake-era clients, per-request
handling for the 2026-07-28 protocol) served through the ASGI bridge (`a2a.asgi.serve_asgi`), so
framing, session ids and protocol-version checks are the SDK's. The gateway's bearer auth runs
first (an ordinary route); the caller goes to the tool handlers in the ASGI scope, so a tenant
token sees and starts only its tenant's runs.

The manager's task group must live as long as the app and be entered and left in one task: it
runs in a task of its own, started at the first request and stopped when the app shuts down.
The MCP SDK is imported then too: importing it costs a process more CPU than the rest of the
gateway's start, and most gateways never see an MCP client.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from aiohttp import web

from agentlog.gateway.adapters import session
from agentlog.gateway.adapters.a2a.asgi import serve_asgi
from agentlog.gateway.http.requests import principal
from agentlog.gateway.http.routing import Route

PATH = "/v1/mcp"


class McpEndpoint:
    """`/v1/mcp` for the agents of `catalog()` over `backend`."""

    def __init__(self, backend: session.Backend, catalog: Callable[[], list[dict[str, Any]]]) -> None:
        self.backend = backend
        self.catalog = catalog
        self._manager: Any = None
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()

    async def _started(self) -> Any:
        async with self._lock:
            if self._task is None:
                from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

                from agentlog.gateway.adapters.mcp.agent_tools import build_server

                self._manager = StreamableHTTPSessionManager(build_server(self.backend, self.catalog))
                self._task = asyncio.create_task(self._hold(), name="agentlog-mcp-sessions")
            await self._ready.wait()
            return self._manager

    async def _hold(self) -> None:
        try:
            async with self._manager.run():
                self._ready.set()
                await self._stop.wait()
        finally:
            self._ready.set()  # a failed start must not leave requests waiting

    async def handle(self, request: web.Request) -> web.StreamResponse:
        from agentlog.gateway.adapters.mcp.agent_tools import PRINCIPAL_SCOPE_KEY

        manager = await self._started()
        return await serve_asgi(manager.handle_request, request, {PRINCIPAL_SCOPE_KEY: principal(request)})

    async def close(self, _app: Any = None) -> None:
        """Stop the sessions (open streams end): the app's on_shutdown."""
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._task, 10)
            self._task = None

    def routes(self) -> list[Route]:
        summary = ("MCP (streamable HTTP): the agents as MCP tools; POST JSON-RPC, GET the server's stream, "
                   "DELETE ends a session")
        return [Route(method, PATH, self.handle, summary, "mcp", content_type="text/event-stream")
                for method in ("POST", "GET", "DELETE")]


__all__ = ["PATH", "McpEndpoint"]
