"""MCP client tools: the tools of Model Context Protocol servers as ordinary agentlog tools.

An `McpToolset` connects to MCP servers (stdio subprocesses or streamable-HTTP URLs, with the
official `mcp` package), lists their tools and exposes each as a `Tool` named
`mcp__<server>__<tool>`. To the loop these are plain tools: they go through the same gate,
permission rules and HITL suspension as any other, their results are recorded in
`ToolCallCompleted` (so verified replay can answer them from the log), and MCP progress
notifications become live `tool_progress` messages through `ToolContext.progress`.

Why the sessions live on their own thread and event loop: an MCP client session is a stack of
anyio cancel scopes that must be entered and left by one task. A run's tasks come and go (and
get cancelled) with the run, and the `--app`/`--config` loaders are synchronous, so the sessions
are owned by one background thread that outlives them all; calls hop onto it and back
(`asyncio.wrap_future`), and progress hops back onto the calling loop.
"""

from __future__ import annotations

import asyncio
import re
import sys
import threading
from collections.abc import Callable, Coroutine, Iterable
from concurrent.futures import Future
from contextlib import AsyncExitStack
from typing import Any

import pydantic

from agentlog.log.errors import AgentlogError
from agentlog.log.ids import validate_id

from .tools import InvalidToolArguments, Tool, ToolContext, ToolRegistry, ToolResult

__all__ = ["McpError", "McpServerConfig", "McpTool", "McpToolset", "mcp_tool_name"]

