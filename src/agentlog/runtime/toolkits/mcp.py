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
import logging
import re
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Coroutine, Iterable
from concurrent.futures import Future
from contextlib import AsyncExitStack
from typing import Any

import msgspec
import pydantic

from agentlog.eventlog.errors import AgentlogError
from agentlog.eventlog.ids import validate_id
from agentlog.runtime.tools import InvalidToolArguments, Tool, ToolContext, ToolRegistry, ToolResult

__all__ = ["McpError", "McpServerConfig", "McpTool", "McpToolset", "mcp_health", "mcp_tool_name"]

log = logging.getLogger("agentlog.mcp")

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
    #: Also give agents the server's resources (`mcp__<server>__read_resource`, by URI) and
    #: prompts (`mcp__<server>__get_prompt`, by name): ordinary tools, listed with the tools.
    resources: bool = False
    prompts: bool = False
    #: Seconds between `tools/list` refreshes (None: only when the server says its list changed).
    refresh_s: float | None = pydantic.Field(default=None, gt=0)

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
                         _not_local, None, category=f"mcp:{server}", label=getattr(remote, "title", None))
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
        return _validated(self.name, self._validator, arguments)

    async def invoke(self, arguments: Any, ctx: ToolContext) -> ToolResult:
        args = self.validate(arguments)
        loop = asyncio.get_running_loop()

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            data = {"progress": progress, "total": total, "message": message}
            loop.call_soon_threadsafe(ctx.progress, data)

        try:
            res = await self._toolset.call(self.server, self.remote_name, args, on_progress)
        except McpError as exc:
            return ToolResult.failure(str(exc), details=self._details)
        return msgspec.structs.replace(_result(res), details=self._details)

    @property
    def _details(self) -> dict[str, Any]:
        """Which server and remote tool answered (`ToolResult.details`, kept from the model)."""
        return {"mcp": {"server": self.server, "tool": self.remote_name}}


def _validated(name: str, validator: Any, arguments: Any) -> dict[str, Any]:
    """`arguments` checked against a JSON Schema validator (the server's `inputSchema`, or an op
    tool's parameters): a failed check names each field, like a local tool's."""
    if not isinstance(arguments, dict):
        raise InvalidToolArguments(name, [{"loc": (), "msg": "arguments must be a JSON object"}])
    errors = [{"loc": tuple(e.absolute_path), "msg": e.message} for e in validator.iter_errors(arguments)]
    if errors:
        raise InvalidToolArguments(name, errors)
    return dict(arguments)


class McpServerOpTool(Tool):
    """A server's resources or prompts as one tool: `read_resource(uri)` answers the resource's
    text, `get_prompt(name, arguments)` the prompt's messages. The description lists what the
    server offered at the last listing, so the model knows the URIs and names."""

    def __init__(self, toolset: McpToolset, server: str, op: str, description: str,
                 parameters: dict[str, Any]) -> None:
        super().__init__(mcp_tool_name(server, op), description, _RemoteArgs, _not_local, None,
                         category=f"mcp:{server}")
        self.parameters = parameters
        self.is_async = True
        self.server = server
        self.op = op
        self._toolset = toolset
        import jsonschema

        self._validator = jsonschema.Draft202012Validator(parameters)

    def validate(self, arguments: Any) -> dict[str, Any]:
        return _validated(self.name, self._validator, arguments)

    async def invoke(self, arguments: Any, ctx: ToolContext) -> ToolResult:
        args = self.validate(arguments)
        try:
            return ToolResult.success(await self._toolset.server_op(self.server, self.op, args))
        except McpError as exc:
            return ToolResult.failure(str(exc))


