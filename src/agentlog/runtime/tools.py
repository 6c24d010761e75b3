"""Tools: plain typed Python functions (sync or async) turned into validated, schema-described calls.

`@tool` reads the function's signature: every parameter except the `ToolContext` one becomes a field
of a pydantic model, which gives both the JSON Schema the model sees and the validation applied
before the function runs. A tool answers with a `ToolResult`: success, error, or pending (suspend
with a ticket). Returning a plain value means success; raising `ToolError` means error.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import queue
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, get_type_hints

import msgspec
import pydantic

from agentlog.eventlog.errors import AgentlogError
from agentlog.eventlog.events import JSON, Emitted, ResumeMode, SuspendTicket, ToolCallDecision
from agentlog.eventlog.ids import validate_id
from agentlog.runtime.models.base import ToolSpec
from agentlog.runtime.state.access import ProfileAccess, ProfileLoader, TypedState
from agentlog.runtime.state.batch import MutationBatch
from agentlog.runtime.state.keys import StateKey, StateKeys


class ToolError(AgentlogError):
    """Raise from a tool to return an error result to the model (the run goes on)."""

    code = "tool_error"


class InvalidToolArguments(AgentlogError):
    code = "invalid_tool_arguments"

    def __init__(self, tool: str, errors: list[dict[str, Any]]) -> None:
        self.tool = tool
        self.errors = errors
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())) or '<root>'}: {e.get('msg')}" for e in errors
        )
        super().__init__(f"invalid arguments for tool {tool!r}: {detail}")


class ToolResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a tool call produced. `status` decides what the loop records.

    `details`: data about the result for clients and audits (an HTTP status, a source URL, a
    row count), recorded with the call (`ToolCallCompleted.details`, the call view's `details`)
    and never shown to the model. `follow_up`: user messages the model reads after this step's
    tool results (an image the tool fetched, an instruction that belongs to the user turn),
    appended at the step's end in call order."""

    status: str  # "success" | "error" | "pending"
    value: JSON = None
    error: str | None = None
    ticket: SuspendTicket | None = None
    details: JSON = None
    follow_up: list[str] = []

    @classmethod
    def success(cls, value: JSON = None, *, details: JSON = None, follow_up: Iterable[str] = ()) -> ToolResult:
        return cls(status="success", value=value, details=details, follow_up=list(follow_up))

    @classmethod
    def failure(cls, message: str, value: JSON = None, *, details: JSON = None,
                follow_up: Iterable[str] = ()) -> ToolResult:
        return cls(status="error", error=message, value=value, details=details, follow_up=list(follow_up))

    @classmethod
    def pending(
        cls,
        ticket_id: str,
        *,
        action: str = "approve",
        message: str | None = None,
        parameters: dict[str, JSON] | None = None,
        response_schema: dict[str, JSON] | None = None,
        resume_mode: ResumeMode = "replay_tool_call",
    ) -> ToolResult:
        validate_id(ticket_id, "ticket id")
        ticket = SuspendTicket(
            id=ticket_id,
            action=action,
            message=message,
            parameters=parameters or {},
            response_schema=response_schema,
            resume_mode=resume_mode,
        )
        return cls(status="pending", ticket=ticket)


