"""The loop's pure decisions: functions of (AgentSpec, RunContext, latest inputs) only.

`plan_call`, `resolve_gate`, `tool_specs`, `build_request`, `classify_result`, `stop_input` and
the request digests the loop records. No I/O, no clock, no ids: verified replay re-runs them
against a recorded log and must get the same answers. Kept apart from the driver
(`agentlog.runtime.loop.driver`) so that this stays checkably pure (import-linter forbids it the store and the
network).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from agentlog.eventlog.events import AnyEvent, Message, RunOverrides, SuspendTicket, ToolCall, ToolCallGated
from agentlog.runtime.agents.deferred import hidden, loadable_note
from agentlog.runtime.agents.spec import AgentSpec
from agentlog.runtime.context_policy import fit
from agentlog.runtime.digest import request_digest, request_part_digests
from agentlog.runtime.inputs.run_input import context_text, tool_allowed
from agentlog.runtime.loop.run_context import RunContext, due_context
from agentlog.runtime.models.base import ModelRequest, ToolSpec
from agentlog.runtime.plugins import (
    Action,
    AddContext,
    Block,
    ExcludeTools,
    Gate,
    IncludeOnlyTools,
    OverrideInference,
    SetResult,
    Suspend,
)
from agentlog.runtime.stop import StopInput
from agentlog.runtime.tools import InvalidToolArguments, Tool, ToolResult

_json = msgspec.json.Encoder()

#: The heading of the input filters' warnings in the system prompt.
INPUT_WARNINGS_HEADING = "Warnings about the user's input:"


@dataclass(frozen=True, slots=True)
class CallPlan:
    """A requested call, checked: `failure` says why it cannot run (unknown tool, bad args).
    `frontend`: a call to one of the run's frontend tools (no backend `tool`; it suspends for
    the client once its gate lets it through)."""

    call: ToolCall
    tool: Tool | None
    failure: str | None = None
    frontend: bool = False


def plan_call(call: ToolCall, tools: Mapping[str, Tool], frontend: Mapping[str, ToolSpec] | None = None,
              overrides: RunOverrides | None = None) -> CallPlan:
    """Check a requested call against the run's tool policy (its recorded `overrides`), the
    agent's tools, then the run's frontend tools (whose arguments go to the client as given:
    the client validates them)."""
    if not tool_allowed(overrides, call.name):
        return CallPlan(call, None, f"tool {call.name!r} is not allowed in this run")
    tool = tools.get(call.name)
    if tool is None and frontend and call.name in frontend:
        return CallPlan(call, None, frontend=True)
    if tool is None:
        available = ", ".join(sorted([*tools, *(frontend or ())])) or "none"
        return CallPlan(call, None, f"unknown tool {call.name!r}; available tools: {available}")
    try:
        tool.validate(call.arguments)
    except InvalidToolArguments as exc:
        return CallPlan(call, tool, str(exc))
    return CallPlan(call, tool)


@dataclass(frozen=True, slots=True)
class GateDecision:
    """What BeforeToolExecute decided for one call: `run`, `fail`, `result` or `suspend`."""

    kind: str
    events: tuple[AnyEvent, ...] = ()
    reason: str | None = None
    result: ToolResult | None = None
    ticket: SuspendTicket | None = None


def resolve_gate(call_id: str, actions: Sequence[Action]) -> GateDecision:
    """Combine BeforeToolExecute actions: block/deny > suspend/ask > set result > run. Every gate
    verdict is recorded (`ToolCallGated`), whichever wins."""
    gated: list[AnyEvent] = []
    block: str | None = None
    ticket: SuspendTicket | None = None
    result: ToolResult | None = None
    for action in actions:
        if isinstance(action, Gate):
            gated.append(ToolCallGated(call_id=call_id, verdict=action.verdict, rule=action.rule))
            if action.verdict == "deny" and block is None:
                block = action.reason or f"denied by permission rule {action.rule or 'default'}"
            elif action.verdict == "ask" and ticket is None:
                ticket = action.ticket or SuspendTicket(id=call_id, message=action.reason)
        elif isinstance(action, Block) and block is None:
            block = action.reason
        elif isinstance(action, Suspend) and ticket is None:
            ticket = action.ticket
        elif isinstance(action, SetResult) and result is None:
            result = action.result
    events = tuple(gated)
    if block is not None:
        return GateDecision("fail", events, reason=block)
    if ticket is not None:
        return GateDecision("suspend", events, ticket=ticket)
    if result is not None:
        return GateDecision("result", events, result=result)
    return GateDecision("run", events)


def tool_specs(spec: AgentSpec, tools: Mapping[str, Tool], actions: Sequence[Action], ctx: RunContext) -> list[ToolSpec]:
    """The tools offered to the model: the agent's, then the run's frontend tools (recorded
    order), those the run's tool policy lets run (`run_input.tool_allowed`), but the deferred
    tools not promoted yet, filtered by the plugins' exclude / include-only actions."""
    frontend = ctx.frontend_tools
    names = [n for n in [*spec.tools, *(n for n in frontend if n not in tools)] if tool_allowed(ctx.overrides, n)]
    if spec.deferred_tools:  # not offered until `tool_search` promotes them (agentlog.runtime.agents.deferred)
        later = hidden(names, spec.deferred_tools, ctx.state)
        names = [n for n in names if n not in later]
    for action in actions:
        if isinstance(action, ExcludeTools):
            names = [n for n in names if n not in action.names]
        elif isinstance(action, IncludeOnlyTools):
            names = [n for n in names if n in action.names]
    return [tools[n].spec if n in tools else frontend[n] for n in names if n in tools or n in frontend]


