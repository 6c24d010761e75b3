#!/usr/bin/env python
"""Runtime step throughput: a 20-step tool run (ScriptedModel, one tool call per step) on the
durable JetStream store (embedded nats-server in a temp dir) vs the same on MemoryEventStore.

Prints a table, an optional profile of the durable step path, and as its very last line one JSON
object with every figure: {"bench": "runtime", ...}.

    scripts/bench_runtime.py            # default run (figures for closing notes)
    scripts/bench_runtime.py --quick    # < 60 s
    scripts/bench_runtime.py --profile  # + cProfile of the durable step path

Cold resume (DESIGN 4.4): a run waits on a pending tool in a thread with 10 or 1,000 prior events;
a freshly constructed Runtime (new objects, `snapshots=KVSnapshotStore` holding the run-context
snapshot the waiting run's worker wrote when it suspended: the small entry, its chunks in this
process's chunk cache, as on the worker that ran it) takes the decision: latency from
`decide(..., thread_id=)` being called to the replayed tool starting, p50/p95 over many waiting
runs.

Features on: the same 20-step runs with the tool served by a real MCP server (stdio
subprocess, tests/fakes/mcp_server.py) and a context policy that shrinks, truncates and summarises
(a `ContextCompacted` every few steps), durable vs memory, interleaved the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import logging
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # agentlog from this checkout

import structlog
from rich.console import Console
from rich.table import Table

from agentlog.eventlog import MemoryEventStore
from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import (
    Commit,
    Message,
    MessageAppended,
    RunFinished,
    RunStarted,
    Termination,
    ThreadCreated,
)
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.runtime import (
    AgentSpec,
    ContextPolicy,
    McpServerConfig,
    McpToolset,
    Runtime,
    ToolContext,
    ToolResult,
    tool,
)
from agentlog.runtime.models import ScriptedModel, Turn
from agentlog.runtime.replay.verify import replay_throughput
from agentlog.runtime.snapshots.store import KVSnapshotStore

STEPS = 20

#: Where profiled time goes, by the file a function lives in (first match wins).
AREAS = [
    ("tools (src/agentlog/runtime/tools.py, pydantic)", ("src/agentlog/runtime/tools.py", "pydantic")),
    ("ScriptedModel (usage word counts, json.dumps)", ("src/agentlog/runtime/models/", "json/")),
    # the loop and its split parts (loop_*, run_context, decisions, digest), plugins, stop, the
    # runtime facade: everything else under agentlog.runtime
    ("runtime loop (agentlog.runtime: loop*, run_context, decisions, plugins, stop)", ("src/agentlog/runtime/",)),
    ("state patches (agentlog.projections.state, jsonpatch)", ("src/agentlog/projections/state.py", "jsonpatch", "jsonpointer")),
    ("run view fold at result() (agentlog.projections.fold)", ("src/agentlog/projections/",)),
    ("event store (agentlog.eventlog: codec, jetstream, memory)", ("src/agentlog/eventlog/",)),
    ("nats client (nats-py)", ("site-packages/nats/",)),
    ("sync tool thread hop (to_thread, threading, queue)", ("threading.py", "concurrent/", "queue", "to_thread",
                                                            "asyncio/threads.py")),
    ("asyncio event loop + selector + sockets", ("asyncio/", "selectors.py", "socket", "epoll")),
    ("msgspec (encode/decode)", ("msgspec",)),
]


def profile_areas(prof: cProfile.Profile) -> list[tuple[str, float]]:
    """Self time (tottime) summed per area, in seconds, largest first."""
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    totals: dict[str, float] = {}
    for (filename, _line, func), (_cc, _nc, tt, _ct, _callers) in stats.items():
        where = f"{filename}:{func}"
        area = next((name for name, keys in AREAS if any(k in where for k in keys)), "other (builtins, structlog...)")
        totals[area] = totals.get(area, 0.0) + tt
    return sorted(totals.items(), key=lambda kv: -kv[1])


@tool
def lookup(key: str, ctx: ToolContext) -> dict[str, Any]:
    """A typical small tool: reads its argument, writes one state key, returns a dict."""
    ctx.set("/last", key)
    return {"key": key, "value": len(key)}


class _DropSpans:
    """An OTel span exporter that keeps nothing (the bench measures producing spans, not I/O)."""

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 0) -> bool:
        return True


def make_runtime(store: Any) -> Runtime:
    model = ScriptedModel([Turn.tool("lookup", {"key": "alpha"}, text="checking")], loop=True)
    agent = AgentSpec(id="bench", model=model, tools=["lookup"], max_rounds=STEPS,
                      tool_execution_mode="sequential", system_prompt="You are a benchmark.")
    return Runtime(store, agents=[agent], tools=[lookup])


MCP_SERVER = Path(__file__).resolve().parent.parent / "tests" / "fakes" / "mcp_server.py"
#: Tight enough that a 20-step run compacts its context a few times.
FEATURE_CONTEXT = ContextPolicy(max_tokens=160, max_tool_result_tokens=50, summarize=True, summary_model="summarizer")


def make_feature_runtime(store: Any, toolset: McpToolset) -> Runtime:
    """`make_runtime` with the optional features on: the tool served by an MCP server, context
    compaction, live OTel spans (SDK tracer, batch processor), token/tool/latency Prometheus
    metrics, and the sub-agent tools + lineage observer."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from prometheus_client import CollectorRegistry

    from agentlog.runtime.telemetry import AgentMetrics, LiveTracer
    from agentlog.runtime.toolkits.subagents import SubAgents

    model = ScriptedModel([Turn.tool("mcp__bench__add", {"a": 2, "b": 3}, text="checking")], loop=True)
    summarizer = ScriptedModel(["the run so far: add(2, 3) returned 5, repeatedly"], loop=True)
    agent = AgentSpec(id="bench", model=model, tools=["mcp__bench__add"], max_rounds=STEPS,
                      tool_execution_mode="sequential", system_prompt="You are a benchmark.", context=FEATURE_CONTEXT)
    rt = Runtime(store, agents=[agent], tools=toolset.tools, models={"summarizer": summarizer})
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_DropSpans()))  # type: ignore[arg-type]
    rt.observers += [LiveTracer(provider.get_tracer("bench")), AgentMetrics(CollectorRegistry())]
    SubAgents().install(rt)
    return rt