class ToolContext(TypedState):
    """Everything a running tool may know or do, and nothing else.

    State edits are recorded as RFC 6902 ops and committed with the call's completion as a
    `StatePatched` event, so a tool never writes the state directly. Typed state keys
    (`read`, `write`, `update`, `reduce`; `profile` for the profile scope) are staged in `batch`
    and committed with the completion as `StateWritten` events. `call_id` is the idempotency
    key: a call interrupted by a crash is run again with the same id (at-least-once), unless its
    tool is declared `idempotent=False`: it is then in doubt, and runs again (same id) only when
    a human answers `retry` (`agentlog.runtime.loop.in_doubt`).
    """

    def __init__(
        self,
        *,
        thread_id: str,
        run_id: str,
        call_id: str,
        agent_id: str,
        tool_name: str,
        state: dict[str, JSON],
        decision: ToolCallDecision | None = None,
        progress: Callable[[JSON], None] | None = None,
        cancelled: asyncio.Event | None = None,
        run_state: dict[str, JSON] | None = None,
        call_state: dict[str, JSON] | None = None,
        keys: StateKeys | None = None,
        profile_id: str | None = None,
        profile_loader: ProfileLoader | None = None,
        agent: Any = None,
        agent_tools: Mapping[str, Tool] | None = None,
    ) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.call_id = call_id
        self.agent_id = agent_id
        self.tool_name = tool_name
        self._state = state
        #: The human decision this call was resumed with (resume mode pass_decision_to_tool).
        self.decision = decision
        self._progress = progress
        self._cancelled = cancelled or asyncio.Event()
        #: The agent running the call (its `AgentSpec`; None outside a run loop) and its tools by
        #: name (read them, never call them: `tool_search` reads the catalog).
        self.agent = agent
        self.agent_tools: Mapping[str, Tool] = agent_tools or {}
        self.ops: list[dict[str, JSON]] = []
        #: Events for the run's clients, committed with the call's completion (`Emitted`).
        self.emitted: list[Emitted] = []
        #: Typed state writes, committed with the call's completion (`StateWritten`).
        self.batch = MutationBatch({"thread": state, "run": run_state or {}, "tool_call": call_state or {}},
                                   writer=f"tool:{call_id}", owners={"tool_call": call_id})
        #: The agent's state keys (by name), e.g. for a tool that reads a key it did not declare.
        self.keys = keys if keys is not None else StateKeys()
        #: The profile scope: the long-term state of the thread's `resource_id` (async).
        self.profile = ProfileAccess(self.batch, profile_id, profile_loader)
        #: What `details` and `follow_up` recorded (joined to the call's `ToolResult`).
        self.result_details: JSON = None
        self.follow_ups: list[str] = []

    @property
    def state(self) -> dict[str, JSON]:
        """Snapshot of the thread state when the call started (a deep copy: edit through `set`)."""
        return msgspec.json.decode(msgspec.json.encode(self._state))

    @property
    def is_cancelled(self) -> bool:
        return self._cancelled.is_set()

    async def wait_cancelled(self) -> None:
        await self._cancelled.wait()

    def patch(self, ops: Iterable[dict[str, JSON]]) -> None:
        """Record raw RFC 6902 ops (validated against the state when the call completes)."""
        self.ops.extend(dict(op) for op in ops)

    def set(self, path: str, value: JSON) -> None:
        """Set a JSON Pointer path (`/a/b`) to `value` (add or replace)."""
        self.ops.append({"op": "add", "path": path, "value": value})

    def remove(self, path: str) -> None:
        self.ops.append({"op": "remove", "path": path})

    def details(self, value: JSON) -> None:
        """Set the result's `details` (kept from the model; see `ToolResult`): for a tool that
        returns a plain value. A `ToolResult` with its own `details` wins."""
        self.result_details = value

    def follow_up(self, text: str) -> None:
        """Add a user message the model reads after this step's tool results (see `ToolResult`)."""
        self.follow_ups.append(str(text))

    def emit(self, name: str, value: JSON = None) -> None:
        """A custom event for the run's clients (AG-UI `CUSTOM`), recorded with the call's
        completion: unlike `progress`, a client reading the run later sees it too."""
        self.emitted.append(Emitted(kind="custom", name=name, value=value, call_id=self.call_id))

    def emit_raw(self, event: JSON, source: str = "") -> None:
        """An event of another system passed through to the run's clients (AG-UI `RAW`)."""
        self.emitted.append(Emitted(kind="raw", name=source, value=event, call_id=self.call_id))

    def activity(self, activity_type: str, content: JSON, message_id: str | None = None) -> str:
        """Publish an activity (AG-UI `ACTIVITY_SNAPSHOT`: a plan, a progress card) and return its
        message id (default: one per call and activity type)."""
        mid = message_id or f"activity-{self.call_id}-{activity_type}"
        self.emitted.append(Emitted(kind="activity_snapshot", name=activity_type, value=content,
                                    message_id=mid, call_id=self.call_id))
        return mid

    def activity_patch(self, activity_type: str, ops: Iterable[dict[str, JSON]], message_id: str | None = None
                       ) -> None:
        """Change a published activity with RFC 6902 ops (AG-UI `ACTIVITY_DELTA`)."""
        mid = message_id or f"activity-{self.call_id}-{activity_type}"
        self.emitted.append(Emitted(kind="activity_delta", name=activity_type, patch=[dict(op) for op in ops],
                                    message_id=mid, call_id=self.call_id))

    def progress(self, data: JSON) -> None:
        """Report live progress (core NATS, not persisted); a no-op when nobody listens."""
        if self._progress is not None:
            self._progress(data)


ToolFunction = Callable[..., Any] | Callable[..., Awaitable[Any]]