def build_request(
    spec: AgentSpec, ctx: RunContext, tools: list[ToolSpec], actions: Sequence[Action]
) -> ModelRequest:
    """The model request for this step: system prompt (+ client context, deferred tools, input
    warnings, the plugins' recorded context messages due now, their plain context), the
    thread's conversation, the tools on offer, options (+ overrides)."""
    overrides = ctx.overrides
    system = spec.system_prompt
    options = spec.model_options
    if overrides is not None:  # recorded in the run's RunStarted (agentlog.runtime.inputs.run_input)
        if overrides.system_prompt is not None:
            system = overrides.system_prompt
        if overrides.options:
            options = {**options, **overrides.options}
    client = context_text(ctx.client_context)
    if client:
        system = f"{system}\n\n{client}" if system else client
    if spec.deferred_tools:
        allowed = [n for n in spec.tools if tool_allowed(overrides, n)]
        note = loadable_note([n for n in allowed if n in hidden(allowed, spec.deferred_tools, ctx.state)])
        if note:
            system = f"{system}\n\n{note}" if system else note
    if ctx.input_warnings:
        warned = "\n".join([INPUT_WARNINGS_HEADING, *(f"- {w}" for w in ctx.input_warnings)])
        system = f"{system}\n\n{warned}" if system else warned
    for key in due_context(ctx) if ctx.context_messages else ():
        text = ctx.context_messages[key].text or ""
        system = f"{system}\n\n{text}" if system else text
    model_name = ctx.model or spec.model_name
    for action in actions:
        if isinstance(action, AddContext) and not action.recorded:  # recorded ones are in ctx
            system = f"{system}\n\n{action.text}" if system else action.text
        elif isinstance(action, OverrideInference):
            if action.model:
                model_name = action.model
            if action.options:
                options = {**options, **action.options}
    conversation = ctx.messages
    if spec.context is not None or ctx.compaction is not None:
        conversation = fit(spec.context, conversation, ctx.compaction)
    messages = [Message(id="system", role="system", content=system), *conversation] if system else list(conversation)
    return ModelRequest(model=model_name, messages=messages, tools=tools, options=options)


def classify_result(result: ToolResult) -> tuple[str, Any, str]:
    """(outcome, recorded result, message content for the model) of a finished call."""
    if result.status == "success":
        value = result.value
        return "succeeded", value, value if isinstance(value, str) else _json.encode(value).decode()
    if result.status == "error":
        error = result.error or "tool failed"
        recorded: dict[str, Any] = {"error": error}
        if result.value is not None:
            recorded["value"] = result.value
        return "failed", recorded, f"Error: {error}"
    raise ValueError(f"a {result.status!r} result does not complete a call")


def digest_of(request: ModelRequest) -> str:
    """sha256 of the canonical encoding of the model request, for
    `InferenceCompleted.request_digest` (`agentlog.runtime.digest`, which verified replay compares against).

    The digest is of the request the loop built (`build_request`), not of a fallback model's
    copy: the two differ only by the model name, which `InferenceCompleted.model` records, and a
    replay (whose first attempt always answers) rebuilds exactly this one."""
    return request_digest(request)


def part_digests_of(request: ModelRequest) -> dict[str, str]:
    """Per-part digests for `InferenceCompleted.request_digests` (agentlog.runtime.replay.verify names the
    changed part with them)."""
    return request_part_digests(request)


def stop_input(ctx: RunContext, now_ms: int) -> StopInput:
    return StopInput(
        rounds=ctx.step,
        elapsed_ms=now_ms - ctx.started_ms,
        total_tokens=ctx.usage.total_tokens,
        consecutive_errors=ctx.consecutive_errors,
        round_tools=ctx.round_tools,
        text=ctx.step_text,
        cost=ctx.cost or 0.0,
        budget_extensions=ctx.budget_extensions,
    )