async def run_many(store: Any, runs: int, rt: Runtime | None = None) -> tuple[float, int, int]:
    """(seconds, steps, commits) for `runs` sequential 20-step runs."""
    rt = rt or make_runtime(store)
    steps = commits = 0
    t0 = time.perf_counter()
    for _ in range(runs):
        handle = await rt.start("bench", "go")
        result = await handle.result()
        assert result.termination is not None and result.termination.code == "max_rounds", result.termination
        steps += result.run.steps
        commits += len(handle.commits)
    return time.perf_counter() - t0, steps, commits


async def verified_replay(store: Any, runs: int) -> tuple[float, int, int]:
    """(seconds, events, commits) to verify `runs` recorded 20-step runs read from `store`:
    the loop re-executed with models, tools, ids and clock answering from the log, every commit
    compared (agentlog.runtime.replay.verify; scripts/bench_replay.py has the detailed breakdown)."""
    rt = make_runtime(store)
    ids = []
    for _ in range(runs):
        handle = await rt.start("bench", "go")
        await handle.result()
        ids.append(handle.run_id)
    app = make_runtime(MemoryEventStore())  # the user's app: only its agents and tools are used
    # tools re-executed (verify_run answers them from the log by default), so the figure includes them
    await replay_throughput(store, ids[:1], app, tools_from_log=False)  # warm up
    r = await replay_throughput(store, ids, app, tools_from_log=False)
    return r.seconds, r.events, r.commits


_tool_started: list[float] = []


@tool
def approve(ctx: ToolContext) -> Any:
    """Pending until decided; records when its replay starts (the cold-resume latency's end)."""
    if ctx.decision is None:
        return ToolResult.pending(f"t-{ctx.call_id}", resume_mode="pass_decision_to_tool")
    _tool_started.append(time.perf_counter())
    return "approved"


def resume_runtime(store: Any, snapshots: Any = None) -> Runtime:
    model = ScriptedModel([lambda req: "ok" if req.messages[-1].role == "tool" else Turn.tool("approve")], loop=True)
    agent = AgentSpec(id="cold", model=model, tools=["approve"], tool_execution_mode="sequential")
    return Runtime(store, agents=[agent], tools=[approve], snapshots=snapshots)


