#!/usr/bin/env python
"""Benchmark the projections: rebuild vs a raw ordered consumer + decode over the same stream,
the incremental runner, and the pure in-memory fold. Checks that the rebuild's views equal the
incremental runner's. Prints a rich table, then ONE JSON line with every figure (the last line).

Each of the three reads of the log (raw, incremental, rebuild) is timed `REPEATS` times, into
fresh views each time, and its best time is the figure: one pass takes a fraction of a second, so a
single scheduler hiccup in the baseline alone moved the ratios by a fifth between runs.

    .venv/bin/python scripts/bench_projections.py [--quick] [--events N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # agentlog from this checkout

import nats
from rich.console import Console
from rich.table import Table

from agentlog.eventlog.codec import decode_commit, encode_commit
from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import StoredCommit
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.subjects import event_subject
from agentlog.projections.fold import fold_commits
from agentlog.projections.kv import KVViewStore
from agentlog.projections.rebuild import read_range, rebuild
from agentlog.projections.runner import ProjectionRunner
from agentlog.testing.synth import history_of_size

REPEATS = 3


async def publish_all(nc, commits) -> int:
    """Pipelined raw publishes (the log is written once; OCC is not what is measured here)."""
    js = nc.jetstream()
    last = 0
    for i in range(0, len(commits), 1000):
        chunk = commits[i : i + 1000]
        acks = await asyncio.gather(*(js.publish(event_subject(c.thread_id, c.run_id), encode_commit(c)) for c in chunk))
        seqs = [a.seq for a in acks]
        assert seqs == list(range(last + 1, last + 1 + len(chunk))), "publishes must land in order"
        last = seqs[-1]
    return last


async def main(n_events: int) -> dict:
    console = Console(stderr=False)
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedNatsServer(Path(tmp) / "nats")
        server.start()
        try:
            nc = await nats.connect(server.url)
            store = await JetStreamEventStore.connect(nc)
            commits = history_of_size(random.Random(42), n_events)
            events = sum(len(c.events) for c in commits)
            last = await publish_all(nc, commits)
            js = nc.jetstream()

            async def raw_pass() -> float:
                """The baseline: a raw ordered consumer + msgspec decode."""
                t0 = time.perf_counter()
                raw_events = 0
                async for part in read_range(js, 1, last):
                    for _, data in part:
                        raw_events += len(decode_commit(data).events)
                assert raw_events == events
                return time.perf_counter() - t0

            async def incremental_pass(prefix: str) -> tuple[float, KVViewStore]:
                """The incremental runner from an empty KV."""
                views = await KVViewStore.open(nc, prefix=prefix)
                runner = ProjectionRunner(nc, views, batch=1000)
                await runner.open()
                t0 = time.perf_counter()
                while runner.applied_seq < last:
                    await runner.step()
                elapsed = time.perf_counter() - t0
                await runner.stop()
                return elapsed, views

            raw_s = inc_s = rebuild_s = float("inf")
            ticks: list[int] = []
            for i in range(REPEATS):  # interleaved, so a slow stretch of the machine hits all three
                raw_s = min(raw_s, await raw_pass())
                elapsed, views = await incremental_pass(f"inc{i}")
                inc_s = min(inc_s, elapsed)
                ticks.clear()  # rebuild from seq 1 into a fresh generation
                result = await rebuild(nc, prefix=f"reb{i}", progress=lambda d, t: ticks.append(d))
                rebuild_s = min(rebuild_s, result.seconds)
            reb = await KVViewStore.open(nc, prefix=f"reb{REPEATS - 1}")
            inc_threads, inc_runs = await views.list_threads(), await views.list_runs()
            same = inc_threads == await reb.list_threads() and inc_runs == await reb.list_runs()

            # pure fold in memory (best of 3)
            stored = [StoredCommit(i + 1, decode_commit(encode_commit(c))) for i, c in enumerate(commits)]
            fold_s = min(_timed(lambda: fold_commits(stored)) for _ in range(3))
            expected = fold_commits(stored)
            same_fold = {t.thread_id: t for t in inc_threads} == expected.threads and {
                r.run_id: r for r in inc_runs} == expected.runs
            await store.close()
            await nc.close()
        finally:
            server.stop()

    figures = {
        "bench": "projections",
        "events": events,
        "commits": len(commits),
        "threads": result.threads,
        "runs": result.runs,
        "raw_consume_events_per_s": round(events / raw_s),
        "rebuild_events_per_s": round(events / rebuild_s),
        "rebuild_ratio": round(raw_s / rebuild_s, 3),
        "incremental_events_per_s": round(events / inc_s),
        "incremental_ratio": round(raw_s / inc_s, 3),
        "fold_events_per_s": round(events / fold_s),
        "fold_target_met": events / fold_s >= 200_000,
        "rebuild_ratio_target_met": raw_s / rebuild_s >= 0.6,
        "incremental_ratio_target_met": raw_s / inc_s >= 0.5,
        "rebuild_equals_incremental": same,
        "incremental_equals_pure_fold": same_fold,
        "progress_ticks": len(ticks),
    }
    table = Table(title=f"projections: {events:,} events, {len(commits):,} commits (best of {REPEATS})")
    table.add_column("measure")
    table.add_column("events/s", justify="right")
    table.add_column("ratio vs raw", justify="right")
    table.add_row("raw ordered consumer + decode", f"{figures['raw_consume_events_per_s']:,}", "1.00")
    table.add_row("rebuild (fold + KV write)", f"{figures['rebuild_events_per_s']:,}", f"{figures['rebuild_ratio']:.2f}")
    table.add_row("incremental runner (batch 1000, 5000 while behind)", f"{figures['incremental_events_per_s']:,}", f"{figures['incremental_ratio']:.2f}")
    table.add_row("pure fold in memory", f"{figures['fold_events_per_s']:,}", "-")
    console.print(table)
    console.print(f"rebuild views == incremental views: {same}; == pure fold: {same_fold}; "
                  f"{result.threads:,} threads, {result.runs:,} runs")
    return figures


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="20,000 events (< 60 s)")
    parser.add_argument("--events", type=int, default=None)
    args = parser.parse_args()
    n = args.events or (20_000 if args.quick else 100_000)
    out = asyncio.run(main(n))
    print(json.dumps(out))