def _op_tools(toolset: McpToolset, server: str, resources: list[Any] | None, prompts: list[Any] | None
              ) -> list[McpServerOpTool]:
    out = []
    if resources is not None:
        listed = "; ".join(f"{r.uri} ({r.name}{': ' + r.description if r.description else ''})" for r in resources)
        out.append(McpServerOpTool(
            toolset, server, "read_resource", f"Read a resource of the MCP server {server!r} by URI. "
            f"Resources: {listed or 'none listed'}.",
            {"type": "object", "properties": {"uri": {"type": "string"}}, "required": ["uri"],
             "additionalProperties": False}))
    if prompts is not None:
        listed = "; ".join(
            f"{p.name}({', '.join(a.name for a in p.arguments or ())}){': ' + p.description if p.description else ''}"
            for p in prompts)
        out.append(McpServerOpTool(
            toolset, server, "get_prompt", f"Get a prompt of the MCP server {server!r} by name, with its "
            f"arguments (strings). Prompts: {listed or 'none listed'}.",
            {"type": "object", "properties": {"name": {"type": "string"}, "arguments": {
                "type": "object", "additionalProperties": {"type": "string"}}},
             "required": ["name"], "additionalProperties": False}))
    return out


#: Reconnect backoff: first wait, then doubled up to the cap (seconds).
RECONNECT_FIRST = 0.2
RECONNECT_MAX = 10.0


def _lost(exc: BaseException) -> bool:
    """Whether a failed request means the session is gone (the server exited, the stream closed,
    the server stopped answering) rather than a JSON-RPC error answered by a live server."""
    from mcp.shared.exceptions import MCPError
    from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

    if isinstance(exc, MCPError):
        return exc.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT)
    return True


class _Connection:
    """One MCP server's session, kept by one task on the toolset's thread (`McpToolset._keep`):
    it opens the session, waits until the session is lost (a call or a ping found it dead, or
    the toolset closes), leaves it in the same task (the anyio scopes of a session must be) and
    opens a new one with backoff. `ready` is set while a session is open."""

    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self.client: Any = None
        self.ready = asyncio.Event()
        self.lost = asyncio.Event()
        #: `connecting` (first open), `ok`, `reconnecting` (lost; backing off), `closed`.
        self.state = "connecting"
        self.restarts = 0
        self.last_error: str | None = None
        self.task: asyncio.Task[None] | None = None
        #: Set when the server says its tool list changed (`McpToolset._follow_changes`).
        self.changed = asyncio.Event()
        #: True while `_follow_changes` re-lists; `settled` is set after each re-listing.
        self.relisting = False
        self.settled = asyncio.Event()

    async def open(self, stack: AsyncExitStack) -> Any:
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters, stdio_client

        c = self.config
        if c.command is not None:
            params = StdioServerParameters(command=c.command, args=list(c.args), env=c.env, cwd=c.cwd)
            target: Any = stdio_client(params, errlog=sys.stderr)
        else:
            target = c.url
        return await stack.enter_async_context(Client(target, read_timeout_seconds=c.timeout_s,
                                                      message_handler=self.on_message))

    async def on_message(self, message: Any) -> None:
        """`notifications/tools/list_changed` on a handshake-era session: re-list (`changed`)."""
        from mcp_types import ToolListChangedNotification

        if isinstance(message, ToolListChangedNotification):
            self.changed.set()

    def drop(self, error: BaseException | str) -> None:
        """The session is gone: `_keep` leaves it and reconnects (once, however many calls saw it)."""
        if self.state == "ok":
            self.state = "reconnecting"
            self.last_error = error if isinstance(error, str) else _describe(error)
            self.ready.clear()
            self.lost.set()

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


def _resolve(found: asyncio.Future[None]) -> None:
    if not found.done():
        found.set_result(None)


#: Every toolset started in this process, for `/health` and `/metrics` (`mcp_health`).
_LIVE: weakref.WeakSet[McpToolset] = weakref.WeakSet()


def mcp_health() -> dict[str, dict[str, Any]]:
    """Each MCP server of this process's started toolsets: `status` (`ok`, `connecting`,
    `reconnecting`, `closed`), `restarts` (sessions reopened after one was lost), `last_error`."""
    return {name: health for toolset in list(_LIVE) for name, health in toolset.health().items()}