async def prefill(store: Any, thread_id: str, events: int) -> None:
    """A thread with `events` prior events: a finished earlier run, messages 8 per commit."""
    seq = 0
    evs: list[Any] = [ThreadCreated(), RunStarted(run_id=f"{thread_id}-r0", agent_id="cold")]
    n = 0
    while len(evs) + n < events - 1:
        role = "user" if n % 2 == 0 else "assistant"
        evs.append(MessageAppended(message=Message(id=f"{thread_id}-m{n}", role=role, content=f"message {n} " * 8)))
        n += 1
        if len(evs) == 8:
            seq = (await store.append(Commit(commit_id=f"{thread_id}-c{n}", thread_id=thread_id,
                                             run_id=f"{thread_id}-r0", ts=1, events=evs), seq)).seq
            evs = []
    evs.append(RunFinished(termination=Termination(type="natural_end")))
    await store.append(Commit(commit_id=f"{thread_id}-end", thread_id=thread_id, run_id=f"{thread_id}-r0",
                              ts=1, events=evs), seq)


async def cold_resume(store: Any, history: int, samples: int, snapshots: Any = None) -> list[float]:
    """Latencies (ms) from decide() on a brand-new Runtime to the replayed tool starting.

    With `snapshots` (a KVSnapshotStore), the waiting run's worker wrote its run-context snapshot
    when it suspended (awaited here, untimed); the tail after it is empty."""
    out: list[float] = []
    for i in range(samples):
        thread_id = f"cold{history}x{i}"
        await prefill(store, thread_id, history)
        first = resume_runtime(store, snapshots)
        waiting = await first.run("cold", "go", thread_id=thread_id, parent_run_id=f"{thread_id}-r0")
        assert waiting.status == "waiting", waiting
        await first.flush_snapshots()
        _tool_started.clear()
        t0 = time.perf_counter()
        fresh = resume_runtime(store, snapshots)  # new objects: nothing of the waiting run in memory
        res = await fresh.decide(waiting.run_id, [{"target_id": "call_0_0", "decision_id": f"d{i}",
                                                   "action": "resume", "result": {"ok": True}}],
                                 thread_id=thread_id)
        done = await res.handle.result()  # type: ignore[union-attr]
        assert done.status == "done" and _tool_started, done
        out.append(1000 * (_tool_started[0] - t0))
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def raw_publish(store: JetStreamEventStore, n: int) -> float:
    """Baseline: plain JetStream publish+ack of a small payload, one at a time (seconds per op)."""
    js = store.nc.jetstream()
    await js.add_stream(name="BENCH_RAW", subjects=["bench.raw"])
    payload = b'{"x":' + b"1" * 200 + b"}"
    t0 = time.perf_counter()
    for _ in range(n):
        await js.publish("bench.raw", payload)
    dt = time.perf_counter() - t0
    await js.delete_stream("BENCH_RAW")
    return dt / n


