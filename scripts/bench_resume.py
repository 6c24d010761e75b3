#!/usr/bin/env python
"""Cold resume and run views against run length, on an embedded nats-server.

Histories are built by real approval cycles in ONE run: the agent asks for approval (a pending
tool), a decision resumes it, the tool answers, the model asks again. Short: 2 cycles; long: 222
cycles (~890 commits, ~3,100 events, ~450 messages).

Cold resume = a new connection + a new Runtime (nothing in memory), then
`decide(approve)` -> the tool runs -> a model turn -> the next `ask` suspension is committed
(`handle.result()` returns). p50 of the best round of samples (all samples' p50 also shown),
for three ways of loading the run:

- fold:      `Runtime(store)`: fold the whole thread from the log (the baseline);
- views:     `Runtime(views=KVViewStore)`: thread view snapshot + run commits + older messages;
- snapshots: `Runtime(snapshots=KVSnapshotStore)`: one KV get (the run's small entry) + the
             thread's tail; the entry's chunks (messages, finished calls) come from this
             process's chunk cache, as on a worker that ran or resumed the run before;
- snapshots_cold: the same with the chunk cache emptied first (a worker process that never saw
             the run: the entry and its chunks are read in one batched get, then the tail).

Before each sample the view / snapshot is made current (untimed), as a caught-up projection
runner or the previous cycle's worker would have left it. Modes are interleaved per sample, so
all see the same machine load. Each sample moves its run on by one cycle (4 commits): every mode
has its own long runs, one per 15 samples (`long_runs_per_mode`), taken in turn, so each ends at
most 15 cycles past 222 (the JSON's `long_commits_end`, `long_messages_end`: the first of them),
and every short sample decides a new run of exactly 2 cycles (built untimed). (Until this was
changed, one short and one long run took all modes' samples in turn: "short" ended 61 cycles
long in `--quick`, 182 in a default run, which flattered `long_over_short`; and with one long
run per mode, more samples meant a longer "long" run.)

Besides wall time, each sample's client CPU (`time.thread_time()` of the timed region: the
runtime's own work, without the waits for the server or for a core) is reported (`*_cpu_p50_ms`,
`*_cpu_long_over_short`): on this shared 2-core machine it varies far less than wall time.

With snapshots the run's new snapshot is written in the background after the suspension commit
(`Runtime.flush_snapshots`, untimed); the scripted model is given its usage figures; every sample
starts after a `gc.collect()` (untimed), so none pays for the garbage another mode's sample left
(the fold of 1,113 commits leaves a lot, and its collection would land in the next sample).

Also `RunHandle.result()` on a finished run of 2 vs 230 tool steps (p50 of repeated calls).

    scripts/bench_resume.py            # default run (figures for closing notes), ~70 s
    scripts/bench_resume.py --quick    # < 60 s (~30 s)

The last line is one JSON object with every figure: {"bench": "resume", "short_p50_ms": ...}.
The headline keys (`short_p50_ms`, `long_p50_ms`, `long_over_short`, `long_vs_fold`) are the
cold process (`snapshots_cold`: what a decision routed to any worker must expect); the warm chunk
cache is in `warm_short_p50_ms`, `warm_long_p50_ms`, `warm_long_over_short`, `warm_long_vs_fold`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # agentlog from this checkout

import structlog
from rich.console import Console
from rich.table import Table

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import Usage
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.projections.fold import fold_commits
from agentlog.projections.kv import KVViewStore
from agentlog.runtime import AgentSpec, Runtime, ToolContext, ToolResult, tool
from agentlog.runtime.models import ScriptedModel, Turn
from agentlog.runtime.snapshots.format import CHUNKS
from agentlog.runtime.snapshots.store import KVSnapshotStore

MODES = ("fold", "views", "snapshots", "snapshots_cold")
#: Given, so the scripted model does not count the words of the whole conversation on every turn
#: (a real model's tokenizer runs at the provider): the figures are the runtime's own work.
USAGE = Usage(input_tokens=100, output_tokens=10)
SHORT, LONG = 2, 222


@tool
def approve(why: str, ctx: ToolContext) -> Any:
    """Pending until a human decides, then approved."""
    if ctx.decision is None:
        return ToolResult.pending(f"t-{ctx.call_id}", resume_mode="pass_decision_to_tool")
    return "approved"


@tool
def work(n: int) -> int:
    """A tool that just answers (for the result() figure)."""
    return n + 1


def ask_again(req: Any) -> Turn:
    """Ask for approval after every answer; the call id comes from the conversation, so a fresh
    model (a cold Runtime) keeps the numbering."""
    asked = sum(1 for m in req.messages if m.role == "assistant")
    return Turn.tool("approve", {"why": f"cycle {asked}"}, id=f"ask{asked}", text=f"asking approval #{asked}",
                     usage=USAGE)


def cycler(store: Any, *, views: Any = None, snapshots: Any = None) -> Runtime:
    agent = AgentSpec(id="cycler", model=ScriptedModel([ask_again], loop=True), tools=["approve"],
                      tool_execution_mode="sequential", max_rounds=10 * LONG)
    return Runtime(store, agents=[agent], tools=[approve], views=views, snapshots=snapshots)


def waiting_call(run: Any) -> str:
    return next(c for c, v in run.calls.items() if v.status == "suspended")


def decision(call: str, n: int) -> dict[str, Any]:
    return {"target_id": call, "decision_id": f"dec{n}", "action": "resume", "result": {"ok": True}}


async def build(store: Any, snapshots: Any, thread_id: str, cycles: int) -> tuple[str, str]:
    """One run through `cycles` approval cycles (warm Runtime); returns (run id, waiting call)."""
    rt = cycler(store, snapshots=snapshots)
    result = await rt.run("cycler", "please do the thing", thread_id=thread_id, run_id=f"{thread_id}-run")
    for n in range(cycles):
        res = await rt.decide(result.run_id, [decision(waiting_call(result.run), n)], thread_id=thread_id)
        result = await res.handle.result()  # type: ignore[union-attr]
        assert result.status == "waiting", result
    await rt.flush_snapshots()
    return result.run_id, waiting_call(result.run)


async def make_current(store: Any, mode: str, thread_id: str, run_id: str) -> None:
    """Untimed: the thread view (views) or the run snapshot (snapshots) as of the log's head."""
    commits = [sc async for sc in store.read_thread(thread_id)]
    if mode == "views":
        views = await KVViewStore.open(store.nc)
        await views.put_views(fold_commits(commits).threads.values(), [])
    elif mode.startswith("snapshots"):
        await cycler(store, snapshots=await KVSnapshotStore.open(store.nc)).write_snapshot(run_id, thread_id=thread_id)