class Tool:
    """A callable tool with its schema. Build one with `@tool` or `Tool.from_function`."""

    # Optional markers that other modules set on a tool; absent unless set (declared only, no
    # class value), so readers use `getattr(tool, name, default)`.
    #: Verified replay answers the call from the log instead of re-running it (`agentlog.runtime.replay.verify`).
    replay_from_log: bool
    #: Called with the `Runtime` the tool is registered in (`agentlog.runtime.toolkits.subagents`).
    bind_runtime: Callable[[Any], None]
    #: Stands in for a tool the client runs (`agentlog.runtime.inputs.frontend.is_frontend_stub`).
    frontend_stub: bool
    #: The id of the plugin that gives this tool to its agents (`Plugin.tools`).
    provided_by: str

    def __init__(
        self,
        name: str,
        description: str,
        args_model: type[pydantic.BaseModel],
        function: ToolFunction,
        context_param: str | None,
        state_keys: Iterable[StateKey[Any]] = (),
        *,
        category: str | None = None,
        label: str | None = None,
        idempotent: bool = True,
    ) -> None:
        validate_id(name, "tool name")
        self.name = name
        self.description = description
        #: For UIs (the agent catalog, `GET /v1/agents`): a group to file the tool under
        #: ("search", "mcp:github") and a human name ("Search the web"). Never sent to the model.
        self.category = category
        self.label = label
        #: Whether running a call twice does no harm. True (the default): a call interrupted by a
        #: crash runs again with the same `call_id`. False: its effect must not happen twice, so
        #: an interrupted call is suspended in doubt for a human (`agentlog.runtime.loop.in_doubt`).
        self.idempotent = idempotent
        self.args_model = args_model
        self.function = function
        self.context_param = context_param
        self.is_async = inspect.iscoroutinefunction(function)
        self.parameters: dict[str, JSON] = args_model.model_json_schema()
        self.parameters.pop("title", None)
        #: The typed state keys the tool reads and writes (registered with the agents using it).
        self.state_keys: tuple[StateKey[Any], ...] = tuple(state_keys)

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)

    @classmethod
    def from_function(
        cls, function: ToolFunction, *, name: str | None = None, description: str | None = None,
        state_keys: Iterable[StateKey[Any]] = (), category: str | None = None, label: str | None = None,
        idempotent: bool = True,
    ) -> Tool:
        signature = inspect.signature(function)
        hints = get_type_hints(function)
        fields: dict[str, Any] = {}
        context_param: str | None = None
        for param in signature.parameters.values():
            annotation = hints.get(param.name, Any)
            if annotation is ToolContext:
                context_param = param.name
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(f"tool {function.__name__}: *args/**kwargs are not supported")
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[param.name] = (annotation, default)
        tool_name = name or function.__name__
        model = pydantic.create_model(
            f"{tool_name}_args", __config__=pydantic.ConfigDict(extra="forbid"), **fields
        )
        doc = description if description is not None else inspect.getdoc(function) or ""
        return cls(tool_name, doc, model, function, context_param, state_keys, category=category, label=label,
                   idempotent=idempotent)

    def validate(self, arguments: JSON) -> dict[str, Any]:
        """Validate raw JSON arguments; raise `InvalidToolArguments` naming each bad field."""
        if not isinstance(arguments, dict):
            raise InvalidToolArguments(self.name, [{"loc": (), "msg": "arguments must be a JSON object"}])
        try:
            parsed = self.args_model.model_validate(arguments)
        except pydantic.ValidationError as exc:
            raise InvalidToolArguments(
                self.name, [{"loc": e["loc"], "msg": e["msg"]} for e in exc.errors()]
            ) from None
        return {name: getattr(parsed, name) for name in self.args_model.model_fields}

    async def invoke(self, arguments: JSON, ctx: ToolContext) -> ToolResult:
        """Validate, run (sync tools in a thread of their own, `in_daemon_thread`), and normalise
        the answer to a `ToolResult`.

        Raises `InvalidToolArguments` for bad arguments; any exception from the tool body other
        than cancellation becomes an error result, so one faulty tool cannot crash a run.
        """
        kwargs = self.validate(arguments)
        if self.context_param is not None:
            kwargs[self.context_param] = ctx
        try:
            if self.is_async:
                value = await self.function(**kwargs)
            else:
                value = await in_daemon_thread(self.function, kwargs, f"agentlog-tool-{self.name}")
        except ToolError as exc:
            return with_context_result(ToolResult.failure(str(exc)), ctx)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a tool bug is the model's error result, not a crash
            return with_context_result(ToolResult.failure(f"{type(exc).__name__}: {exc}"), ctx)
        if isinstance(value, ToolResult):
            return with_context_result(value, ctx)
        if isinstance(value, pydantic.BaseModel):
            value = value.model_dump(mode="json")
        return with_context_result(ToolResult.success(msgspec.to_builtins(value)), ctx)


def with_context_result(result: ToolResult, ctx: ToolContext) -> ToolResult:
    """`result` with what the tool set through its context (`ToolContext.details`, `follow_up`):
    the result's own details win, the context's follow-ups come first."""
    if ctx.result_details is None and not ctx.follow_ups:
        return result
    return msgspec.structs.replace(
        result, details=result.details if result.details is not None else ctx.result_details,
        follow_up=[*ctx.follow_ups, *result.follow_up],
    )


# == the threads sync tools run in ==================================================================


