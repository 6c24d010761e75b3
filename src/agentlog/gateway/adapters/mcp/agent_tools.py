"""agentlog's agents as an MCP server (the official `mcp` SDK's lowlevel `Server`): each agent is
a tool. Served over streamable HTTP at `/v1/mcp` (`mcp_http`) and over stdio (`agentlog mcp`).

A tool call is one AG-UI request driven through `agui.session.events`, so it starts, resumes and
follows a run exactly like the AG-UI and AI SDK adapters do (tenant checks, resume checks before
anything is written, live deltas ordered with the commits); this module only reads the events
and shapes the answer:

- the run finished: the assistant's text, `structuredContent = {status: "done", run_id,
  thread_id, text}`;
- the run waits on a human (an approval, a ticket asking for input): the client is asked through
  MCP elicitation when it declared the capability. On a connection with a back-channel (the
  initialize handshake era) that is an `elicitation/create` request inside the call; on the
  2026-07-28 protocol (no back-channel) the call answers `InputRequiredResult` with one
  elicitation per open call and the run id as `requestState`, and the client's retry carries the
  answers. Either way the answers are recorded as the run's decisions and the run goes on.
- a client without elicitation gets a pending result, `{status: "waiting", run_id, thread_id,
  pending: [...]}`; it (or anyone allowed to) answers later by calling the same tool with
  `run_id` and `approve`, or through the HTTP API.

Why through the AG-UI session rather than the dispatcher directly: the session already is the one
tested way to follow a run from a given log position with the live deltas merged in order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import mcp_types as types
from ag_ui import core as ag
from mcp.server.lowlevel import Server
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from agentlog.eventlog.errors import AgentlogError
from agentlog.eventlog.ids import new_id, validate_id
from agentlog.gateway.adapters import session
from agentlog.gateway.adapters.agui import session as agui_session
from agentlog.gateway.adapters.agui import translator as agui
from agentlog.gateway.adapters.common import AdapterInputError, error_text
from agentlog.projections.fold import fold_commits
from agentlog.runtime import InvalidDecision

#: The input of every agent tool: a new message, or the answer to a waiting run's approvals.
AGENT_INPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "message": {"type": "string", "description": "What to ask the agent (starts a run)."},
        "thread_id": {"type": "string", "description": "Continue this conversation (default: a new thread)."},
        "run_id": {"type": "string", "description": "A waiting run (from a pending result) to answer with `approve`."},
        "approve": {"type": "boolean", "description": "With `run_id`: approve (true) or deny (false) every open "
                                                      "approval of that run."},
    },
    "additionalProperties": False,
}

#: What an approval elicitation asks for.
APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object", "properties": {"approve": {"type": "boolean", "title": "Approve",
                                                 "description": "Let the agent go ahead with this tool call"}},
    "required": ["approve"],
}


class McpInputError(AgentlogError, ValueError):
    code = "invalid_arguments"


@dataclass
class Outcome:
    """Where a call left its run."""

    thread_id: str
    run_id: str
    status: Literal["done", "waiting", "failed"]
    texts: list[str] = field(default_factory=list)
    interrupts: list[ag.Interrupt] = field(default_factory=list)
    pending_tool_calls: list[str] = field(default_factory=list)
    error: str | None = None
    code: str | None = None

    def result(self) -> types.CallToolResult:
        doc: dict[str, Any] = {"status": self.status, "run_id": self.run_id, "thread_id": self.thread_id}
        if self.status == "done":
            doc["text"] = self.texts[-1] if self.texts else ""
            text = "\n\n".join(self.texts)
        elif self.status == "waiting":
            doc["pending"] = [_pending(i) for i in self.interrupts] + [
                {"call_id": c, "kind": "frontend_tool"} for c in self.pending_tool_calls]
            text = (f"run {self.run_id} is waiting for a human: call this tool again with run_id and approve, "
                    f"or answer it through the agentlog API. Pending: {json.dumps(doc['pending'])}")
        else:
            doc["error"] = {"code": self.code or "run_failed", "message": self.error or ""}
            text = f"error [{self.code or 'run_failed'}]: {self.error or ''}"
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                    structured_content=doc, is_error=self.status == "failed")


def _pending(i: ag.Interrupt) -> dict[str, Any]:
    meta = (i.metadata or {}).get("agentlog", {})
    out: dict[str, Any] = {"call_id": i.id, "kind": i.reason or "approval"}
    for key, name in (("toolName", "tool"), ("arguments", "arguments")):
        if key in meta:
            out[name] = meta[key]
    if i.message:
        out["message"] = i.message
    return out


def _run_input(thread_id: str, messages: list[dict[str, Any]], resume: list[dict[str, Any]] | None = None
               ) -> dict[str, Any]:
    body: dict[str, Any] = {"threadId": thread_id, "runId": new_id(), "messages": messages, "tools": [],
                            "context": [], "state": {}, "forwardedProps": {}}
    if resume:
        body["resume"] = resume
    return body


async def drive(backend: session.Backend, agent_id: str, body: dict[str, Any], who: Any, run_id: str
                ) -> Outcome:
    """Run one AG-UI request to its end (finished, waiting, failed) and read the outcome.
    `run_id`: the agentlog run the request starts or resumes (AG-UI names a resume by a new id)."""
    req = agui_session.parse(body)
    out = Outcome(thread_id=req.thread_id, run_id=run_id, status="done")
    texts: dict[str, list[str]] = {}
    async for ev in agui_session.events(backend, agent_id, req, who):
        if isinstance(ev, (ag.TextMessageContentEvent, ag.TextMessageChunkEvent)) and ev.delta:
            texts.setdefault(ev.message_id or "", []).append(ev.delta)
        elif isinstance(ev, ag.RunErrorEvent):
            out.status, out.error, out.code = "failed", ev.message, ev.code
        elif isinstance(ev, ag.RunFinishedEvent):
            outcome = ev.outcome
            if isinstance(outcome, ag.RunFinishedInterruptOutcome):
                out.status, out.interrupts = "waiting", list(outcome.interrupts)
            elif isinstance(outcome, ag.RunFinishedSuccessOutcome) and outcome.pending_tool_call_ids:
                out.status, out.pending_tool_calls = "waiting", list(outcome.pending_tool_call_ids)
    out.texts = ["".join(parts) for parts in texts.values() if "".join(parts)]
    return out


async def start(backend: session.Backend, agent_id: str, message: str, thread_id: str | None, who: Any
                ) -> Outcome:
    thread = thread_id or new_id()
    run_id = new_id()
    body = _run_input(thread, [{"id": new_id(), "role": "user", "content": message}])
    body["runId"] = run_id
    return await drive(backend, agent_id, body, who, run_id)


async def waiting_thread(backend: session.Backend, run_id: str, who: Any) -> tuple[str, list[ag.Interrupt]]:
    """The thread of `run_id` and its open interrupts (empty when the run does not wait).
    Unknown and other-tenant runs are the same error."""
    commits = await session.run_commits(backend.store, run_id)
    if not commits:
        raise McpInputError(f"run {run_id!r} not found")
    thread_id = commits[0].commit.thread_id
    try:
        await session.load_thread(backend.store, thread_id, who)
    except session.NotVisible:
        raise McpInputError(f"run {run_id!r} not found") from None
    run = fold_commits(commits).runs.get(run_id)
    return thread_id, agui.open_interrupts(run) if run is not None else []


async def answer(backend: session.Backend, agent_id: str, run_id: str, answers: Mapping[str, Any], who: Any
                 ) -> Outcome:
    """Record `answers` (call id -> payload; None denies) on the waiting run and follow it on."""
    thread_id, _ = await waiting_thread(backend, run_id, who)
    resume = [{"interruptId": cid, "status": "cancelled" if payload is None else "resolved",
               **({"payload": payload} if payload is not None else {})} for cid, payload in answers.items()]
    return await drive(backend, agent_id, _run_input(thread_id, [], resume), who, run_id)


# -- elicitation ---------------------------------------------------------------------------------


def elicitation(i: ag.Interrupt) -> tuple[str, dict[str, Any]]:
    """The message and schema to ask for one open interrupt: approve yes/no for an approval,
    the ticket's own response schema for anything else that has one."""
    meta = (i.metadata or {}).get("agentlog", {})
    tool = meta.get("toolName", "a tool")
    asks_input = i.reason not in ("tool_call", "confirmation")
    if asks_input and isinstance(i.response_schema, dict) and i.response_schema.get("properties"):
        return i.message or f"{tool} needs your input", dict(i.response_schema)
    args = json.dumps(meta.get("arguments", {}), sort_keys=True)
    return (i.message or f"Allow {tool}({args})?"), APPROVAL_SCHEMA