async def features_on(store: Any, rounds: int, per_round: int) -> dict[str, Any]:
    """Durable vs memory with an MCP tool and context compaction on (best interleaved rounds)."""
    toolset = await McpToolset([McpServerConfig(name="bench", command=sys.executable,
                                                args=[str(MCP_SERVER), "stdio"])]).astart()
    try:
        mem = MemoryEventStore()
        js_rt, mem_rt = make_feature_runtime(store, toolset), make_feature_runtime(mem, toolset)
        await run_many(store, 1, js_rt)
        await run_many(mem, 1, mem_rt)
        js_best = mem_best = (float("inf"), 1, 1)
        for _ in range(rounds):
            js_best = min(js_best, await run_many(store, per_round, js_rt), key=lambda r: r[0] / r[1])
            mem_best = min(mem_best, await run_many(mem, per_round, mem_rt), key=lambda r: r[0] / r[1])
        compactions = sum(1 for sc in mem._log for e in sc.commit.events if type(e).__name__ == "ContextCompacted")  # noqa: SLF001
        mem_runs = sum(1 for sc in mem._log for e in sc.commit.events if type(e).__name__ == "RunStarted")  # noqa: SLF001
    finally:
        await toolset.aclose()
    js_rate, mem_rate = js_best[1] / js_best[0], mem_best[1] / mem_best[0]
    return {"features_durable_steps_per_s": round(js_rate, 1), "features_memory_steps_per_s": round(mem_rate, 1),
            "features_durable_vs_memory_ratio": round(js_rate / mem_rate, 3),
            "features_compactions_per_run": round(compactions / mem_runs, 2)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller run, < 60 s")
    parser.add_argument("--runs", type=int, default=None, help="runs per store (default 100, quick 15)")
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile of the durable step path")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    runs = args.runs or (15 if args.quick else 100)
    console = Console(stderr=False)

    figures: dict[str, Any] = {"bench": "runtime", "quick": args.quick, "runs": runs, "steps_per_run": STEPS}
    rounds = 3 if args.quick else 5
    per_round = max(1, runs // rounds)
    mem = MemoryEventStore()
    with tempfile.TemporaryDirectory(prefix="agentlog-bench-") as tmp:
        server = EmbeddedNatsServer(Path(tmp) / "nats")
        server.start()
        try:
            store = await JetStreamEventStore.connect(server.url)
            try:
                await run_many(store, 2)  # warm up (connections, stream, code paths)
                await run_many(mem, 2)
                # Interleave the two stores in rounds and keep each one's best round: this 2-core
                # machine is shared, and interleaving exposes both to the same background load.
                js_best = mem_best = (float("inf"), 1, 1)
                for _ in range(rounds):
                    js_best = min(js_best, await run_many(store, per_round), key=lambda r: r[0] / r[1])
                    mem_best = min(mem_best, await run_many(mem, per_round), key=lambda r: r[0] / r[1])
                js_s, js_steps, js_commits = js_best
                mem_s, mem_steps, mem_commits = mem_best
                raw = await raw_publish(store, 500 if args.quick else 2000)
                samples = 15 if args.quick else 50
                snaps = await KVSnapshotStore.open(store.nc)
                await cold_resume(store, 10, 3, snaps)  # warm up
                cold = {h: await cold_resume(store, h, samples, snaps) for h in (10, 1000)}
                rp_s, rp_events, rp_commits = await verified_replay(store, 10 if args.quick else 40)
                feat = await features_on(store, rounds, max(1, per_round // 2))
                areas: list[tuple[str, float]] = []
                top_text = ""
                if not args.no_profile:
                    prof = cProfile.Profile()
                    prof.enable()
                    _, prof_steps, _ = await run_many(store, max(5, runs // 3))
                    prof.disable()
                    areas = profile_areas(prof)
                    buf = io.StringIO()
                    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
                    top_text = buf.getvalue()
            finally:
                await store.close()
        finally:
            server.stop()

    js_rate = js_steps / js_s
    mem_rate = mem_steps / mem_s
    figures.update(
        rounds=rounds,
        runs_per_round=per_round,
        durable_steps_per_s=round(js_rate, 1),
        durable_ms_per_step=round(1000 * js_s / js_steps, 3),
        memory_steps_per_s=round(mem_rate, 1),
        memory_ms_per_step=round(1000 * mem_s / mem_steps, 3),
        durable_vs_memory_ratio=round(js_rate / mem_rate, 3),
        commits_per_step=round(js_commits / js_steps, 3),
        raw_publish_ms=round(raw * 1000, 3),
        durable_step_in_raw_publishes=round((js_s / js_steps) / raw, 2),
        target_ratio=0.5,
        target_durable_steps_per_s=750,
        peer_durable_steps_per_s=250,
        durable_vs_peer_ratio=round(js_rate / 250, 2),
    )

    table = Table(title=f"runtime: {STEPS}-step tool runs, best of {rounds} interleaved rounds x {per_round} runs "
                        "(ScriptedModel, sequential, 1 tool/step)")
    table.add_column("store")
    table.add_column("steps/s", justify="right")
    table.add_column("ms/step", justify="right")
    table.add_column("commits/step", justify="right")
    table.add_column("vs memory", justify="right")
    table.add_row("MemoryEventStore", f"{mem_rate:,.0f}", f"{1000 * mem_s / mem_steps:.3f}",
                  f"{mem_commits / mem_steps:.2f}", "1.00")
    table.add_row("JetStream (durable)", f"{js_rate:,.0f}", f"{1000 * js_s / js_steps:.3f}",
                  f"{js_commits / js_steps:.2f}", f"{js_rate / mem_rate:.2f}")
    table.add_row("raw JetStream publish+ack", f"{1 / raw:,.0f} ops/s", f"{raw * 1000:.3f}", "", "")
    console.print(table)
    cold_table = Table(title=f"cold resume: decide() on a new Runtime -> replayed tool starts ({samples} waiting runs each)")
    cold_table.add_column("prior events in thread", justify="right")
    cold_table.add_column("p50 ms", justify="right")
    cold_table.add_column("p95 ms", justify="right")
    cold_table.add_column("target p50", justify="right")
    cold_table.add_column("p50 in raw publishes", justify="right")
    for h, target in ((10, 10.0), (1000, 15.0)):
        p50, p95 = pct(cold[h], 0.5), pct(cold[h], 0.95)
        figures[f"cold_resume_{h}_p50_ms"] = round(p50, 3)
        figures[f"cold_resume_{h}_p95_ms"] = round(p95, 3)
        figures[f"cold_resume_{h}_target_p50_ms"] = target
        figures[f"cold_resume_{h}_p50_in_raw_publishes"] = round(p50 / (raw * 1000), 2)
        cold_table.add_row(f"{h:,}", f"{p50:.2f}", f"{p95:.2f}", f"<= {target:.0f}", f"{p50 / (raw * 1000):.1f}")
    figures["cold_resume_1000_vs_10_p50_ratio"] = round(figures["cold_resume_1000_p50_ms"] / figures["cold_resume_10_p50_ms"], 2)
    figures["cold_resume_samples"] = samples
    console.print(cold_table)
    replay_table = Table(title="verified replay (agentlog.runtime.replay.verify.verify_run): recorded 20-step runs read from JetStream")
    for col in ("events verified", "commits verified", "seconds", "events/s"):
        replay_table.add_column(col, justify="right")
    replay_table.add_row(f"{rp_events:,}", f"{rp_commits:,}", f"{rp_s:.3f}", f"{rp_events / rp_s:,.0f}")
    console.print(replay_table)
    figures.update(feat)
    figures["features_durable_vs_plain_durable_ratio"] = round(feat["features_durable_steps_per_s"] / js_rate, 3)
    feat_table = Table(title="features on: tool served by an MCP server (stdio), context compaction "
                             f"({feat['features_compactions_per_run']} ContextCompacted per 20-step run), live OTel "
                             "spans, token/tool/latency metrics, sub-agent tools")
    for col in ("store", "steps/s", "vs memory"):
        feat_table.add_column(col, justify="right")
    feat_table.add_row("MemoryEventStore", f"{feat['features_memory_steps_per_s']:,.0f}", "1.00")
    feat_table.add_row("JetStream (durable)", f"{feat['features_durable_steps_per_s']:,.0f}",
                       f"{feat['features_durable_vs_memory_ratio']:.2f}")
    console.print(feat_table)
    figures["verified_replay_events_per_s"] = round(rp_events / rp_s, 1)
    figures["verified_replay_events"] = rp_events
    rate_ok = "meets" if js_rate >= 750 else "MISSES"
    ratio_ok = "meets" if js_rate / mem_rate >= 0.5 else "MISSES"
    console.print(
        f"durable: {js_rate:,.0f} steps/s ({rate_ok} target >= 750 steps/s), ratio to memory "
        f"{js_rate / mem_rate:.2f} ({ratio_ok} target >= 0.5); {js_rate / 250:.1f}x the best peer's ~250 steps/s"
    )
    if areas:
        total = sum(t for _, t in areas)
        prof_table = Table(title=f"where a durable step's time goes (cProfile self time, {prof_steps} steps; "
                                 "profiling inflates Python-heavy parts)")
        prof_table.add_column("area")
        prof_table.add_column("us/step", justify="right")
        prof_table.add_column("share", justify="right")
        for name, t in areas:
            prof_table.add_row(name, f"{1e6 * t / prof_steps:.0f}", f"{100 * t / total:.1f}%")
            figures[f"profile_share_{name.split(' (')[0].replace(' ', '_').replace('+', '').replace('__', '_')}"] = round(t / total, 3)
        console.print(prof_table)
        if "--verbose" in sys.argv:
            print(top_text)
    print(json.dumps(figures))


if __name__ == "__main__":
    asyncio.run(main())
