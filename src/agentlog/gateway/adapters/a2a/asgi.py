"""Serve an ASGI application (the a2a-sdk's Starlette JSON-RPC app) from an aiohttp handler.

Only what one HTTP request needs: the scope from the aiohttp request, the body as one
`http.request` message, `http.disconnect` once the aiohttp side is done, and the response
messages written to a `StreamResponse` as they come (so SSE streams flow).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web


async def serve_asgi(app: Any, request: web.Request, extra: dict[str, Any] | None = None) -> web.StreamResponse:
    """`extra`: entries added to the ASGI scope (what the app needs from the aiohttp side, e.g.
    the authenticated caller)."""
    body = await request.read()
    peer = request.transport.get_extra_info("peername") if request.transport else None
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": request.method, "scheme": request.scheme, "path": request.path,
        "raw_path": request.raw_path.split("?", 1)[0].encode(), "query_string": request.query_string.encode(),
        "root_path": "", "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in request.headers.items()],
        "client": tuple(peer[:2]) if peer else None, "server": tuple(sock[:2]) if sock else None,
        **(extra or {}),
    }
    done = asyncio.Event()
    sent_body = False
    response: web.StreamResponse | None = None

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal response
        if message["type"] == "http.response.start":
            response = web.StreamResponse(status=message["status"])
            for k, v in message.get("headers", []):
                name = k.decode("latin-1")
                if name.lower() not in ("content-length", "transfer-encoding"):
                    response.headers.add(name, v.decode("latin-1"))
            await response.prepare(request)
        elif message["type"] == "http.response.body" and response is not None:
            chunk = message.get("body", b"")
            if chunk:
                await response.write(chunk)
            if not message.get("more_body", False):
                await response.write_eof()
                done.set()

    try:
        await app(scope, receive, send)
    finally:
        done.set()
    if response is None:
        raise web.HTTPInternalServerError(text="the ASGI app sent no response")
    return response