def payload_of(i: ag.Interrupt, result: types.ElicitResult) -> Any:
    """An elicitation's answer as the decision payload; None denies (cancels the call). An
    approval is `approve: true` (approved) or `approve: false` (denied); anything else is an
    `InvalidDecision` (nothing is recorded). Other answers are checked against their ticket's
    schema where every decision is (`agentlog.runtime.loop.hitl.check_result`)."""
    if result.action != "accept":
        return None
    content = dict(result.content or {})
    if elicitation(i)[1] is APPROVAL_SCHEMA:
        approve = content.get("approve")
        if not isinstance(approve, bool):
            raise InvalidDecision(f"the answer to call {i.id!r} must say approve: true or false, not {approve!r}",
                                  [{"field": "approve", "message": "a boolean is required", "type": "invalid_decision",
                                    "target_id": i.id}])
        return {"approved": True} if approve else None
    return content


def _wants_elicitation(ctx: Any) -> bool:
    caps = ctx.session.client_capabilities
    return caps is not None and caps.elicitation is not None


# -- the server ----------------------------------------------------------------------------------


#: Where the HTTP bridge puts the caller (`agentlog.gateway.operations.auth.Principal`) in the ASGI scope.
PRINCIPAL_SCOPE_KEY = "agentlog.principal"