class McpToolset:
    """The tools of one or more MCP servers, kept open on a background thread.

    `toolset = McpToolset([McpServerConfig(...)]).start()` connects and lists (blocking, bounded
    by each server's `timeout_s`); `await toolset.astart()` does the same from async code.
    `toolset.tools` are the `McpTool`s; `register(registry)` adds them to a `ToolRegistry`;
    `await refresh()` re-lists (`tools/list`) and updates the tools in place; `close()` ends the
    sessions (stdio servers exit).

    A server that exits, closes its stream or stops answering (a call past `timeout_s`, or a
    ping every `ping_interval` seconds) is reconnected with backoff (a stdio server is started
    again): the call in flight when it died fails once with an error saying so, calls made while
    it reconnects wait for it (up to `timeout_s`), later ones go to the new session.
    `health()` / `mcp_health()` say where each server is.
    """

    def __init__(self, servers: Iterable[McpServerConfig], *, ping_interval: float = 10.0) -> None:
        self.servers = {s.name: s for s in servers}
        self.ping_interval = ping_interval
        self._connections: dict[str, _Connection] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tools: dict[str, McpTool | McpServerOpTool] = {}
        self._registries: list[ToolRegistry] = []
        self._waiters: list[tuple[str, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._closing = False

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

    async def _keep(self, conn: _Connection, first: asyncio.Future[None]) -> None:
        """Hold `conn`'s session for the toolset's life: open, wait until lost, leave, reopen."""
        name = conn.config.name
        delay = RECONNECT_FIRST
        while not self._closing:
            try:
                async with AsyncExitStack() as stack:
                    async with asyncio.timeout(conn.config.timeout_s):
                        conn.client = await conn.open(stack)
                        subscription = await self._subscribe(conn, stack)
                    if first.done():
                        conn.restarts += 1
                        log.warning("MCP server %r reconnected (restart %d)", name, conn.restarts)
                        conn.changed.set()  # the server may list other tools now: re-list
                    conn.state = "ok"
                    conn.lost.clear()
                    conn.ready.set()
                    if not first.done():
                        first.set_result(None)
                    delay = RECONNECT_FIRST
                    changes = asyncio.create_task(self._follow_changes(conn, subscription),
                                                  name=f"mcp-{name}-changes")
                    try:
                        await self._watch(conn)
                    finally:
                        changes.cancel()
                        await asyncio.gather(changes, return_exceptions=True)
            except Exception as exc:  # noqa: BLE001 - any transport failure: reconnect (or fail the first open)
                if not first.done():
                    first.set_exception(McpError(f"MCP server {name!r}: could not connect: {_describe(exc)}"))
                    return
                if conn.state == "ok":
                    conn.drop(exc)
                elif not self._closing:
                    conn.last_error = _describe(exc)
            conn.ready.clear()
            if self._closing:
                break
            conn.state = "reconnecting"
            log.warning("MCP server %r lost (%s): reconnecting in %.1fs", name, conn.last_error, delay)
            await asyncio.sleep(delay)  # the backoff itself
            delay = min(delay * 2, RECONNECT_MAX)
        conn.state = "closed"

    async def _watch(self, conn: _Connection) -> None:
        """Return once the session is lost: a call saw it (`conn.lost`), a ping got no answer
        (the server exited or hangs), or the toolset is closing."""
        while not self._closing:
            try:
                async with asyncio.timeout(self.ping_interval):
                    await conn.lost.wait()
                return
            except TimeoutError:
                pass
            try:
                async with asyncio.timeout(conn.config.timeout_s):
                    with warnings.catch_warnings():  # newer protocol versions drop `ping`: any answer will do
                        warnings.simplefilter("ignore")
                        await conn.client.send_ping()
            except Exception as exc:  # noqa: BLE001 - an error answer still proves the server is there
                if _lost(exc):
                    conn.drop(exc)
                    return

    async def _subscribe(self, conn: _Connection, stack: AsyncExitStack) -> Any:
        """Open the session's `subscriptions/listen` stream of tool-list changes (2026-07-28
        sessions) and wait for the server's acknowledgment, before the session counts as ready
        and before its tools are listed: a change made after that listing (even by the very
        first call) is then always heard. None on older sessions (they send
        `notifications/tools/list_changed` unasked) or when the server offers no stream."""
        from mcp.client.subscriptions import ListenNotSupportedError

        try:
            return await stack.enter_async_context(conn.client.listen(tools_list_changed=True))
        except ListenNotSupportedError:
            return None
        except Exception as exc:  # noqa: BLE001 - no stream: periodic refresh (if any) still runs
            if _lost(exc):
                raise
            log.info("MCP server %r: no tools/list_changed stream: %s", conn.config.name, _describe(exc))
            return None

    async def _follow_changes(self, conn: _Connection, subscription: Any) -> None:
        """Re-list the tools (and update the registered registries) when the server says its
        list changed, and every `refresh_s` if set. On 2026-07-28 sessions the change comes on
        the `subscriptions/listen` stream `subscription` (`_subscribe`); on older ones, as
        `notifications/tools/list_changed` (`_Connection.on_message`). Runs with the session
        (`_keep` cancels it when it ends)."""
        listener = asyncio.create_task(self._listen(conn, subscription))
        try:
            while not self._closing:
                try:
                    async with asyncio.timeout(conn.config.refresh_s):
                        await conn.changed.wait()
                except TimeoutError:
                    pass
                conn.changed.clear()
                conn.relisting = True
                try:
                    await self._list_all(refresh=True)
                    for registry in self._registries:
                        self._put(registry)
                    self._wake()
                except McpError as exc:  # the next change or period tries again
                    log.warning("MCP server %r: re-listing failed: %s", conn.config.name, exc)
                finally:
                    conn.relisting = False
                    conn.settled.set()
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)

    async def wait_listed(self, tool: str) -> None:
        """Return once `tool` (an `mcp__<server>__<tool>` id) is listed: after a server said
        its list changed, or a periodic refresh found it (bound it with `asyncio.timeout`)."""
        loop = asyncio.get_running_loop()
        found: asyncio.Future[None] = loop.create_future()
        self._waiters.append((tool, loop, found))
        self._wake()
        await found

    def _wake(self) -> None:
        """Resolve the `wait_listed` waiters whose tool is listed now (from any thread)."""
        for waiter in list(self._waiters):
            tool, loop, found = waiter
            if tool in self._tools:
                self._waiters.remove(waiter)
                loop.call_soon_threadsafe(_resolve, found)

    async def _listen(self, conn: _Connection, subscription: Any) -> None:
        """Mark `conn` changed at each event of its listen stream, until the stream ends."""
        if subscription is None:
            return  # a handshake-era session: the notification handler sets `changed`
        try:
            async for _event in subscription:
                conn.changed.set()
        except Exception as exc:  # noqa: BLE001 - the stream dropped: periodic refresh (if any) still runs
            log.info("MCP server %r: tools/list_changed stream ended: %s", conn.config.name, _describe(exc))

    async def _open_all(self) -> None:
        for name, config in self.servers.items():
            if name in self._connections:
                continue
            conn = _Connection(config)
            first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            conn.task = asyncio.get_running_loop().create_task(self._keep(conn, first), name=f"mcp-{name}")
            await first  # raises the typed McpError of a failed first connect
            self._connections[name] = conn
        await self._list_all(refresh=False)
        _LIVE.add(self)

    async def _list_all(self, refresh: bool) -> None:
        tools: dict[str, McpTool | McpServerOpTool] = {}
        for name, conn in self._connections.items():
            try:
                await self._ready(conn)
                async with asyncio.timeout(conn.config.timeout_s):
                    listed = await conn.list(refresh)
            except Exception as exc:  # noqa: BLE001
                raise McpError(f"MCP server {name!r}: tools/list failed: {_describe(exc)}") from None
            for remote in listed:
                t = McpTool(self, name, remote)
                tools[t.name] = t
            for op in await self._list_ops(conn):
                tools[op.name] = op
        self._tools = tools

    async def _list_ops(self, conn: _Connection) -> list[McpServerOpTool]:
        """The resource / prompt tools of a server whose config asks for them."""
        c = conn.config
        if not (c.resources or c.prompts):
            return []
        try:
            async with asyncio.timeout(c.timeout_s):
                resources = list((await conn.client.list_resources()).resources) if c.resources else None
                prompts = list((await conn.client.list_prompts()).prompts) if c.prompts else None
        except Exception as exc:  # noqa: BLE001
            raise McpError(f"MCP server {c.name!r}: resources/prompts listing failed: {_describe(exc)}") from None
        return _op_tools(self, c.name, resources, prompts)

    async def server_op(self, server: str, op: str, args: dict[str, Any]) -> Any:
        """`resources/read` or `prompts/get` on `server` (on the toolset's thread): the text of
        the resource's contents / the prompt's messages as `[{role, text}]`."""
        conn = self._connections.get(server)
        if conn is None:
            raise McpError(f"MCP server {server!r} is not connected")

        async def run() -> Any:
            await self._ready(conn)
            try:
                if op == "read_resource":
                    res = await conn.client.read_resource(args["uri"])
                    texts = [getattr(c, "text", None) for c in res.contents]
                    return "\n".join(t for t in texts if isinstance(t, str))
                got = await conn.client.get_prompt(args["name"], dict(args.get("arguments") or {}))
                return [{"role": m.role, "text": getattr(m.content, "text", None)} for m in got.messages]
            except Exception as exc:  # noqa: BLE001
                if _lost(exc):
                    conn.drop(exc)
                raise McpError(f"MCP server {server!r}: {op} failed: {_describe(exc)}") from None

        return await asyncio.wrap_future(self._submit(run()))

    async def _ready(self, conn: _Connection) -> None:
        """Wait (up to the server's `timeout_s`) for an open session."""
        if conn.ready.is_set():
            return
        try:
            async with asyncio.timeout(conn.config.timeout_s):
                await conn.ready.wait()
        except TimeoutError:
            raise McpError(f"MCP server {conn.config.name!r} is down, reconnecting "
                           f"(last error: {conn.last_error})") from None

    def health(self) -> dict[str, dict[str, Any]]:
        return {name: {"status": c.state, "restarts": c.restarts, "last_error": c.last_error}
                for name, c in self._connections.items()}

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
        self._closing = True
        _LIVE.discard(self)
        tasks = []
        for conn in self._connections.values():
            conn.lost.set()
            if conn.task is not None:
                tasks.append(conn.task)
        if tasks:
            await asyncio.wait(tasks, timeout=self._timeout())
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
    def tools(self) -> list[McpTool | McpServerOpTool]:
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
            await self._ready(conn)
            try:
                result = await conn.client.call_tool(tool, arguments, progress_callback=on_progress)
            except Exception as exc:  # noqa: BLE001
                if _lost(exc):
                    conn.drop(exc)
                    raise McpError(
                        f"MCP server {server!r} was lost during tools/call {tool!r} ({_describe(exc)}): "
                        "this call failed and is not retried; the server is being reconnected") from None
                raise McpError(f"MCP server {server!r}: tools/call {tool!r} failed: {_describe(exc)}") from None
            await self._settle(conn)
            return result

        return await asyncio.wrap_future(self._submit(call()))

    async def _settle(self, conn: _Connection) -> None:
        """Wait for the re-listing a call caused, so that the next run can name the tools it
        added. A server says its list changed before it answers the call that changed it; on one
        stream (stdio) the session hands that word on in receive order, so by the time the
        answer is here the re-listing is pending or running. (Over HTTP the word may come on
        another stream, after the answer: then the re-listing simply follows.) Bounded by the
        server's `timeout_s`; the call's own result stands either way."""
        try:
            async with asyncio.timeout(conn.config.timeout_s):
                while conn.ready.is_set() and (conn.changed.is_set() or conn.relisting):
                    conn.settled.clear()
                    await conn.settled.wait()
        except TimeoutError:
            log.warning("MCP server %r: re-listing after a call took over %ss", conn.config.name,
                        conn.config.timeout_s)
