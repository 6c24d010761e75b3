#!/usr/bin/env python
"""Runtime step throughput: a 20-step tool run (ScriptedModel, one tool call per step) on the
durable JetStream store (embedded nats-server in a temp dir) vs the same on MemoryEventStore.

Prints a table, an optional profile of the durable step path, and as its very last line one JSON
object with every figure: {"bench": "runtime", ...}.

    scripts/bench_runtime.py            # default run (figures for closing notes)
    scripts/bench_runtime.py --quick    # < 60 s
    scripts/bench_runtime.py --profile  # + cProfile of the durable step path
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import structlog  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from eventlog import MemoryEventStore  # noqa: E402
from eventlog.jetstream import JetStreamEventStore  # noqa: E402
from eventlog.server import EmbeddedNatsServer  # noqa: E402
from runtime import AgentSpec, Runtime, ToolContext, tool  # noqa: E402
from runtime.models import ScriptedModel, Turn  # noqa: E402

STEPS = 20

#: Where profiled time goes, by the file a function lives in (first match wins).
AREAS = [
    ("runtime loop (runtime/loop.py, plugins, stop)", ("runtime/loop.py", "runtime/plugins.py", "runtime/stop.py",
                                                      "runtime/runtime.py", "runtime/entropy.py")),
    ("tools (runtime/tools.py, pydantic)", ("runtime/tools.py", "pydantic")),
    ("ScriptedModel (usage word counts, json.dumps)", ("runtime/models/", "json/")),
    ("state patches (projections.state, jsonpatch)", ("projections/state.py", "jsonpatch", "jsonpointer")),
    ("run view fold at result() (projections.fold)", ("projections/",)),
    ("event store (eventlog: codec, jetstream, memory)", ("eventlog/",)),
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


def make_runtime(store: Any) -> Runtime:
    model = ScriptedModel([Turn.tool("lookup", {"key": "alpha"}, text="checking")], loop=True)
    agent = AgentSpec(id="bench", model=model, tools=["lookup"], max_rounds=STEPS,
                      tool_execution_mode="sequential", system_prompt="You are a benchmark.")
    return Runtime(store, agents=[agent], tools=[lookup])


async def run_many(store: Any, runs: int) -> tuple[float, int, int]:
    """(seconds, steps, commits) for `runs` sequential 20-step runs."""
    rt = make_runtime(store)
    steps = commits = 0
    t0 = time.perf_counter()
    for _ in range(runs):
        handle = await rt.start("bench", "go")
        result = await handle.result()
        assert result.termination is not None and result.termination.code == "max_rounds", result.termination
        steps += result.run.steps
        commits += len(handle.commits)
    return time.perf_counter() - t0, steps, commits


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
    verdict = "meets" if js_rate >= 750 and js_rate / mem_rate >= 0.5 else "misses"
    console.print(
        f"durable: {js_rate:,.0f} steps/s ({verdict} targets >= 750 steps/s and ratio >= 0.5); "
        f"{js_rate / 250:.1f}x the best peer's ~250 steps/s"
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
