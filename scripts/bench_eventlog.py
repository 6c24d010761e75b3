#!/usr/bin/env python3
"""Benchmark `JetStreamEventStore` against raw nats-py on one embedded nats-server.

    .venv/bin/python scripts/bench_eventlog.py [--quick] [--rounds N]

Each figure is the best of N interleaved rounds (raw and store alternate, so drift in machine load
hits both). The last line of output is one JSON object with every figure and ratio.

  (a) raw `js.publish` + ack, one at a time              vs (b) `append` (1-event commit, OCC)
  (c) raw `js.publish_async`, ~500 in flight              vs `append` x ~500 in flight, 100 threads
  (d) raw ordered push consumer reading a 10,000-message thread vs `read_thread` of it
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # agentlog from this checkout

import nats
from nats.js.api import DeliverPolicy
from rich.console import Console
from rich.table import Table

from agentlog.eventlog import Commit, EmbeddedNatsServer, JetStreamEventStore, encode_commit, new_id, now_ms
from agentlog.eventlog.events import Message, MessageAppended
from agentlog.eventlog.subjects import event_subject, thread_filter

IN_FLIGHT = 500
THREADS = 100
READ_EVENTS = 10_000
TARGETS = {"append_ratio": 0.85, "concurrent_ratio": 0.7, "read_ratio": 0.8}


def one_event_commit(thread: str, i: int) -> Commit:
    """A realistic small commit: one assistant message (~150 bytes encoded)."""
    return Commit(
        commit_id=new_id(),
        thread_id=thread,
        ts=now_ms(),
        events=[MessageAppended(message=Message(id=f"m{i}", role="assistant", content="hello " * 8))],
    )


async def timed(n: int, fn: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await fn()
    return n / (time.perf_counter() - start)


class Bench:
    def __init__(self, nc: nats.NATS, store: JetStreamEventStore, n_serial: int, n_concurrent: int) -> None:
        self.nc = nc
        self.js = nc.jetstream(publish_async_max_pending=IN_FLIGHT)
        self.store = store
        self.n_serial = n_serial
        self.n_concurrent = n_concurrent
        self.round = 0
        self.payload = encode_commit(one_event_commit("raw", 0))

    # (a) / (b) -----------------------------------------------------------------------------

    async def raw_serial(self) -> float:
        subject = event_subject(f"raw-{self.round}", None)

        async def run() -> None:
            for _ in range(self.n_serial):
                await self.js.publish(subject, self.payload)

        return await timed(self.n_serial, run)

    async def store_serial(self) -> float:
        thread = f"serial-{self.round}"
        commits = [one_event_commit(thread, i) for i in range(self.n_serial)]

        async def run() -> None:
            version = 0
            for c in commits:
                version = (await self.store.append(c, version)).seq

        return await timed(self.n_serial, run)

    # (c) -----------------------------------------------------------------------------------

    async def raw_concurrent(self) -> float:
        subjects = [event_subject(f"rawc-{self.round}-{t}", None) for t in range(THREADS)]

        async def run() -> None:
            futures = []
            for i in range(self.n_concurrent):
                futures.append(await self.js.publish_async(subjects[i % THREADS], self.payload))
            await asyncio.gather(*futures)

        return await timed(self.n_concurrent, run)

    async def store_concurrent(self) -> float:
        """IN_FLIGHT writers over THREADS threads. Writers of one thread race, so they append
        without an expected version (OCC would serialise them by design)."""
        per_writer = self.n_concurrent // IN_FLIGHT
        batches = [
            [one_event_commit(f"conc-{self.round}-{w % THREADS}", i) for i in range(per_writer)]
            for w in range(IN_FLIGHT)
        ]

        async def writer(commits: list[Commit]) -> None:
            for c in commits:
                await self.store.append(c, None)

        async def run() -> None:
            await asyncio.gather(*(writer(b) for b in batches))

        return await timed(per_writer * IN_FLIGHT, run)

    async def store_concurrent_occ(self) -> float:
        """One OCC writer per thread (THREADS in flight): the shape of a busy runtime."""
        per_thread = self.n_concurrent // THREADS

        async def writer(t: int) -> None:
            thread = f"occ-{self.round}-{t}"
            version = 0
            for i in range(per_thread):
                version = (await self.store.append(one_event_commit(thread, i), version)).seq

        async def run() -> None:
            await asyncio.gather(*(writer(t) for t in range(THREADS)))

        return await timed(per_thread * THREADS, run)

    # (d) -----------------------------------------------------------------------------------

    async def populate_read_thread(self) -> str:
        thread = "read-10k"
        pending: set[asyncio.Task[object]] = set()
        for i in range(READ_EVENTS):
            if len(pending) >= IN_FLIGHT:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            pending.add(asyncio.create_task(self.store.append(one_event_commit(thread, i), None)))
            if i % 997 == 0:  # interleave other threads so the filter has work to do
                pending.add(asyncio.create_task(self.store.append(one_event_commit("other", i), None)))
        await asyncio.gather(*pending)
        return thread

    async def raw_read(self, thread: str) -> float:
        async def run() -> None:
            sub = await self.js.subscribe(
                thread_filter(thread), ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
            )
            count = 0
            while True:
                msg = await sub.next_msg(timeout=10)
                count += 1
                if msg.metadata.num_pending == 0:
                    break
            await sub.unsubscribe()
            assert count == READ_EVENTS, count

        return await timed(READ_EVENTS, run)

    async def store_read(self, thread: str) -> float:
        async def run() -> None:
            count = 0
            async for _ in self.store.read_thread(thread):
                count += 1
            assert count == READ_EVENTS, count

        return await timed(READ_EVENTS, run)


async def main(quick: bool, rounds: int) -> dict[str, object]:
    n_serial = 3_000 if quick else 10_000
    n_concurrent = 15_000 if quick else 50_000
    console = Console()
    with tempfile.TemporaryDirectory(prefix="agentlog-bench-") as tmp:
        server = EmbeddedNatsServer(Path(tmp) / "nats")
        await server.astart()
        try:
            store = await JetStreamEventStore.connect(server.url)
            nc = await nats.connect(server.url)
            bench = Bench(nc, store, n_serial, n_concurrent)
            # Warm up both paths (stream files, inbox subscriptions, code paths).
            bench.n_serial, bench.n_concurrent = 200, 1_000
            await bench.raw_serial(), await bench.store_serial()
            await bench.raw_concurrent(), await bench.store_concurrent()
            bench.n_serial, bench.n_concurrent = n_serial, n_concurrent
            read_thread = await bench.populate_read_thread()
            best: dict[str, float] = {}
            with console.status("benchmarking") as status:
                for r in range(rounds):
                    bench.round = r + 1
                    pairs = [
                        (("raw_publish", bench.raw_serial), ("store_append", bench.store_serial)),
                        (
                            ("raw_publish_async", bench.raw_concurrent),
                            ("store_append_concurrent", bench.store_concurrent),
                        ),
                        (
                            ("raw_ordered_read", lambda: bench.raw_read(read_thread)),
                            ("store_read_thread", lambda: bench.store_read(read_thread)),
                        ),
                    ]
                    # Alternate who goes first in each pair, so neither always runs on a warmer or
                    # a busier server.
                    order = [item for pair in pairs for item in (pair if r % 2 == 0 else pair[::-1])]
                    order.append(("store_append_concurrent_occ", bench.store_concurrent_occ))
                    for name, fn in order:
                        status.update(f"round {r + 1}/{rounds}: {name}")
                        best[name] = max(best.get(name, 0.0), await fn())
            await nc.close()
            await store.close()
        finally:
            await server.astop()

    result: dict[str, object] = {
        "bench": "eventlog",
        "quick": quick,
        "rounds": rounds,
        "server": "nats-server 2.15.1 (embedded)",
        **{k: round(v, 1) for k, v in best.items()},
        "append_ratio": round(best["store_append"] / best["raw_publish"], 3),
        "concurrent_ratio": round(best["store_append_concurrent"] / best["raw_publish_async"], 3),
        "read_ratio": round(best["store_read_thread"] / best["raw_ordered_read"], 3),
    }
    table = Table(title=f"agentlog eventlog benchmark ({'quick' if quick else 'full'}, best of {rounds})")
    for col in ("measurement", "raw nats-py /s", "agentlog /s", "ratio", "target"):
        table.add_column(col, justify="right" if col != "measurement" else "left")
    rows = [
        ("(a/b) serial publish vs append w/ OCC", "raw_publish", "store_append", "append_ratio"),
        (f"(c) {IN_FLIGHT} in flight, {THREADS} threads", "raw_publish_async", "store_append_concurrent", "concurrent_ratio"),
        (f"(d) read {READ_EVENTS:,}-event thread", "raw_ordered_read", "store_read_thread", "read_ratio"),
    ]
    for label, raw_key, store_key, ratio_key in rows:
        ratio = float(result[ratio_key])  # type: ignore[arg-type]
        target = TARGETS[ratio_key]
        mark = "[green]ok[/]" if ratio >= target else "[red]MISSED[/]"
        table.add_row(label, f"{best[raw_key]:,.0f}", f"{best[store_key]:,.0f}", f"{ratio:.2f}", f">= {target} {mark}")
    table.add_row(
        f"(c') {THREADS} OCC writers, one per thread", "", f"{best['store_append_concurrent_occ']:,.0f}", "", ""
    )
    console.print(table)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller runs (< 60 s)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per figure (default 5, quick 3)")
    args = parser.parse_args()
    outcome = asyncio.run(main(args.quick, args.rounds or (3 if args.quick else 5)))
    print(json.dumps(outcome))
