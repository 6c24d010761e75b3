#!/usr/bin/env python
"""Listing at scale (issue #12 item 12): p50 of `GET /v1/runs?limit=1`, `GET /v1/threads?limit=20`
and a filtered `GET /v1/runs?status=waiting&limit=20`, through the real aiohttp app on a real
nats-server, at 1k and 20k runs (and 100k without --quick). Target: p50 at 20k <= 2x p50 at 1k.

The views are built fast, the way `agentlog projections rebuild` writes them: synthetic commits
(4 runs per thread, continuations, mixed statuses, 5 agents, 50 resources) are folded in memory,
then every view and every list of the listing index is put, pipelined, into KV under a prefix of
its own per size. For comparison it also times the full scan every listing used to do
(`list_runs()`, every view) at the same sizes.

`run(quick)` returns (table rows, figures) for `scripts/bench_reliability.py`;

    .venv/bin/python scripts/reliability_list.py [--quick]

prints the table and, as its last line, one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nats  # noqa: E402
from aiohttp.test_utils import TestClient, TestServer  # noqa: E402

from eventlog.events import (  # noqa: E402
    Commit,
    RunFinished,
    RunStarted,
    RunSuspended,
    SuspendTicket,
    Termination,
    ThreadCreated,
    ToolCallStarted,
    ToolCallSuspended,
)
from eventlog.jetstream import JetStreamEventStore  # noqa: E402
from eventlog.server import EmbeddedNatsServer  # noqa: E402
from gateway.http import create_app  # noqa: E402
from projections.fold import Folder  # noqa: E402
from projections.kv import KVViewStore  # noqa: E402
from projections.runner import ProjectionRunner  # noqa: E402

RUNS_PER_THREAD = 4
LISTINGS = {
    "runs": ("/v1/runs", {"limit": "1"}),
    "threads": ("/v1/threads", {"limit": "20"}),
    "filtered": ("/v1/runs", {"status": "waiting", "limit": "20"}),
}


def synthetic_commits(runs: int) -> list[Commit]:
    """Commits for `runs` runs: mostly done, some waiting on a human, some running."""
    out: list[Commit] = []
    ts = 1_700_000_000_000
    for i in range(runs):
        tid, rid = f"t{i // RUNS_PER_THREAD:08d}", f"r{i:08d}"
        parent = f"r{i - 1:08d}" if i % RUNS_PER_THREAD else None
        events: list[Any] = [] if parent else [ThreadCreated(resource_id=f"res{(i // RUNS_PER_THREAD) % 50}")]
        events.append(RunStarted(run_id=rid, agent_id=f"agent{i % 5}", parent_run_id=parent))
        if i % 10 == 3:
            events += [ToolCallStarted(call_id=f"c{i}", name="approve"),
                       ToolCallSuspended(call_id=f"c{i}", ticket=SuspendTicket(id=f"k{i}")),
                       RunSuspended(call_ids=[f"c{i}"])]
        elif i % 10 != 7:
            events.append(RunFinished(termination=Termination(type="natural_end")))
        ts += 1
        out.append(Commit(commit_id=f"c{i}", thread_id=tid, run_id=rid, ts=ts, events=events))
    return out


async def build(nc: Any, runs: int) -> tuple[KVViewStore, float]:
    """Views and listing index for `runs` runs under their own prefix; seconds it took."""
    started = time.perf_counter()
    folder = Folder()
    for seq, commit in enumerate(synthetic_commits(runs), start=1):
        folder.apply_commit(seq, commit)
    views = folder.views()
    store = await KVViewStore.open(nc, prefix=f"list{runs}")
    await store.put_views(views.threads.values(), views.runs.values())
    await store.index.put_all(list(views.threads.values()), list(views.runs.values()))
    return store, time.perf_counter() - started


async def p50_ms(client: TestClient, path: str, params: dict[str, str], n: int) -> float:
    for _ in range(5):  # warm up (connection, caches)
        (await client.get(path, params=params)).release()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        resp = await client.get(path, params=params)
        await resp.read()
        times.append(time.perf_counter() - t0)
        assert resp.status == 200, resp.status
    return statistics.median(times) * 1000


async def measure(url: str, nc: Any, runs: int, requests: int, scans: int) -> dict[str, float]:
    store, seconds = await build(nc, runs)
    events = await JetStreamEventStore.connect(url)
    runner = ProjectionRunner(events.nc, store)  # not started: nothing is appended here
    client = TestClient(TestServer(create_app(events, store, runner, auth_tokens=""), host="127.0.0.1"))
    await client.start_server()
    try:
        out = {"build_s": seconds}
        for name, (path, params) in LISTINGS.items():
            out[name] = await p50_ms(client, path, params, requests)
        total = (await (await client.get("/v1/runs", params={"limit": "1"})).json())["total"]
        assert total == runs, (total, runs)
        t0 = time.perf_counter()
        for _ in range(scans):
            assert len(await store.list_runs()) == runs
        out["scan"] = (time.perf_counter() - t0) / scans * 1000
        return out
    finally:
        await client.close()
        await events.close()


async def run(quick: bool) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    sizes = (1_000, 20_000) if quick else (1_000, 20_000, 100_000)
    requests = 100 if quick else 300
    results: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedNatsServer(Path(tmp) / "nats")
        server.start()
        try:
            nc = await nats.connect(server.url)
            try:
                for size in sizes:
                    results[size] = await measure(server.url, nc, size, requests, 3 if size <= 20_000 else 1)
            finally:
                await nc.close()
        finally:
            server.stop()
    figures: dict[str, Any] = {}
    rows: list[tuple[str, str]] = []
    names = {"runs": "list", "threads": "threads", "filtered": "filtered"}
    for size, res in results.items():
        k = f"{size // 1000}k"
        for name, short in names.items():
            figures[f"{short}_p50_ms_{k}"] = round(res[name], 3)
        figures[f"scan_ms_{k}"] = round(res["scan"], 1)
        figures[f"build_s_{k}"] = round(res["build_s"], 2)
        rows += [
            (f"GET /v1/runs?limit=1 p50 at {k} runs", f"{res['runs']:.2f} ms"),
            (f"GET /v1/threads?limit=20 p50 at {k} runs", f"{res['threads']:.2f} ms"),
            (f"GET /v1/runs?status=waiting&limit=20 p50 at {k} runs", f"{res['filtered']:.2f} ms"),
            (f"full scan of the run views (the old listing) at {k} runs", f"{res['scan']:.1f} ms"),
        ]
    for size in sizes[1:]:  # list_ratio = 20k / 1k (the target); list_ratio_100k = 100k / 1k
        k = f"{size // 1000}k"
        for name, short in names.items():
            ratio = results[size][name] / results[1_000][name]
            figures[f"{short}_ratio" + ("" if size == 20_000 else f"_{k}")] = round(ratio, 3)
            rows.append((f"{short} p50 {k} / 1k (target <= 2)", f"{ratio:.2f}x"))
    return rows, figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1k and 20k runs only (under 60 s)")
    args = parser.parse_args()
    from rich.console import Console
    from rich.table import Table

    rows, figures = asyncio.run(run(args.quick))
    table = Table(title="listing at scale (issue #12 item 12)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for label, value in rows:
        table.add_row(label, value)
    Console().print(table)
    print(json.dumps({"bench": "reliability_list", **figures}))


if __name__ == "__main__":
    main()