def _who(ctx: Any) -> Any:
    request = ctx.request
    scope = getattr(request, "scope", None)
    return scope.get(PRINCIPAL_SCOPE_KEY) if isinstance(scope, Mapping) else None


def agent_tools(catalog: list[dict[str, Any]]) -> list[types.Tool]:
    return [types.Tool(name=a["id"], description=a.get("description") or f"agentlog agent {a['id']}",
                       input_schema=AGENT_INPUT) for a in catalog]


def build_server(backend: session.Backend, catalog: Callable[[], list[dict[str, Any]]],
                 who: Callable[[Any], Any] = _who) -> Server[Any]:
    """The MCP server of `catalog()`'s agents over `backend`. `who(ctx)`: the caller of a request
    (default: the principal the HTTP bridge put in the ASGI scope; None on stdio = the operator)."""

    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=agent_tools(catalog()))

    async def call_tool(ctx: Any, params: types.CallToolRequestParams
                        ) -> types.CallToolResult | types.InputRequiredResult:
        agents = {a["id"] for a in catalog()}
        if params.name not in agents:
            return _error("agent_not_found", f"unknown agent {params.name!r}")
        try:
            outcome = await _call(ctx, params, who(ctx))
        except (AdapterInputError, McpInputError) as exc:
            return _error(exc.code, str(exc), exc.run_id)
        except AgentlogError as exc:
            return _error(exc.code, error_text(exc), exc.run_id)
        if isinstance(outcome, types.InputRequiredResult):
            return outcome
        return outcome.result()

    async def _call(ctx: Any, params: types.CallToolRequestParams, caller: Any
                    ) -> Outcome | types.InputRequiredResult:
        args = dict(params.arguments or {})
        if params.input_responses is not None and params.request_state:
            # the 2026-07-28 retry of a call that asked for input: its answers, then on
            outcome = await _answer_responses(params, caller)
        elif "run_id" in args:
            run_id, approve = args.get("run_id"), args.get("approve")
            if not isinstance(run_id, str) or not isinstance(approve, bool):
                raise McpInputError("answer a waiting run with run_id (string) and approve (boolean)")
            validate_id(run_id, "run_id")
            _, interrupts = await waiting_thread(backend, run_id, caller)
            if not interrupts:
                raise McpInputError(f"run {run_id!r} is not waiting for an answer")
            outcome = await answer(backend, params.name, run_id,
                                   {i.id: {"approved": True} if approve else None for i in interrupts}, caller)
        else:
            message, thread_id = args.get("message"), args.get("thread_id")
            if not isinstance(message, str) or not message.strip():
                raise McpInputError("message (a non-empty string) is required")
            if thread_id is not None:
                if not isinstance(thread_id, str):
                    raise McpInputError("thread_id must be a string")
                validate_id(thread_id, "thread_id")
            outcome = await start(backend, params.name, message, thread_id, caller)
        while outcome.status == "waiting" and outcome.interrupts and _wants_elicitation(ctx):
            if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS or not ctx.session.can_send_request:
                return _input_required(outcome)
            answers = {}
            for i in outcome.interrupts:
                message, schema = elicitation(i)
                result = await ctx.session.elicit_form(message, schema, related_request_id=ctx.request_id)
                try:
                    answers[i.id] = payload_of(i, result)
                except InvalidDecision as exc:
                    raise exc.about_run(outcome.run_id) from None
            outcome = await answer(backend, params.name, outcome.run_id, answers, caller)
        return outcome

    async def _answer_responses(params: types.CallToolRequestParams, caller: Any) -> Outcome:
        try:
            state = json.loads(params.request_state or "")
            run_id = state["run_id"]
            validate_id(run_id, "run_id")
        except (ValueError, TypeError, KeyError):
            raise McpInputError("requestState is not one this server gave") from None
        _, interrupts = await waiting_thread(backend, run_id, caller)
        responses = params.input_responses or {}
        answers: dict[str, Any] = {}
        for i in interrupts:
            got = responses.get(i.id)
            if not isinstance(got, types.ElicitResult):
                raise McpInputError(f"no answer for the open call {i.id!r}")
            try:
                answers[i.id] = payload_of(i, got)
            except InvalidDecision as exc:
                raise exc.about_run(run_id) from None
        if not interrupts:
            raise McpInputError(f"run {run_id!r} is not waiting for an answer")
        return await answer(backend, params.name, run_id, answers, caller)

    return Server("agentlog", version=_version(), instructions="Each tool is an agentlog agent: send it a message; "
                  "a run that needs a human asks through elicitation or answers a pending result with its run_id.",
                  on_list_tools=list_tools, on_call_tool=call_tool)


def _input_required(outcome: Outcome) -> types.InputRequiredResult:
    requests: dict[str, Any] = {}
    for i in outcome.interrupts:
        message, schema = elicitation(i)
        requests[i.id] = types.ElicitRequest(params=types.ElicitRequestFormParams(message=message,
                                                                                  requested_schema=schema))
    return types.InputRequiredResult(input_requests=requests,
                                     request_state=json.dumps({"run_id": outcome.run_id,
                                                               "thread_id": outcome.thread_id}))


def _error(code: str, message: str, run_id: str | None = None) -> types.CallToolResult:
    """A failed call; `run_id`: the run the error concerns, if any."""
    doc: dict[str, Any] = {"status": "failed", "error": {"code": code, "message": message}}
    if run_id is not None:
        doc["run_id"] = run_id
    return types.CallToolResult(content=[types.TextContent(type="text", text=f"error [{code}]: {message}")],
                                structured_content=doc, is_error=True)


def _version() -> str:
    from agentlog import __version__

    return __version__


__all__ = ["AGENT_INPUT", "APPROVAL_SCHEMA", "PRINCIPAL_SCOPE_KEY", "Outcome", "agent_tools", "build_server"]
