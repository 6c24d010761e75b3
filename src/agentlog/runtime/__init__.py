"""agentlog runtime: define tools and agents, run them on the log.

The names here, with the rooms `agentlog.runtime.inputs` (what comes into a run),
`agentlog.runtime.workers` (the command queue), `agentlog.runtime.models`,
`agentlog.runtime.replay` and `agentlog.runtime.config`, are the runtime's public face: the gateway
uses nothing else of it (an import-linter contract in pyproject.toml keeps it so).

    from agentlog.runtime import AgentSpec, Runtime, tool

    @tool
    def add(a: int, b: int) -> int:
        "Add two numbers."
        return a + b

    agent = AgentSpec(id="calc", model="gpt", tools=["add"], max_rounds=5)
    rt = Runtime(store, agents=[agent], tools=[add], models={"gpt": my_model})
    handle = await rt.start("calc", "what is 2+3?")      # returns once the run start is logged
    async for ev in handle.events(): ...                 # committed events, in log order
    result = await handle.result()                       # termination + final RunView
    await rt.cancel(handle.run_id)                       # cancel a running (or waiting) run
    res = await rt.decide(run_id, [{"target_id": call_id, "decision_id": "d1",
                                    "action": "resume", "result": {"approved": True}}])
    await res.handle.result()                            # the resumed run's next stop
    handle = await rt.resume(run_id)                     # continue an unfinished run from the log
                                                         # (any process; None if nothing to do)
    rt.signal_cancel(run_id)                             # cancel an in-process run, no append
    await rt.start("calc", "and 4+4?", parent_run_id=handle.run_id)  # continue the thread
    result = await rt.run("calc", "hi")                  # start + result
"""

from agentlog.runtime.agents.catalog import AgentApp, agent_catalog
from agentlog.runtime.agents.spec import (
    AgentRegistry,
    AgentSpec,
    ModelRegistry,
    RetryPolicy,
    ToolExecutionMode,
    UnknownAgent,
)
from agentlog.runtime.context_policy import ContextPolicy
from agentlog.runtime.errors import CommandRejected, RunConflict, RunEnded, RunNotFound, ThreadNotFound
from agentlog.runtime.facade import App, DecideResult, Runtime
from agentlog.runtime.inputs.request import RunRequest
from agentlog.runtime.live import LiveSink, MemoryLiveSink, NatsLiveSink, NullLiveSink
from agentlog.runtime.loop.entropy import DeterministicEntropy, Entropy, SystemEntropy
from agentlog.runtime.loop.hitl import (
    CallNotSuspended,
    HitlError,
    InvalidDecision,
    RunNotWaiting,
    UnknownCall,
)
from agentlog.runtime.loop.run_context import RunContext, apply_event
from agentlog.runtime.models.breaker import CircuitBreakerPolicy, CircuitBreakers
from agentlog.runtime.outage import is_transient
from agentlog.runtime.permission import STANDING_KEY, PermissionPlugin, PermissionRule
from agentlog.runtime.plugins import (
    ActionHandler,
    AddContext,
    AddUserMessage,
    Block,
    Effect,
    EffectSpec,
    Emit,
    ExcludeTools,
    Gate,
    HandOff,
    IncludeOnlyTools,
    OverrideInference,
    PatchState,
    PhaseContext,
    Plugin,
    PluginError,
    RejectInput,
    RemoveContext,
    Schedule,
    SetResult,
    Suspend,
    Terminate,
    WarnInput,
)
from agentlog.runtime.queued import recorded_ids
from agentlog.runtime.rules.reminders import ReminderPlugin, ReminderRule
from agentlog.runtime.runs.handle import CommittedEvent, RunHandle, RunResult
from agentlog.runtime.runs.intake import Access, CheckedDecisions, DecisionIntake, Handoff, check_decision_on
from agentlog.runtime.snapshots.format import RunSnapshot
from agentlog.runtime.snapshots.store import KVSnapshotStore, MemorySnapshotStore, SnapshotStore
from agentlog.runtime.stop import (
    ConsecutiveErrors,
    ContentMatch,
    LoopDetection,
    MaxRounds,
    StopOnTool,
    Timeout,
    TokenBudget,
)
from agentlog.runtime.telemetry import AgentMetrics, records_json, spans_from_commits
from agentlog.runtime.toolkits.mcp import McpServerConfig, McpToolset, mcp_health
from agentlog.runtime.toolkits.openapi import OpenApiConfig, load_openapi_tools
from agentlog.runtime.tools import Tool, ToolContext, ToolError, ToolRegistry, ToolResult, tool

__all__ = [
    "AddContext", "AddUserMessage", "AgentRegistry", "App", "AgentSpec", "Block", "CommittedEvent", "ContextPolicy",
    "McpServerConfig", "McpToolset",
    "ConsecutiveErrors", "ContentMatch", "DeterministicEntropy", "Entropy", "ExcludeTools", "Gate", "HandOff",
    "IncludeOnlyTools", "LiveSink", "LoopDetection", "MaxRounds", "MemoryLiveSink", "ModelRegistry",
    "NatsLiveSink", "NullLiveSink", "OverrideInference", "PatchState", "Emit", "PermissionPlugin",
    "PermissionRule", "PhaseContext", "Plugin", "PluginError", "RetryPolicy", "RunConflict",
    "RunContext", "RunHandle", "RunNotFound", "RunRequest", "RunResult", "Runtime", "SetResult", "StopOnTool",
    "Suspend", "SystemEntropy", "Terminate", "ThreadNotFound", "Timeout", "TokenBudget", "Tool", "ToolContext",
    "ToolError", "ToolExecutionMode", "ToolRegistry", "ToolResult", "apply_event", "tool",
    # human in the loop
    "CallNotSuspended", "DecideResult", "HitlError", "InvalidDecision", "RunNotWaiting", "UnknownCall",
    # run-context snapshots
    "KVSnapshotStore", "MemorySnapshotStore", "RunSnapshot", "SnapshotStore",
    # plugins' scheduled actions, effects, input filters, context messages; reminders
    "ActionHandler", "Effect", "EffectSpec", "RejectInput", "RemoveContext", "Schedule", "WarnInput", "ReminderPlugin",
    "ReminderRule",
    # models' circuit breakers, OpenAPI tools
    "CircuitBreakerPolicy", "CircuitBreakers", "OpenApiConfig", "load_openapi_tools",
    # for the gateway and the processes: decisions taken in, commands, catalogs, health
    "Access", "AgentApp", "AgentMetrics", "CheckedDecisions", "check_decision_on", "CommandRejected", "DecisionIntake", "Handoff",
    "RunEnded", "STANDING_KEY", "UnknownAgent", "agent_catalog", "is_transient", "mcp_health", "recorded_ids",
    "records_json", "spans_from_commits",
]
