"""A real MCP server for the MCP client tests, written with the official SDK's server API.

    python tests/fakes/mcp_server.py stdio
    python tests/fakes/mcp_server.py http           # streamable HTTP on 127.0.0.1:<port>/mcp

In `http` mode the server binds a free port itself and prints it (one line on stdout) once the
socket listens: a test reads that line instead of picking a port that another process may take
before the server binds it.

Tools: `add` (structured result), `count` (reports MCP progress per step), `fail` (an MCP tool
error), `shout` (text content), `unlock` (adds the tool `later` at run time, for the
`tools/list` refresh test), `crash` (the server process exits mid-call), `hang` (never answers),
`pid` (which server process answered: a restarted one has another).

`MCP_TEST_SLOW_LISTEN=<seconds>` holds each `subscriptions/listen` request that long before it is
served, as a busy server may: a client that counts its session ready before the listen stream
is acknowledged misses a change made in the meantime.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from typing import Any

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("agentlog-test")


@server.tool()
def add(a: int, b: int) -> dict[str, int]:
    """Add two integers."""
    return {"sum": a + b}


@server.tool()
async def count(n: int, ctx: Context) -> str:
    """Count to n, reporting progress at each step."""
    for i in range(1, n + 1):
        await ctx.report_progress(i, n, f"step {i}")
    return f"counted to {n}"


@server.tool()
def fail(reason: str) -> str:
    """Always fails."""
    raise ValueError(reason)


@server.tool()
def shout(text: str) -> str:
    """Upper-case the text."""
    return text.upper()


def later() -> str:
    """Added at run time by `unlock`."""
    return "late"


def quiet() -> str:
    """Added at run time by `unlock(quietly=True)`."""
    return "quiet"


@server.tool()
async def unlock(ctx: Context, quietly: bool = False) -> str:
    """Add the tool `later` to this server and say the tool list changed (to `listen` streams on
    2026-07-28 sessions, as `notifications/tools/list_changed` before); `quietly`: add `quiet`
    and tell no one (only a periodic `tools/list` finds it)."""
    if quietly:
        server.add_tool(quiet)
        return "unlocked"
    server.add_tool(later)
    await ctx.notify_tools_changed()
    try:
        await ctx.request_context.session.send_tool_list_changed()
    except Exception:  # noqa: BLE001 - a session without a back-channel has the listen stream
        pass
    return "unlocked"


@server.resource("notes://release", name="release-notes", description="The release notes")
def release_notes() -> str:
    return "1.4.2: faster resume"


@server.prompt(description="Ask for a review of a file")
def review(path: str) -> str:
    return f"Please review {path}."


@server.tool()
def crash() -> str:
    """Exit this server process at once, mid-call."""
    os._exit(3)


@server.tool()
async def hang() -> str:
    """Never answer."""
    await asyncio.Event().wait()
    return "unreachable"


@server.tool()
def pid() -> int:
    """The id of the server process answering."""
    return os.getpid()


async def _slow_listen(ctx: Any, call_next: Any) -> Any:
    if ctx.method == "subscriptions/listen":
        await asyncio.sleep(float(os.environ["MCP_TEST_SLOW_LISTEN"]))
    return await call_next(ctx)


if os.environ.get("MCP_TEST_SLOW_LISTEN"):
    server.middleware.append(_slow_listen)


def serve_http() -> None:
    """Streamable HTTP on a port the kernel picks, reported on stdout once connections queue."""
    import uvicorn

    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)
    app = server.streamable_http_app(host="127.0.0.1")
    asyncio.run(uvicorn.Server(uvicorn.Config(app, log_level="warning")).serve(sockets=[listener]))


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run()
    else:
        serve_http()
