"""OpenTelemetry spans and Prometheus metrics of runs, both derived from the log's commits.

Why from commits: every fact a span or metric needs (when a step, an inference or a tool call
started and ended, its model, tokens, outcome) is already an event with its commit timestamp. So
one pure fold, `SpanFold`, serves both paths:

- live: `LiveTracer` is a `Runtime` commit observer; it feeds each commit this process writes to
  a per-run fold and opens / ends OpenTelemetry spans as the fold opens / closes them;
- after the fact: `trace_run(commits, tracer)` (used by `agentlog trace RUN_ID`) folds a run's
  recorded commits and emits the same span tree (run > step > inference / tool call).

Span names and attributes follow the OpenTelemetry GenAI semantic conventions
(`gen_ai.operation.name` = invoke_agent / chat / execute_tool, `gen_ai.request.model`,
`gen_ai.usage.input_tokens`, `gen_ai.tool.name`, ...). Everything here is a no-op unless a tracer
(or a metrics registry) is configured: the loop itself knows nothing of telemetry.

A run resumed in another process: that process's live spans cover what it executed (its run span
starts at the first commit it wrote and is marked `agentlog.resumed`); `agentlog trace` over the
whole log gives the one tree from `RunStarted` to `RunFinished`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentlog.eventlog.events import (
    InferenceCompleted,
    RunFinished,
    RunStarted,
    RunSuspended,
    StepFinished,
    StepStarted,
    StoredCommit,
    ToolCallCompleted,
    ToolCallGated,
    ToolCallStarted,
    ToolCallSuspended,
)
from agentlog.projections.views import FAILED_TERMINATIONS
from agentlog.runtime.models.extras import MissingExtra

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from agentlog.runtime.facade import Runtime

#: Environment variable naming an OTLP/HTTP traces endpoint (the OTel standard one).
OTLP_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"


@dataclass(slots=True)
class SpanRecord:
    """One span derived from the log. Times are unix ms (commit timestamps); `end_ms` is None
    while the span is open. `parent` is the key of the enclosing span (None for the run)."""

    key: str
    parent: str | None
    name: str
    start_ms: int
    attributes: dict[str, Any]
    end_ms: int | None = None
    error: str | None = None


@dataclass(slots=True)
class SpanFold:
    """A pure fold of one run's commits into spans. `apply(commit)` returns the keys it opened
    and the keys it closed, in that order, so a live exporter can mirror them."""

    run_id: str
    spans: dict[str, SpanRecord] = field(default_factory=dict)
    _step_key: str | None = None
    _tools: dict[str, str] = field(default_factory=dict)  # call_id -> span key
    _child_end: dict[str, int] = field(default_factory=dict)  # span key -> latest end of its children
    #: call_id -> the key of the step that made the call: a call run after an approval (its step
    #: ended when the run began to wait) is still that step's child
    _call_step: dict[str, str] = field(default_factory=dict)

    @property
    def run_key(self) -> str:
        return f"run:{self.run_id}"

    def _open(self, rec: SpanRecord, opened: list[str]) -> None:
        self.spans[rec.key] = rec
        opened.append(rec.key)

    def _close(self, key: str | None, ts: int, closed: list[str], error: str | None = None) -> None:
        if key is None:
            return
        rec = self.spans.get(key)
        if rec is not None and rec.end_ms is None:
            # a commit's ts is when its first event was staged, so a child (an inference timed
            # by its duration) can end after it: a parent never ends before its children
            rec.end_ms = max(ts, rec.start_ms, self._child_end.get(key, 0))
            if rec.parent is not None:
                self._child_end[rec.parent] = max(self._child_end.get(rec.parent, 0), rec.end_ms)
                parent = self.spans.get(rec.parent)
                if parent is not None and parent.end_ms is not None and parent.end_ms < rec.end_ms:
                    parent.end_ms = rec.end_ms  # a step that waited for an approval ends with its call
            rec.error = rec.error or error
            closed.append(key)

    def _ensure_run(self, sc: StoredCommit, opened: list[str], agent_id: str | None = None, **extra: Any) -> None:
        if self.run_key in self.spans and self.spans[self.run_key].end_ms is None:
            return
        c = sc.commit
        attrs = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.conversation.id": c.thread_id,
            "agentlog.run_id": self.run_id,
            "agentlog.thread_id": c.thread_id,
        }
        if agent_id:
            attrs["gen_ai.agent.id"] = agent_id
            attrs["gen_ai.agent.name"] = agent_id
        attrs.update({k: v for k, v in extra.items() if v is not None})
        name = f"invoke_agent {agent_id}" if agent_id else "invoke_agent"
        self._open(SpanRecord(self.run_key, None, name, c.ts, attrs), opened)

    def apply(self, sc: StoredCommit) -> tuple[list[str], list[str]]:
        opened: list[str] = []
        closed: list[str] = []
        c = sc.commit
        ts = c.ts
        start = next((e for e in c.events if type(e) is RunStarted), None)
        if start is not None:
            self._ensure_run(sc, opened, start.agent_id, **{
                "agentlog.parent_run_id": start.parent_run_id, "agentlog.parent_thread_id": start.parent_thread_id,
                "agentlog.origin": start.origin,
            })
        else:  # the first commit this fold sees of a run started elsewhere (a resume)
            self._ensure_run(sc, opened, None, **{"agentlog.resumed": True})
        for ev in c.events:
            # isinstance (not `type(ev) is`): mypy narrows the event union on it; event classes
            # are final structs (no subclasses), so the two tests agree
            if isinstance(ev, (ToolCallGated, ToolCallSuspended, ToolCallStarted)) and self._step_key is not None:
                self._call_step.setdefault(ev.call_id, self._step_key)
            if isinstance(ev, StepStarted):
                self._close(self._step_key, ts, closed)
                key = f"step:{self.run_id}:{ev.step}"
                self._step_key = key
                self._open(SpanRecord(key, self.run_key, f"step {ev.step}", ts, {"agentlog.step": ev.step}), opened)
            elif isinstance(ev, StepFinished):
                self._close(self._step_key, ts, closed)
                self._step_key = None
            elif isinstance(ev, InferenceCompleted):
                parent = self._step_key or self.run_key
                key = f"chat:{self.run_id}:{ev.message_id or len(self.spans)}"
                attrs = {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.request.model": ev.model,
                    "gen_ai.response.model": ev.model,
                    "gen_ai.usage.input_tokens": ev.usage.input_tokens,
                    "gen_ai.usage.output_tokens": ev.usage.output_tokens,
                    "agentlog.duration_ms": ev.duration_ms,
                }
                if ev.stop_reason:
                    attrs["gen_ai.response.finish_reasons"] = (ev.stop_reason,)
                if ev.message_id:
                    attrs["gen_ai.response.id"] = ev.message_id
                # the commit's ts was taken when its first event (StepStarted) was staged, just
                # before the model call: the call spans [ts, ts + duration]
                self._open(SpanRecord(key, parent, f"chat {ev.model}", ts, attrs), opened)
                self._close(key, ts + max(ev.duration_ms, 0), closed)
            elif isinstance(ev, ToolCallStarted):
                parent = self._call_step.get(ev.call_id, self.run_key)
                key = f"tool:{self.run_id}:{ev.call_id}"
                if key in self.spans and self.spans[key].end_ms is None:
                    continue
                self._tools[ev.call_id] = key
                self._open(SpanRecord(key, parent, f"execute_tool {ev.name}", ts, {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": ev.name,
                    "gen_ai.tool.call.id": ev.call_id,
                    "gen_ai.tool.type": "function",
                }), opened)
            elif isinstance(ev, ToolCallCompleted):
                tool_key = self._tools.pop(ev.call_id, None)
                if tool_key is not None:
                    self.spans[tool_key].attributes["agentlog.tool.outcome"] = ev.outcome
                    error = None if ev.outcome == "succeeded" else _error_text(ev.result, ev.outcome)
                    self._close(tool_key, ts, closed, error)
            elif isinstance(ev, ToolCallSuspended):
                tool_key = self._tools.pop(ev.call_id, None)
                if tool_key is not None:
                    self.spans[tool_key].attributes["agentlog.tool.outcome"] = "suspended"
                    self._close(tool_key, ts, closed)
            elif isinstance(ev, RunSuspended):
                self.spans[self.run_key].attributes["agentlog.waiting"] = True
            elif isinstance(ev, RunFinished):
                for key in list(self._tools.values()):
                    self._close(key, ts, closed)
                self._tools.clear()
                self._close(self._step_key, ts, closed)
                self._step_key = None
                run = self.spans[self.run_key]
                term = ev.termination
                run.attributes.pop("agentlog.waiting", None)
                run.attributes["agentlog.termination"] = term.type
                if term.code:
                    run.attributes["agentlog.termination.code"] = term.code
                run.attributes["gen_ai.usage.input_tokens"] = ev.usage.input_tokens
                run.attributes["gen_ai.usage.output_tokens"] = ev.usage.output_tokens
                failed = term.type in FAILED_TERMINATIONS
                self._close(self.run_key, ts, closed, term.detail or term.type if failed else None)
        return opened, closed

    def close_all(self, ts: int) -> list[str]:
        """End every open span at `ts` (the process lets go of a waiting run)."""
        closed: list[str] = []
        for key in [k for k, r in self.spans.items() if r.end_ms is None and k != self.run_key]:
            self._close(key, ts, closed)
        self._close(self.run_key, ts, closed)
        return closed


def _error_text(result: Any, outcome: str) -> str:
    if isinstance(result, Mapping) and isinstance(result.get("error"), str):
        return result["error"]
    return outcome


def spans_from_commits(run_id: str, commits: Iterable[StoredCommit]) -> list[SpanRecord]:
    """The span tree of one run, derived from its commits (pure)."""
    fold = SpanFold(run_id)
    for sc in commits:
        if sc.commit.run_id == run_id:
            fold.apply(sc)
    return list(fold.spans.values())


# == OpenTelemetry export =========================================================================


_MISSING = object()


def _ns(ms: int) -> int:
    return ms * 1_000_000


class _OtelSpans:
    """Mirror `SpanRecord`s as OpenTelemetry spans on `tracer` (opened with their recorded
    start, ended with their recorded end)."""

    def __init__(self, tracer: Any) -> None:
        from opentelemetry import trace

        self._trace = trace
        self.tracer = tracer
        self.live: dict[str, Any] = {}
        self._opened: dict[str, dict[str, Any]] = {}

    def open(self, rec: SpanRecord) -> None:
        parent = self.live.get(rec.parent) if rec.parent else None
        ctx = self._trace.set_span_in_context(parent) if parent is not None else None
        kind = self._trace.SpanKind.CLIENT if rec.key.startswith("chat:") else self._trace.SpanKind.INTERNAL
        span = self.tracer.start_span(
            rec.name, context=ctx, kind=kind, attributes=rec.attributes, start_time=_ns(rec.start_ms),
        )
        self.live[rec.key] = span
        self._opened[rec.key] = dict(rec.attributes)

    def close(self, rec: SpanRecord) -> None:
        span = self.live.pop(rec.key, None)
        if span is None:
            return
        at_open = self._opened.pop(rec.key, {})
        late = {k: v for k, v in rec.attributes.items() if at_open.get(k, _MISSING) != v}
        if late:  # only what the fold learned after the span opened (outcome, termination, usage)
            span.set_attributes(late)
        if rec.error is not None:
            from opentelemetry.trace import Status, StatusCode

            code = rec.attributes.get("agentlog.termination.code")
            span.set_attribute("error.type", code or ("tool_error" if rec.key.startswith("tool:") else "error"))
            span.set_status(Status(StatusCode.ERROR, rec.error))
        span.end(end_time=_ns(rec.end_ms or rec.start_ms))


def trace_run(commits: Iterable[StoredCommit], run_id: str, tracer: Any) -> list[SpanRecord]:
    """Emit the span tree of a recorded run on `tracer` (after the fact); returns the records.
    Spans still open in the log (a waiting run) are ended at their last known time."""
    records = spans_from_commits(run_id, commits)
    out = _OtelSpans(tracer)
    for rec in records:  # the fold opens parents before children
        out.open(rec)
    last = max((r.end_ms or r.start_ms for r in records), default=0)
    for rec in reversed(records):
        if rec.end_ms is None:
            rec.end_ms = last
        out.close(rec)
    return records


def records_json(records: Iterable[SpanRecord]) -> list[dict[str, Any]]:
    """Plain JSON of span records (`agentlog trace --json`)."""
    return [{
        "key": r.key, "parent": r.parent, "name": r.name, "start_ms": r.start_ms, "end_ms": r.end_ms,
        "status": "error" if r.error is not None else "ok", "error": r.error,
        "attributes": {k: list(v) if isinstance(v, tuple) else v for k, v in r.attributes.items()},
    } for r in records]


def otlp_tracer_provider(endpoint: str | None = None) -> Any:
    """A TracerProvider exporting over OTLP/HTTP to `endpoint` (or `$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`);
    None when neither is set (tracing stays off). Needs the `otel` extra (`MissingExtra` without it)."""
    endpoint = endpoint or os.environ.get(OTLP_ENV)
    if not endpoint:
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise MissingExtra("otel", f"exporting spans to {endpoint}", exc) from None

    provider = TracerProvider(resource=Resource.create({"service.name": "agentlog"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


class LiveTracer:
    """A `Runtime` commit observer that emits each run's spans as its commits are written.

    `LiveTracer(tracer)` with any OpenTelemetry tracer (e.g. `provider.get_tracer("agentlog")`).
    `run_released(run_id)` is called by the runtime when its loop lets go of a run (finished or
    waiting): spans still open then (a waiting run) are ended there."""

    def __init__(self, tracer: Any) -> None:
        self._folds: dict[str, SpanFold] = {}
        self._otel = _OtelSpans(tracer)

    def __call__(self, sc: StoredCommit) -> None:
        run_id = sc.commit.run_id
        if not run_id:
            return
        fold = self._folds.get(run_id)
        if fold is None:
            fold = self._folds[run_id] = SpanFold(run_id)
        opened, closed = fold.apply(sc)
        for key in opened:
            self._otel.open(fold.spans[key])
        for key in closed:
            self._otel.close(fold.spans[key])
        if fold.spans[fold.run_key].end_ms is not None:
            del self._folds[run_id]

    def run_released(self, run_id: str, ts: int) -> None:
        fold = self._folds.pop(run_id, None)
        if fold is not None:
            for key in fold.close_all(ts):
                self._otel.close(fold.spans[key])


# == Prometheus ===================================================================================


class AgentMetrics:
    """Token, tool call and model latency metrics, counted from commits (so the gateway, which
    follows the whole log, and a worker, which observes the commits it writes, count the same
    way). Registered on the given `prometheus_client` registry."""

    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter, Histogram

        self.tokens = Counter("agentlog_model_tokens_total", "Model tokens, by model and type (input/output, and cache_read/cache_write/reasoning when reported)",
                              ["model", "type"], registry=registry)
        self.inferences = Counter("agentlog_model_calls_total", "Model calls (inferences), by model",
                                  ["model"], registry=registry)
        self.latency = Histogram("agentlog_model_latency_seconds", "Model call latency (InferenceCompleted.duration_ms)",
                                 ["model"], registry=registry,
                                 buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
        self.tool_calls = Counter("agentlog_tool_calls_total", "Tool calls completed, by tool and outcome",
                                  ["tool", "outcome"], registry=registry)
        self.cost = Counter("agentlog_model_cost_usd_total",
                            "Model cost in USD (InferenceCompleted.cost, from the model's prices), by model",
                            ["model"], registry=registry)
        # per-run cost as a distribution: a label per run or thread would grow without bound
        self.run_cost = Histogram("agentlog_run_cost_usd", "Cost in USD of each finished run (RunFinished.cost)",
                                  registry=registry,
                                  buckets=(0.0001, 0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 50))
        self._names: dict[str, str] = {}  # call_id -> tool name (bounded by calls in flight)
        # labelled children, looked up once (`labels()` validates and locks on every call)
        self._per_model: dict[str, tuple[Any, Any, Any, Any]] = {}
        self._per_tool: dict[tuple[str, str], Any] = {}

    def __call__(self, sc: StoredCommit) -> None:
        self.observe(sc.commit)

    def _model(self, model: str) -> tuple[Any, Any, Any, Any]:
        got = self._per_model.get(model)
        if got is None:
            got = self._per_model[model] = (self.inferences.labels(model), self.tokens.labels(model, "input"),
                                            self.tokens.labels(model, "output"), self.latency.labels(model))
        return got

    def observe(self, commit: Any) -> None:
        for ev in commit.events:
            if isinstance(ev, InferenceCompleted):
                calls, tokens_in, tokens_out, latency = self._model(ev.model)
                calls.inc()
                tokens_in.inc(ev.usage.input_tokens)
                tokens_out.inc(ev.usage.output_tokens)
                latency.observe(max(ev.duration_ms, 0) / 1000)
                usage = ev.usage
                if usage.cache_read_tokens or usage.cache_write_tokens or usage.reasoning_tokens:
                    for kind in ("cache_read", "cache_write", "reasoning"):
                        if n := getattr(usage, f"{kind}_tokens"):
                            self.tokens.labels(ev.model, kind).inc(n)
                if ev.cost is not None:
                    self.cost.labels(ev.model).inc(ev.cost)
            elif isinstance(ev, RunFinished):
                if ev.cost is not None:
                    self.run_cost.observe(ev.cost)
            elif isinstance(ev, ToolCallStarted):
                self._names[ev.call_id] = ev.name
            elif isinstance(ev, ToolCallCompleted):
                key = (self._names.pop(ev.call_id, "unknown"), ev.outcome)
                child = self._per_tool.get(key)
                if child is None:
                    child = self._per_tool[key] = self.tool_calls.labels(*key)
                child.inc()


def instrument(runtime: Runtime, registry: CollectorRegistry | None = None, *,
               otlp_endpoint: str | None = None) -> Any:
    """Add this package's observers to a `Runtime`: `AgentMetrics` on `registry` (if given) and,
    when OTLP is configured (`otlp_endpoint` or `$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), a
    `LiveTracer` exporting there. Returns the tracer provider (None when tracing is off) so the
    caller can `shutdown()` it (flushes the batch exporter)."""
    if registry is not None:
        runtime.observers.append(AgentMetrics(registry))
    provider = otlp_tracer_provider(otlp_endpoint)
    if provider is not None:
        runtime.observers.append(LiveTracer(provider.get_tracer("agentlog")))
    return provider


__all__ = [
    "AgentMetrics", "instrument", "LiveTracer", "SpanFold", "SpanRecord", "otlp_tracer_provider", "records_json",
    "spans_from_commits", "trace_run",
]
