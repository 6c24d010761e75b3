"""`agentlog trace RUN_ID`: a run's OpenTelemetry spans, derived after the fact from the log.

The spans are the ones the live tracer emits (`agentlog.runtime.telemetry`): run > step > chat /
execute_tool with GenAI semantic-convention attributes. `--json` prints them as plain JSON;
`--otlp URL` (or `$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) exports them over OTLP/HTTP; otherwise a
tree is printed.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.tree import Tree

from agentlog.eventlog.events import StoredCommit
from agentlog.eventlog.store import EventStore
from agentlog.projections.timeline import UnknownRun
from agentlog.runtime.telemetry import (
    SpanRecord,
    otlp_tracer_provider,
    records_json,
    spans_from_commits,
    trace_run,
)


async def run_commits(store: EventStore, run_id: str) -> list[StoredCommit]:
    commits = [sc async for sc in store.read_run(run_id)]
    if not commits:
        raise UnknownRun(run_id)
    return commits


async def trace(store: EventStore, run_id: str, *, as_json: bool, otlp: str | None, console: Console,
                emit_json: Any) -> int:
    commits = await run_commits(store, run_id)
    provider = otlp_tracer_provider(otlp)
    if provider is not None:
        records = trace_run(commits, run_id, provider.get_tracer("agentlog"))
        provider.shutdown()  # flushes the batch exporter
    else:
        records = spans_from_commits(run_id, commits)
    if as_json:
        emit_json({"run_id": run_id, "exported": provider is not None, "spans": records_json(records)})
    else:
        console.print(render_tree(records))
        if provider is not None:
            console.print(f"exported {len(records)} span(s) over OTLP")
    return 0


def render_tree(records: list[SpanRecord]) -> Tree:
    nodes: dict[str, Tree] = {}
    root: Tree | None = None
    for rec in records:
        dur = "open" if rec.end_ms is None else f"{rec.end_ms - rec.start_ms} ms"
        label = f"{rec.name} [dim]({dur})[/dim]" + (f" [red]error: {rec.error}[/red]" if rec.error else "")
        parent = nodes.get(rec.parent) if rec.parent else None
        node = parent.add(label) if parent is not None else Tree(label)
        if parent is None and root is None:
            root = node
        nodes[rec.key] = node
    return root or Tree("(no spans)")


__all__ = ["render_tree", "trace"]