async def cold_sample(url: str, mode: str, thread_id: str, run_id: str, call: str, n: int) -> tuple[float, float, str]:
    """One cold resume; returns (ms, ms of this thread's CPU in it, the next waiting call)."""
    store = await JetStreamEventStore.connect(url)
    try:
        await make_current(store, mode, thread_id, run_id)
        views = await KVViewStore.open(store.nc) if mode == "views" else None
        snaps = await KVSnapshotStore.open(store.nc) if mode.startswith("snapshots") else None
        rt = cycler(store, views=views, snapshots=snaps)
        if mode == "snapshots_cold":
            CHUNKS.clear()  # untimed: a process that never saw this run
        gc.collect()  # untimed: no sample pays for the garbage of the one before (another mode's)
        t0, c0 = time.perf_counter(), time.thread_time()
        res = await rt.decide(run_id, [decision(call, n)], thread_id=thread_id)
        result = await res.handle.result()  # type: ignore[union-attr]
        ms, cpu = 1000 * (time.perf_counter() - t0), 1000 * (time.thread_time() - c0)
        await rt.flush_snapshots()  # untimed: the snapshot write runs after the result
        assert result.status == "waiting", result
        return ms, cpu, waiting_call(result.run)
    finally:
        await store.close()


async def result_p50(store: Any, steps: int, calls: int) -> float:
    """p50 (ms) of `handle.result()` on a finished run of `steps` tool steps."""
    script: list[Any] = [Turn.tool("work", {"n": i}) for i in range(steps - 1)] + ["done"]
    agent = AgentSpec(id="worker", model=ScriptedModel(script), tools=["work"], max_rounds=steps + 5)
    handle = await Runtime(store, agents=[agent], tools=[work]).start("worker", "go")
    first = await handle.result()
    assert first.status == "done" and first.run.steps == steps, first
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        await handle.result()
        out.append(1000 * (time.perf_counter() - t0))
    return pct(out, 0.5)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer samples, < 60 s")
    parser.add_argument("--rounds", type=int, help="rounds of samples (default: 5 with --quick, else 7)")
    parser.add_argument("--per-round", type=int, help="samples per round (default: 9 with --quick, else 15)")
    parser.add_argument("--long", type=int, default=LONG,
                        help=f"approval cycles of the long history (default {LONG}; fewer only to check this script runs)")
    args = parser.parse_args()
    long_cycles = args.long
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    # --quick was 3 rounds x 5: its long/short moved from 1.42 to 1.64 between runs of the same
    # code on this machine (a p50 of 5 samples); 45 samples still take ~30 s
    rounds, per_round = (5, 9) if args.quick else (7, 15)
    rounds, per_round = args.rounds or rounds, args.per_round or per_round
    samples = rounds * per_round
    #: Cycles a long run may grow by in the samples (each sample moves the run it decides on by
    #: one): with one long run per mode, 105 samples ended it at 327 cycles, 656 messages.
    growth = 15
    long_runs = -(-samples // growth)
    console = Console()
    figures: dict[str, Any] = {"bench": "resume", "quick": args.quick, "samples": samples, "rounds": rounds,
                               "short_cycles": SHORT, "long_cycles": long_cycles, "long_runs_per_mode": long_runs}
    #: (history, mode) -> one list of latencies per round
    lat: dict[tuple[str, str], list[list[float]]] = {(h, m): [[] for _ in range(rounds)]
                                                     for h in ("short", "long") for m in MODES}
    #: (history, mode) -> client CPU (ms, this thread) of every sample: less noisy than wall time
    #: on a shared machine (it leaves out the time spent waiting for the server or for a core)
    cpu: dict[tuple[str, str], list[float]] = {(h, m): [] for h in ("short", "long") for m in MODES}
    #: (history, mode) -> every sample's latency in order: short and long sample i of a mode ran
    #: back to back, so their ratio leaves out the drift of this shared machine's speed
    flat: dict[tuple[str, str], list[float]] = {(h, m): [] for h in ("short", "long") for m in MODES}
    shape: dict[str, tuple[int, int, int]] = {}
    with tempfile.TemporaryDirectory(prefix="agentlog-bench-resume-") as tmp:
        server = EmbeddedNatsServer(Path(tmp) / "nats")
        server.start()
        try:
            store = await JetStreamEventStore.connect(server.url)
            try:
                snaps = await KVSnapshotStore.open(store.nc)
                runs: dict[str, list[Any]] = {}

                async def shape_of(thread_id: str) -> tuple[int, int, int]:
                    log = [sc async for sc in store.read_thread(thread_id)]
                    return (len(log), sum(len(sc.commit.events) for sc in log),
                            sum(1 for sc in log for e in sc.commit.events if type(e).__name__ == "MessageAppended"))

                # long runs per mode, taken in turn: each sample moves one on by a cycle, so each
                # ends at most GROWTH cycles past LONG; the short run is a new one of SHORT cycles
                # for every sample (untimed), so it stays that short
                t_build = time.perf_counter()
                run_id, call = await build(store, snaps, "bench-warm", 2)
                runs["warm"] = ["bench-warm", run_id, call]
                for k in range(long_runs):
                    for m in MODES:
                        run_id, call = await build(store, snaps, f"bench-long{k}-{m}", long_cycles)
                        runs[f"long{k}-{m}"] = [f"bench-long{k}-{m}", run_id, call]
                figures["build_s"] = round(time.perf_counter() - t_build, 1)
                shape["long"] = await shape_of(f"bench-long0-{MODES[0]}")
                n = 1000
                for mode in MODES:  # warm-up: code paths, buckets
                    thread_id, run_id, call = runs["warm"]
                    _, _, runs["warm"][2] = await cold_sample(server.url, mode, thread_id, run_id, call, n)
                    n += 1
                for i in range(samples):
                    for mode in MODES:
                        short = f"bench-short-{mode}-{i}"
                        run_id, call = await build(store, snaps, short, SHORT)
                        runs[f"short-{mode}"] = [short, run_id, call]
                        if "short" not in shape:
                            shape["short"] = await shape_of(short)
                        for history, run in (("short", f"short-{mode}"), ("long", f"long{i % long_runs}-{mode}")):
                            thread_id, run_id, call = runs[run]
                            ms, cp, runs[run][2] = await cold_sample(server.url, mode, thread_id, run_id, call, n)
                            lat[(history, mode)][i // per_round].append(ms)
                            cpu[(history, mode)].append(cp)
                            flat[(history, mode)].append(ms)
                            n += 1
                shape["short_end"] = await shape_of(f"bench-short-{MODES[0]}-0")
                shape["long_end"] = await shape_of(f"bench-long0-{MODES[0]}")
                # ~1 us a call, so many calls: with 50, the p50s' ratio moved from 0.6 to 1.8
                result_calls = 1000
                res_short = await result_p50(store, 2, result_calls)
                res_long = await result_p50(store, 230, result_calls)
            finally:
                await store.close()
        finally:
            server.stop()

    table = Table(title=f"cold resume p50 (ms), best of {rounds} rounds x {per_round} samples (all {samples}: "
                        "in brackets): new connection + new Runtime, decide -> tool -> model turn -> "
                        "next ask committed; histories and modes interleaved")
    table.add_column("history (one run)")
    for mode in MODES:
        table.add_column(mode, justify="right")
    table.add_column("snapshots / fold", justify="right")
    table.add_column("cold / fold", justify="right")
    # Best round, as the other benchmarks do: this 2-core machine is shared, and a round under
    # someone else's test run says nothing about ours. The p50 over all samples is printed too.
    p50 = {k: min(pct(r, 0.5) for r in v) for k, v in lat.items()}
    p50_all = {k: pct([x for r in v for x in r], 0.5) for k, v in lat.items()}
    for history, cycles in (("short", SHORT), ("long", long_cycles)):
        commits, events, messages = shape[history]
        end_commits, _, end_messages = shape[f"{history}_end"]
        table.add_row(f"{history}: {cycles} cycles, {commits} commits, {events} events, {messages} msgs "
                      f"(at the end: {end_commits}, {end_messages} msgs)",
                      *(f"{p50[(history, m)]:.2f} ({p50_all[(history, m)]:.2f})" for m in MODES),
                      f"{p50[(history, 'snapshots')] / p50[(history, 'fold')]:.2f}",
                      f"{p50[(history, 'snapshots_cold')] / p50[(history, 'fold')]:.2f}")
        figures[f"{history}_commits"] = commits
        figures[f"{history}_events"] = events
        figures[f"{history}_messages"] = messages
        figures[f"{history}_commits_end"], _, figures[f"{history}_messages_end"] = shape[f"{history}_end"]
        for mode in MODES:
            figures[f"{history}_{mode}_p50_ms"] = round(p50[(history, mode)], 3)
            figures[f"{history}_{mode}_p50_all_ms"] = round(p50_all[(history, mode)], 3)
            figures[f"{history}_{mode}_cpu_p50_ms"] = round(pct(cpu[(history, mode)], 0.5), 3)
    over = Table(title="long over short (p50)")
    for mode in MODES:
        over.add_column(mode, justify="right")
        figures[f"{mode}_long_over_short"] = round(p50[("long", mode)] / p50[("short", mode)], 2)
    over.add_row(*(f"{figures[f'{m}_long_over_short']:.2f}" for m in MODES))
    for mode in MODES:
        figures[f"{mode}_cpu_long_over_short"] = round(
            figures[f"long_{mode}_cpu_p50_ms"] / figures[f"short_{mode}_cpu_p50_ms"], 2)
    over.add_row(*(f"cpu {figures[f'{m}_cpu_long_over_short']:.2f}" for m in MODES))
    console.print(table)
    console.print(over)
    # The headline is the cold process (a worker that never saw the run: its chunk cache empty),
    # the case a decision routed to any worker must expect; the warm chunk cache (a worker that
    # ran or resumed the run before) is kept as the warm_* keys.
    figures["short_p50_ms"] = figures["short_snapshots_cold_p50_ms"]
    figures["long_p50_ms"] = figures["long_snapshots_cold_p50_ms"]
    figures["long_over_short"] = figures["snapshots_cold_long_over_short"]
    figures["long_over_short_all"] = round(p50_all[("long", "snapshots_cold")] / p50_all[("short", "snapshots_cold")], 2)
    figures["long_over_short_paired"] = round(pct([lg / sh for sh, lg in zip(
        flat[("short", "snapshots_cold")], flat[("long", "snapshots_cold")], strict=True)], 0.5), 2)
    figures["long_vs_fold"] = round(p50[("long", "snapshots_cold")] / p50[("long", "fold")], 3)
    figures["cold_cache_long_vs_fold"] = figures["long_vs_fold"]
    figures["warm_short_p50_ms"] = figures["short_snapshots_p50_ms"]
    figures["warm_long_p50_ms"] = figures["long_snapshots_p50_ms"]
    figures["warm_long_over_short"] = figures["snapshots_long_over_short"]
    figures["warm_long_over_short_all"] = round(p50_all[("long", "snapshots")] / p50_all[("short", "snapshots")], 2)
    figures["warm_long_vs_fold"] = round(p50[("long", "snapshots")] / p50[("long", "fold")], 3)
    figures["target_long_over_short"] = 1.5
    figures["target_long_vs_fold"] = 0.35
    res = Table(title=f"RunHandle.result() on a finished run, p50 of {result_calls} calls")
    for col in ("2 steps (ms)", "230 steps (ms)", "230 / 2"):
        res.add_column(col, justify="right")
    ratio = res_long / res_short
    res.add_row(f"{res_short:.4f}", f"{res_long:.4f}", f"{ratio:.2f}")
    console.print(res)
    figures.update(result_2_steps_ms=round(res_short, 4), result_230_steps_ms=round(res_long, 4),
                   result_230_over_2=round(ratio, 2), target_result_230_over_2=2.0)
    ok = lambda good: "meets" if good else "MISSES"  # noqa: E731
    console.print(
        f"snapshots, cold process: long/short {figures['long_over_short']:.2f} "
        f"({ok(figures['long_over_short'] <= 1.5)} <= 1.5; cpu {figures['snapshots_cold_cpu_long_over_short']:.2f}), "
        f"long vs fold {figures['long_vs_fold']:.2f} ({ok(figures['long_vs_fold'] <= 0.35)} <= 0.35); "
        f"warm chunk cache: long/short {figures['warm_long_over_short']:.2f} "
        f"(cpu {figures['snapshots_cpu_long_over_short']:.2f}), long vs fold {figures['warm_long_vs_fold']:.2f}; "
        f"result() 230/2 {ratio:.2f} ({ok(ratio <= 2.0)} <= 2)"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    asyncio.run(main())
