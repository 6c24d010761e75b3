#!/usr/bin/env python3
"""Benchmark retention: archiving finished threads, and reading them back from the archive.

    .venv/bin/python scripts/bench_retention.py [--quick] [--threads N] [--commits N]

On one embedded nats-server: N finished threads of C commits each (with old timestamps) are
archived by one `archive_due` pass (threads/s, and how many commits left the stream); then the
same reads are timed on an archived thread and on a thread still in the stream (p50 of
`read_thread` and `read_run`, with the archive object cached in the process and without), and
`read_run` of a run that does not exist (the run-index lookup goes alongside the stream read).
The last line of output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # agentlog from this checkout

from rich.console import Console
from rich.table import Table

from agentlog.eventlog import Commit, EmbeddedNatsServer, JetStreamEventStore, new_id, now_ms
from agentlog.eventlog.events import (
    Message,
    MessageAppended,
    RunFinished,
    RunStarted,
    Termination,
    ThreadCreated,
)
from agentlog.eventlog.jetstream.retention import DAY_MS, archive_due


async def write_thread(store: JetStreamEventStore, thread: str, commits: int, ts: int) -> str:
    run = f"{thread}-run"
    version = (await store.append(Commit(commit_id=new_id(), thread_id=thread, ts=ts, events=[ThreadCreated()]), 0)).seq
    version = (await store.append(Commit(commit_id=new_id(), thread_id=thread, run_id=run, ts=ts,
                                         events=[RunStarted(run_id=run, agent_id="a")]), version)).seq
    for i in range(commits - 3):
        message = Message(id=f"m{i}", role="assistant" if i % 2 else "user", content="hello " * 20)
        version = (await store.append(Commit(commit_id=new_id(), thread_id=thread, run_id=run, ts=ts,
                                             events=[MessageAppended(message=message)]), version)).seq
    await store.append(Commit(commit_id=new_id(), thread_id=thread, run_id=run, ts=ts,
                              events=[RunFinished(termination=Termination(type="natural_end"))]), version)
    return run


async def p50_ms(n: int, fn: Callable[[], Awaitable[object]]) -> float:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - start) * 1000)
    return round(statistics.median(samples), 3)


async def main(threads: int, commits: int, samples: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedNatsServer(Path(tmp) / "nats")
        await server.astart()
        try:
            store = await JetStreamEventStore.connect(server.url)
            fresh = await JetStreamEventStore.connect(server.url)
            try:
                old = now_ms() - 40 * DAY_MS
                runs = [await write_thread(store, f"t{i}", commits, old) for i in range(threads)]
                live_run = await write_thread(store, "live", commits, now_ms())
                started = time.perf_counter()
                outcomes = await archive_due(store, 30 * DAY_MS)
                archive_s = time.perf_counter() - started
                archived = [o for o in outcomes if o.result == "archived"]
                assert len(archived) == threads, outcomes

                async def read_thread(s: JetStreamEventStore, thread: str) -> None:
                    assert len([sc async for sc in s.read_thread(thread)]) >= commits

                async def read_run(s: JetStreamEventStore, run: str) -> None:
                    assert len([sc async for sc in s.read_run(run)]) == commits - 1

                async def cold_thread() -> None:
                    fresh.archive.forget()
                    await read_thread(fresh, "t0")

                async def missing_run() -> None:
                    assert [sc async for sc in store.read_run(new_id())] == []

                figures: dict[str, object] = {
                    "threads": threads, "commits_per_thread": commits,
                    "archived_threads": len(archived), "removed_from_stream": sum(o.removed for o in archived),
                    "archive_threads_per_s": round(threads / archive_s, 1),
                    "read_thread_stream_p50_ms": await p50_ms(samples, lambda: read_thread(store, "live")),
                    "read_thread_archived_p50_ms": await p50_ms(samples, lambda: read_thread(store, "t0")),
                    "read_thread_archived_cold_p50_ms": await p50_ms(samples, cold_thread),
                    "read_run_stream_p50_ms": await p50_ms(samples, lambda: read_run(store, live_run)),
                    "read_run_archived_p50_ms": await p50_ms(samples, lambda: read_run(store, runs[0])),
                    "read_run_missing_p50_ms": await p50_ms(samples, missing_run),
                }
                figures["archived_over_stream"] = round(
                    float(figures["read_thread_archived_p50_ms"]) / float(figures["read_thread_stream_p50_ms"]), 2)  # type: ignore[arg-type]
                return figures
            finally:
                await store.close()
                await fresh.close()
        finally:
            await server.astop()


def report(figures: dict[str, object], quick: bool) -> dict[str, object]:
    table = Table(title="retention", title_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in figures.items():
        table.add_row(key, str(value))
    Console().print(table)
    return {"bench": "retention", "quick": quick, **figures}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small run: checks that it works")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--commits", type=int, default=None)
    args = parser.parse_args()
    threads = args.threads or (20 if args.quick else 200)
    commits = args.commits or (20 if args.quick else 100)
    outcome = report(asyncio.run(main(threads, commits, 10 if args.quick else 50)), args.quick)
    print(json.dumps(outcome))