class DaemonThreads:
    """Daemon threads for blocking calls, each running one call at a time and kept `idle`
    seconds after it for the next one. Every call has a thread of its own while it runs (a new
    one when none is idle), so a call that blocks for an hour holds up no other; they are daemons
    (not the default executor's, which the interpreter joins at exit), so one stuck in a call
    never keeps a stopping process alive. Why keep them: `Thread.start` waits, on the event loop,
    for the new thread to be scheduled, on the path of every sync tool call."""

    def __init__(self, *, idle: float = 60.0) -> None:
        self.idle = idle
        self._lock = threading.Lock()
        #: Kept threads blocked on `_jobs`, waiting for a call.
        self._waiting = 0
        self._jobs: queue.SimpleQueue[tuple[Callable[[], None], str]] = queue.SimpleQueue()

    def submit(self, job: Callable[[], None], *, name: str) -> None:
        """Run `job()` in an idle kept thread, else in a new one (named `name` while it runs).
        `job` reports its own outcome: what it raises is dropped, and its thread goes on."""
        with self._lock:
            if self._waiting > 0:
                self._waiting -= 1
                self._jobs.put((job, name))  # under the lock: a waiter timing out finds it
                return
        threading.Thread(target=self._serve, args=(job, name), name=name, daemon=True).start()

    def _serve(self, job: Callable[[], None], name: str) -> None:
        thread = threading.current_thread()
        while True:
            thread.name = name
            try:
                job()
            except BaseException:  # noqa: BLE001 - a job reports through its own callback; the thread goes on
                pass
            thread.name = "agentlog-idle"
            with self._lock:
                self._waiting += 1
            try:
                job, name = self._jobs.get(timeout=self.idle)
            except queue.Empty:
                with self._lock:
                    try:  # submitted between the timeout and this lock: counted off for us already
                        job, name = self._jobs.get_nowait()
                    except queue.Empty:
                        self._waiting -= 1
                        return

    @property
    def idle_threads(self) -> int:
        """Kept threads waiting for a call now."""
        with self._lock:
            return self._waiting


#: The process's pool (sync tools: `agentlog.runtime.tools.in_daemon_thread`).
DAEMON_THREADS = DaemonThreads()


async def in_daemon_thread(function: Callable[..., Any], kwargs: dict[str, Any], name: str) -> Any:
    """`function(**kwargs)` in a daemon thread of its own while it runs (with this task's context
    variables; `DaemonThreads`), awaited.

    A thread cannot be cancelled: a cancelled call stops waiting and the function goes on until it
    returns, its answer dropped. In a daemon thread (not the default executor's, which the
    interpreter joins at exit) it never keeps a stopping process alive: the run it belonged to was
    handed back and is fenced, so whatever it finishes is never written."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(error: BaseException | None, value: Any) -> None:
        if answer.done():
            return  # cancelled meanwhile
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(value)

    def body() -> None:
        error: BaseException | None = None
        value: Any = None
        try:
            value = context.run(function, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task, as an executor does
            error = exc
        try:
            loop.call_soon_threadsafe(settle, error, value)
        except RuntimeError:
            pass  # the event loop is gone (the process is stopping): nobody waits for the answer

    DAEMON_THREADS.submit(body, name=name)
    return await answer


def tool(
    function: ToolFunction | None = None, *, name: str | None = None, description: str | None = None,
    state_keys: Iterable[StateKey[Any]] = (), category: str | None = None, label: str | None = None,
    idempotent: bool = True,
) -> Any:
    """Decorator: `@tool` or `@tool(name=..., description=..., state_keys=[...], category=...,
    label=..., idempotent=...)` turns a function into a `Tool`.

    `idempotent=False` declares a tool whose effect must not happen twice (a payment, an email):
    a call of it interrupted by a crash is not run again but suspended in doubt for a human
    (`agentlog.runtime.loop.in_doubt`)."""

    def wrap(fn: ToolFunction) -> Tool:
        return Tool.from_function(fn, name=name, description=description, state_keys=state_keys,
                                  category=category, label=label, idempotent=idempotent)

    return wrap(function) if function is not None else wrap


class ToolRegistry:
    """Tools by name. Names are ids (safe NATS tokens) so they can appear in subjects and rules."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.register(t)

    def register(self, t: Tool | ToolFunction) -> Tool:
        t = t if isinstance(t, Tool) else Tool.from_function(t)
        if t.name in self._tools and self._tools[t.name] is not t:
            raise ValueError(f"a tool named {t.name!r} is already registered")
        self._tools[t.name] = t
        return t

    def replace(self, t: Tool) -> Tool:
        """Register `t`, replacing a tool of the same name (a refreshed remote tool, e.g. MCP)."""
        self._tools[t.name] = t
        return t

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def names(self) -> list[str]:
        return list(self._tools)
