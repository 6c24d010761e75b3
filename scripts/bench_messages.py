#!/usr/bin/env python
"""NATS messages per approval cycle, by kind, through `agentlog serve` and `agentlog gateway` +
`agentlog worker` (the processes and the cycle of `scripts/bench_e2e.py`).

    python scripts/bench_messages.py [--quick] [--cycles N] [--topologies serve,split]

A second connection subscribes to every subject class the processes use (the API, acks, flow
control, KV and Object Store puts, inboxes, agentlog's own subjects) and counts what passes during
`--cycles` approval cycles of one run, after a few unmeasured ones. Messages are counted by the
subject they carry: a delivery of a stream message carries the subject it was stored under, so
`agentlog.ev` counts each commit's publish and every delivery of it to a consumer.

Left out on purpose: the Direct Gets of the archived-run index (`KV_agentlog_archive_runs`). Its
bucket exists once something was archived; until then a read asks and is answered "no responders"
at once, and a subscriber there would turn that answer into a timeout.

Messages are what every process and the server handle one by one: fewer per cycle is less CPU in
the agentlog processes and in nats-server, and unlike a time, a count does not depend on the load
of the machine. Prints a table and, as the last line, `{"bench": "messages", ...}`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(SCRIPTS))

import bench_e2e  # noqa: E402  (the app, the processes, the approval driver)

#: Subject classes a subscriber may listen on without changing what the processes see.
LISTENED = ("$JS.API.CONSUMER.>", "$JS.API.STREAM.>", "$JS.API.DIRECT.GET.*", "$JS.API.INFO", "$JS.ACK.>",
            "$JS.FC.>", "$KV.>", "$O.>", "_INBOX.>", "agentlog.>", "$SRV.>")
NATS_ROW = re.compile(r"nats://127\.0\.0\.1:\d+")


def kind(subject: str) -> str:
    """The class a subject is counted under (its stream, bucket or API verb; inboxes together)."""
    parts = subject.split(".")
    if subject.startswith("$JS.API.DIRECT.GET."):
        return f"direct get {parts[4]}"
    if subject.startswith("$JS.API."):
        return "api " + ".".join(parts[2:5] if parts[2] == "STREAM" else parts[2:4])
    if subject.startswith("$JS.ACK."):
        return f"ack {parts[2]}"
    if subject.startswith("$JS.FC."):
        return "flow control"
    if subject.startswith(("$KV.", "$O.")):
        return f"put {parts[1]}"
    if subject.startswith("_INBOX."):
        return "replies and deliveries to inboxes"
    if subject.startswith("agentlog."):
        return f"agentlog.{parts[1]} (publish + deliveries)"
    return parts[0]


async def count(url: str, nats_url: str, cycles: int) -> tuple[int, collections.Counter[str]]:
    import aiohttp
    import nats

    nc = await nats.connect(nats_url)
    counts: collections.Counter[str] = collections.Counter()
    counting = False

    async def on_msg(msg: Any) -> None:
        if counting:
            counts[kind(msg.subject)] += 1

    try:
        for subject in LISTENED:
            await nc.subscribe(subject, cb=on_msg, pending_msgs_limit=-1, pending_bytes_limit=-1)
        async with aiohttp.ClientSession() as session:
            driver = bench_e2e.Driver(session, url, 10.0)
            await driver.start()
            for _ in range(5):  # warm: caches, the tail, the first snapshot, buckets made on first use
                await driver.cycle()
            for info in await nc.jetstream().streams_info():
                name = info.config.name
                if name.startswith("KV_") and name != "KV_agentlog_archive_runs":
                    await nc.subscribe(f"$JS.API.DIRECT.GET.{name}.>", cb=on_msg)
            await nc.flush()
            counting = True
            for _ in range(cycles):
                await driver.cycle()
            await nc.flush()
            counting = False
    finally:
        await nc.close()
    return cycles, counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="20 cycles per topology (default 100)")
    ap.add_argument("--cycles", type=int, default=None)
    ap.add_argument("--topologies", default="serve,split")
    args = ap.parse_args()
    cycles = args.cycles or (20 if args.quick else 100)
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    from rich.console import Console
    from rich.table import Table

    results: dict[str, collections.Counter[str]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-messages-") as tmp:
        for topology in args.topologies.split(","):
            where = Path(tmp) / topology
            with bench_e2e.deployment(topology, where) as (url, _pids):
                log = (where / ("serve.log" if topology == "serve" else "gateway.log")).read_text()
                found = NATS_ROW.search(log)
                assert found, log[-2000:]
                _, results[topology] = asyncio.run(count(url, found.group(0), cycles))

    kinds = sorted({k for c in results.values() for k in c}, key=lambda k: -max(c[k] for c in results.values()))
    table = Table(title=f"NATS messages per approval cycle ({cycles} cycles)")
    table.add_column("kind")
    for topology in results:
        table.add_column(topology, justify="right")
    for k in kinds:
        table.add_row(k, *(f"{c[k] / cycles:.2f}" for c in results.values()))
    table.add_row("all", *(f"{sum(c.values()) / cycles:.1f}" for c in results.values()))
    Console().print(table)
    doc: dict[str, Any] = {"bench": "messages", "quick": args.quick, "cycles": cycles}
    for topology, c in results.items():
        doc[f"{topology}_messages_per_cycle"] = round(sum(c.values()) / cycles, 1)
        doc[f"{topology}_by_kind"] = {k: round(v / cycles, 2) for k, v in c.most_common()}
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
