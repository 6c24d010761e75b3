"""OpenTelemetry spans (live and derived from the log) and the token / tool / model-latency
Prometheus metrics, on a real JetStream store, asserted with the SDK's InMemorySpanExporter."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from agentlog.eventlog.events import (
    Commit,
    InferenceCompleted,
    RunFinished,
    RunStarted,
    StepFinished,
    StepStarted,
    StoredCommit,
    Termination,
    ToolCallCompleted,
    ToolCallStarted,
    Usage,
)
from agentlog.runtime import AgentSpec, Runtime, ToolContext, tool
from agentlog.runtime.models.scripted import ScriptedModel, Turn
from agentlog.runtime.telemetry import AgentMetrics, LiveTracer, spans_from_commits, trace_run

from tests.support.runtime import store  # noqa: F401  (fixture)


@tool
async def add(a: int, b: int, ctx: ToolContext) -> int:
    """Add two integers."""
    return a + b


@tool
async def boom(ctx: ToolContext) -> int:
    """Always fails."""
    raise RuntimeError("kaput")


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _tree(spans: Any) -> list[tuple[str, str | None]]:
    """(name, parent name) of every finished span, sorted: the shape of the trace."""
    by_id = {s.context.span_id: s for s in spans}
    return sorted((s.name, by_id[s.parent.span_id].name if s.parent else None) for s in spans)


EXPECTED = [
    ("chat m", "step 1"),
    ("chat m", "step 2"),
    ("execute_tool add", "step 1"),
    ("execute_tool boom", "step 1"),
    ("invoke_agent calc", None),
    ("step 1", "invoke_agent calc"),
    ("step 2", "invoke_agent calc"),
]


@pytest.mark.asyncio
async def test_live_spans_and_trace_from_log_give_the_same_tree(store: Any) -> None:
    provider, exporter = _provider()
    registry = CollectorRegistry()
    model = ScriptedModel([Turn.tools(("add", {"a": 1, "b": 2}), ("boom", {})), Turn.text("3")], name="m")
    rt = Runtime(store, agents=[AgentSpec(id="calc", model="m", tools=["add", "boom"])], tools=[add, boom],
                 models={"m": model}, observers=[LiveTracer(provider.get_tracer("t")), AgentMetrics(registry)])
    result = await rt.run("calc", "add 1 and 2")
    assert result.termination.type == "natural_end"
    live = exporter.get_finished_spans()
    assert _tree(live) == EXPECTED
    # one trace; GenAI attributes on each kind of span
    assert len({s.context.trace_id for s in live}) == 1
    by_name = {s.name: s for s in live}
    run = by_name["invoke_agent calc"]
    assert run.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert run.attributes["gen_ai.agent.id"] == "calc"
    assert run.attributes["gen_ai.conversation.id"] == result.thread_id
    assert run.attributes["agentlog.termination"] == "natural_end"
    chat = by_name["chat m"]
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["gen_ai.request.model"] == "m"
    assert chat.attributes["gen_ai.usage.input_tokens"] >= 0
    tool_span = by_name["execute_tool add"]
    assert tool_span.attributes["gen_ai.tool.name"] == "add"
    assert tool_span.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool_span.status.is_ok
    failed = by_name["execute_tool boom"]
    assert not failed.status.is_ok and "kaput" in failed.status.description
    # every child lies inside its parent
    ids = {s.context.span_id: s for s in live}
    for s in live:
        if s.parent:
            p = ids[s.parent.span_id]
            assert p.start_time <= s.start_time and s.end_time <= p.end_time

    # after the fact, from the log alone: the same tree on a fresh provider
    provider2, exporter2 = _provider()
    commits = [sc async for sc in store.read_run(result.run_id)]
    trace_run(commits, result.run_id, provider2.get_tracer("t"))
    derived = exporter2.get_finished_spans()
    assert _tree(derived) == EXPECTED
    assert {(s.name, s.start_time, s.end_time) for s in derived} == {(s.name, s.start_time, s.end_time) for s in live}

    # Prometheus: tokens, tool calls, model latency from the same commits
    usage = result.run.usage
    assert registry.get_sample_value("agentlog_model_calls_total", {"model": "m"}) == 2
    assert registry.get_sample_value("agentlog_model_tokens_total", {"model": "m", "type": "input"}) == usage.input_tokens
    assert registry.get_sample_value("agentlog_model_tokens_total", {"model": "m", "type": "output"}) == usage.output_tokens
    assert registry.get_sample_value("agentlog_tool_calls_total", {"tool": "add", "outcome": "succeeded"}) == 1
    assert registry.get_sample_value("agentlog_tool_calls_total", {"tool": "boom", "outcome": "failed"}) == 1
    assert registry.get_sample_value("agentlog_model_latency_seconds_count", {"model": "m"}) == 2


def test_a_failing_observer_never_ends_a_run() -> None:
    """Observers are a side channel: one that raises is logged and skipped."""
    import asyncio

    from agentlog.eventlog.memory import MemoryEventStore

    def broken(_sc: StoredCommit) -> None:
        raise RuntimeError("observer bug")

    async def main() -> str:
        rt = Runtime(MemoryEventStore(), agents=[AgentSpec(id="a", model="m")],
                     models={"m": ScriptedModel([Turn.text("ok")])}, observers=[broken])
        return (await rt.run("a", "hi")).termination.type

    assert asyncio.run(main()) == "natural_end"


# -- the fold is pure: any split of a run's events into commits gives the same spans ----------------


def _events(steps: int) -> list[Any]:
    out: list[Any] = [RunStarted(run_id="r", agent_id="a")]
    for i in range(1, steps + 1):
        out += [StepStarted(step=i), InferenceCompleted(model="m", usage=Usage(input_tokens=i), duration_ms=1,
                                                        message_id=f"m{i}"),
                ToolCallStarted(call_id=f"c{i}", name="t", arguments={}),
                ToolCallCompleted(call_id=f"c{i}", outcome="succeeded", result=i, message_id=f"x{i}"),
                StepFinished(step=i)]
    return out + [RunFinished(termination=Termination(type="natural_end"), usage=Usage())]


@given(st.integers(min_value=0, max_value=4), st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=30))
def test_span_fold_is_independent_of_commit_boundaries(steps: int, cuts: list[int]) -> None:
    events = _events(steps)
    commits, i, seq = [], 0, 0
    while i < len(events):
        n = cuts[seq % len(cuts)]
        seq += 1
        commits.append(StoredCommit(seq, Commit(commit_id=f"k{seq}", thread_id="t", run_id="r", ts=100,
                                                events=events[i:i + n])))
        i += n
    spans = spans_from_commits("r", commits)
    assert [(s.name, s.parent) for s in spans] == (
        [("invoke_agent a", None)]
        + [x for k in range(1, steps + 1) for x in (
            (f"step {k}", "run:r"), ("chat m", f"step:r:{k}"), ("execute_tool t", f"step:r:{k}"))]
    )
    assert all(s.end_ms is not None for s in spans)