_SERVER_NAME = re.compile(r"^[A-Za-z0-9-]{1,40}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


class McpError(AgentlogError):
    """An MCP server could not be reached, listed or called (not a tool's own error result)."""

    code = "mcp_error"


class McpServerConfig(pydantic.BaseModel):
    """One MCP server: a stdio `command` (+ args, env, cwd) or a streamable-HTTP `url`."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    #: The `<server>` part of tool ids: letters, digits, `-` (no `_`, so `mcp__a__b` splits one way).
    name: str
    command: str | None = None
    args: list[str] = []
    env: dict[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    #: Only these of the server's tools (by their MCP name); all when empty.
    tools: list[str] = []
    #: Seconds to wait for the connection, a listing or one call.
    timeout_s: float = pydantic.Field(default=30.0, gt=0)

    @pydantic.field_validator("name")
    @classmethod
    def _name_is_token(cls, v: str) -> str:
        if not _SERVER_NAME.match(v):
            raise ValueError(f"MCP server name {v!r} must match [A-Za-z0-9-]{{1,40}}")
        return v

    @pydantic.model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError(f"MCP server {self.name!r}: give exactly one of `command` (stdio) or `url` (HTTP)")
        return self


def _describe(exc: BaseException) -> str:
    """`Type: message` of the first leaf of an exception group (anyio task groups wrap the
    transport's real error in one), so the message says what actually failed."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


def mcp_tool_name(server: str, tool: str) -> str:
    """`mcp__<server>__<tool>`, with characters outside the id alphabet replaced by `_`."""
    return validate_id(f"mcp__{server}__{_UNSAFE.sub('_', tool)}"[:128], "MCP tool id")


def _result(res: Any) -> ToolResult:
    """An MCP `CallToolResult` as a `ToolResult`: structured content when the server gives it,
    else the text blocks (other blocks as their JSON); `is_error` -> an error result."""
    parts = [b.text if getattr(b, "type", None) == "text" else b.model_dump(mode="json") for b in res.content]
    text = "\n".join(p if isinstance(p, str) else str(p) for p in parts)
    if res.is_error:
        return ToolResult.failure(text or "MCP tool error")
    if res.structured_content is not None:
        return ToolResult.success(res.structured_content)
    if all(isinstance(p, str) for p in parts):
        return ToolResult.success(text)
    return ToolResult.success(parts)


class _RemoteArgs(pydantic.BaseModel):
    """Placeholder argument model: a remote tool's arguments are checked by its JSON Schema."""

    model_config = pydantic.ConfigDict(extra="allow")


def _not_local(**_: Any) -> None:
    raise RuntimeError("an MCP tool runs on its server (McpTool.invoke)")


class McpTool(Tool):
    """One remote MCP tool. Arguments are checked against the server's `inputSchema` (JSON
    Schema) before the call, like a local tool's are against its pydantic model."""

    def __init__(self, toolset: McpToolset, server: str, remote: Any) -> None:
        super().__init__(mcp_tool_name(server, remote.name), remote.description or "", _RemoteArgs,
                         _not_local, None)
        schema = dict(remote.input_schema or {"type": "object"})
        schema.pop("title", None)
        self.parameters = schema  # the server's inputSchema is what the model sees
        self.is_async = True
        self.server = server
        self.remote_name: str = remote.name
        self._toolset = toolset
        import jsonschema

        self._validator = jsonschema.Draft202012Validator(schema)

    def validate(self, arguments: Any) -> dict[str, Any]:
        if not isinstance(arguments, dict):
            raise InvalidToolArguments(self.name, [{"loc": (), "msg": "arguments must be a JSON object"}])
        errors = [{"loc": tuple(e.absolute_path), "msg": e.message} for e in self._validator.iter_errors(arguments)]
        if errors:
            raise InvalidToolArguments(self.name, errors)
        return dict(arguments)

    async def invoke(self, arguments: Any, ctx: ToolContext) -> ToolResult:
        args = self.validate(arguments)
        loop = asyncio.get_running_loop()

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            data = {"progress": progress, "total": total, "message": message}
            loop.call_soon_threadsafe(ctx.progress, data)

        try:
            res = await self._toolset.call(self.server, self.remote_name, args, on_progress)
        except McpError as exc:
            return ToolResult.failure(str(exc))
        return _result(res)


class _Connection:
    """One open MCP client session (lives on the toolset's thread)."""

    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self.stack = AsyncExitStack()
        self.client: Any = None

    async def open(self) -> None:
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters, stdio_client

        c = self.config
        if c.command is not None:
            params = StdioServerParameters(command=c.command, args=list(c.args), env=c.env, cwd=c.cwd)
            target: Any = stdio_client(params, errlog=sys.stderr)
        else:
            target = c.url
        client = Client(target, read_timeout_seconds=c.timeout_s)
        self.client = await self.stack.enter_async_context(client)

    async def list(self, refresh: bool) -> list[Any]:
        tools: list[Any] = []
        cursor = None
        while True:
            page = await self.client.list_tools(cursor=cursor, cache_mode="refresh" if refresh else "use")
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        wanted = set(self.config.tools)
        return [t for t in tools if not wanted or t.name in wanted]


class McpToolset:
    """The tools of one or more MCP servers, kept open on a background thread.

    `toolset = McpToolset([McpServerConfig(...)]).start()` connects and lists (blocking, bounded
    by each server's `timeout_s`); `await toolset.astart()` does the same from async code.
    `toolset.tools` are the `McpTool`s; `register(registry)` adds them to a `ToolRegistry`;
    `await refresh()` re-lists (`tools/list`) and updates the tools in place; `close()` ends the
    sessions (stdio servers exit).
    """

    def __init__(self, servers: Iterable[McpServerConfig]) -> None:
        self.servers = {s.name: s for s in servers}
        self._connections: dict[str, _Connection] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tools: dict[str, McpTool] = {}
        self._registries: list[ToolRegistry] = []

    # -- the background loop ---------------------------------------------------------------------

    def _submit(self, coro: Coroutine[Any, Any, Any]) -> Future[Any]:
        if self._loop is None:
            ready = threading.Event()

            def main() -> None:
                self._loop = asyncio.new_event_loop()
                ready.set()
                self._loop.run_forever()

            self._thread = threading.Thread(target=main, name="agentlog-mcp", daemon=True)
            self._thread.start()
            ready.wait()
        assert self._loop is not None  # set by the loop's thread before `ready`
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _timeout(self) -> float:
        return max((s.timeout_s for s in self.servers.values()), default=30.0)

    # -- lifecycle -------------------------------------------------------------------------------

    async def _open_all(self) -> None:
        for name, config in self.servers.items():
            if name in self._connections:
                continue
            conn = _Connection(config)
            try:
                await asyncio.wait_for(conn.open(), config.timeout_s)
            except Exception as exc:  # noqa: BLE001 - any transport failure is one typed error
                await conn.stack.aclose()
                raise McpError(f"MCP server {name!r}: could not connect: {_describe(exc)}") from None
            self._connections[name] = conn
        await self._list_all(refresh=False)

    async def _list_all(self, refresh: bool) -> None:
        tools: dict[str, McpTool] = {}
        for name, conn in self._connections.items():
            try:
                listed = await asyncio.wait_for(conn.list(refresh), conn.config.timeout_s)
            except Exception as exc:  # noqa: BLE001
                raise McpError(f"MCP server {name!r}: tools/list failed: {_describe(exc)}") from None
            for remote in listed:
                t = McpTool(self, name, remote)
                tools[t.name] = t
        self._tools = tools

    def start(self) -> McpToolset:
        """Connect to every server and list its tools (blocking). Raises `McpError`."""
        self._submit(self._open_all()).result(self._timeout() * (len(self.servers) + 1))
        return self

    async def astart(self) -> McpToolset:
        await asyncio.wrap_future(self._submit(self._open_all()))
        return self

    async def refresh(self) -> list[str]:
        """`tools/list` again on every server; registries given to `register` get new and
        changed tools (a tool a server dropped stays registered and fails when called).
        Returns the tool ids now listed."""
        await asyncio.wrap_future(self._submit(self._list_all(refresh=True)))
        for registry in self._registries:
            self._put(registry)
        return list(self._tools)

    async def _close_all(self) -> None:
        for conn in reversed(list(self._connections.values())):
            try:
                await conn.stack.aclose()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        self._connections.clear()

    def close(self) -> None:
        """End every session (stdio servers exit) and stop the thread."""
        if self._loop is None:
            return
        try:
            self._submit(self._close_all()).result(self._timeout())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(self._timeout())
            self._loop = None

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    # -- tools -----------------------------------------------------------------------------------

    @property
    def tools(self) -> list[McpTool]:
        return list(self._tools.values())

    def names(self, server: str | None = None) -> list[str]:
        return [n for n, t in self._tools.items() if server is None or t.server == server]

    def _put(self, registry: ToolRegistry) -> None:
        for t in self._tools.values():
            registry.replace(t)

    def register(self, registry: ToolRegistry) -> ToolRegistry:
        """Add the tools to `registry` (and keep it updated by `refresh`)."""
        self._put(registry)
        self._registries.append(registry)
        return registry

    async def call(self, server: str, tool: str, arguments: dict[str, Any],
                   on_progress: Callable[[float, float | None, str | None], Coroutine[Any, Any, None]]) -> Any:
        """`tools/call` on `server` (on the toolset's thread). Raises `McpError` for transport
        and protocol failures; a tool's own error comes back as a result with `is_error`."""
        conn = self._connections.get(server)
        if conn is None:
            raise McpError(f"MCP server {server!r} is not connected")

        async def call() -> Any:
            try:
                return await conn.client.call_tool(tool, arguments, progress_callback=on_progress)
            except Exception as exc:  # noqa: BLE001
                raise McpError(f"MCP server {server!r}: tools/call {tool!r} failed: {_describe(exc)}") from None

        return await asyncio.wrap_future(self._submit(call()))
