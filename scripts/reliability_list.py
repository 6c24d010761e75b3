#!/usr/bin/env python
"""Listing at scale: p50 of `GET /v1/runs?limit=1`, `GET /v1/threads?limit=20`,
a filtered `GET /v1/runs?status=waiting&limit=20` and a tenant-scoped `GET /v1/runs?limit=20`
(a token limited to 11 of the 50 resources), through the real aiohttp app on a real
nats-server, at 1k and 20k runs (and 100k without --quick). Target: p50 at 20k <= 2x p50 at 1k.

The views are built fast, the way `agentlog projections rebuild` writes them: synthetic commits
(4 runs per thread, continuations, mixed statuses, 5 agents, 50 resources) are folded in memory,
then every view and every list of the listing index is put, pipelined, into KV under a prefix of
its own per size. For comparison it also times the full scan a listing without the index does
(`list_runs()`, every view) at the same sizes, and (default run only) what keeping the index
costs the projection runner (commits/s catching up, views only vs views and index, on a log
where every commit starts a run and on a synthetic agent history).

`run(quick)` returns (table rows, figures) for `scripts/bench_reliability.py`;

    .venv/bin/python scripts/reliability_list.py [--quick]

prints the table and, as its last line, one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # agentlog from this checkout

import nats
from aiohttp.test_utils import TestClient, TestServer

from agentlog.eventlog.codec import encode_commit
from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import (
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
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.gateway.http import create_app
from agentlog.projections.fold import Folder
from agentlog.projections.kv import KVViewStore
from agentlog.projections.runner import ProjectionRunner
from agentlog.testing.synth import history_of_size

RUNS_PER_THREAD = 4
#: name -> (path, query, bearer token); "tenant" is scoped to resource_id prefix "res1" (11 of
#: the 50 resources: res1, res10..res19).
LISTINGS = {
    "runs": ("/v1/runs", {"limit": "1"}, "admin"),
    "threads": ("/v1/threads", {"limit": "20"}, "admin"),
    "filtered": ("/v1/runs", {"status": "waiting", "limit": "20"}, "admin"),
    "tenant": ("/v1/runs", {"limit": "20"}, "tenant"),
}
TOKENS = "admin,tenant:res1"


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


async def timed(client: TestClient, path: str, params: dict[str, str], token: str, n: int) -> list[float]:
    """Seconds of `n` GETs, one after the other."""
    headers = {"Authorization": f"Bearer {token}"}
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        resp = await client.get(path, params=params, headers=headers)
        await resp.read()
        times.append(time.perf_counter() - t0)
        assert resp.status == 200, resp.status
    return times


ROUNDS = 10


async def serve(stack: contextlib.AsyncExitStack, nc: Any, events: JetStreamEventStore, size: int,
                ) -> tuple[TestClient, KVViewStore, float]:
    """Views and index for `size` runs, and the real app serving them on loopback."""
    store, seconds = await build(nc, size)
    runner = ProjectionRunner(events.nc, store)  # not started: nothing is appended here
    client = TestClient(TestServer(create_app(events, store, runner, auth_tokens=TOKENS), host="127.0.0.1"))
    await client.start_server()
    stack.push_async_callback(client.close)
    answer = await client.get("/v1/runs", params={"limit": "1"}, headers={"Authorization": "Bearer admin"})
    assert (await answer.json())["total"] == size
    return client, store, seconds


async def p50s(clients: dict[int, TestClient], requests: int) -> dict[tuple[int, str], float]:
    """p50 (ms) per size and listing, measured in alternating rounds (ROUNDS x requests/ROUNDS
    each), so a load burst on this shared machine hits every size alike."""
    times: dict[tuple[int, str], list[float]] = {}
    for client in clients.values():  # warm up (connections, caches)
        for path, params, token in LISTINGS.values():
            await timed(client, path, params, token, 5)
    for _ in range(ROUNDS):
        for size, client in clients.items():
            for name, (path, params, token) in LISTINGS.items():
                times.setdefault((size, name), []).extend(await timed(client, path, params, token, requests // ROUNDS))
    return {key: statistics.median(ts) * 1000 for key, ts in times.items()}


async def scan_ms(store: KVViewStore, size: int, quick: bool) -> float:
    """The old listing: every run view, through one watcher."""
    scans = 1 if quick or size > 20_000 else 3
    t0 = time.perf_counter()
    for _ in range(scans):
        assert len(await store.list_runs()) == size
    return (time.perf_counter() - t0) / scans * 1000


class ViewsOnly:
    """The store without its listing index: the runner as it was before (the baseline)."""

    def __init__(self, inner: KVViewStore) -> None:
        self.inner = inner

    async def get_thread(self, thread_id: str) -> Any:
        return await self.inner.get_thread(thread_id)

    async def get_run(self, run_id: str) -> Any:
        return await self.inner.get_run(run_id)

    async def put_views(self, threads: Any, runs: Any) -> None:
        await self.inner.put_views(threads, runs)


async def runner_rates(nc: Any, name: str, commits: list[Commit]) -> tuple[float, float]:
    """Commits/s of two projection runners catching up on `commits`, views only and views with
    the listing index (fresh buckets, each from seq 1), stepped in turn (one batch each)
    so a load burst on this shared machine slows both alike."""
    js = nc.jetstream()
    stream = f"list_{name}"
    await js.add_stream(name=stream, subjects=[f"{stream}.>"])
    for i in range(0, len(commits), 1000):
        await asyncio.gather(*(js.publish(f"{stream}.{c.thread_id}", encode_commit(c)) for c in commits[i : i + 1000]))
    runners: list[ProjectionRunner] = []
    for mode in ("views", "index"):
        store = await KVViewStore.open(nc, prefix=f"{stream}_{mode}")
        runner = ProjectionRunner(nc, ViewsOnly(store) if mode == "views" else store, stream=stream,
                                  subjects=f"{stream}.>", fetch_timeout=0.5)
        await runner.open()
        runners.append(runner)
    seconds = [0.0, 0.0]
    while any(r.applied_seq < len(commits) for r in runners):
        for i, runner in enumerate(runners):
            if runner.applied_seq < len(commits):
                t0 = time.perf_counter()
                await runner.step()
                seconds[i] += time.perf_counter() - t0
    for runner in runners:
        await runner.stop()
    return len(commits) / seconds[0], len(commits) / seconds[1]


async def run(quick: bool, sizes: tuple[int, ...] | None = None) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """`sizes`: the run counts listed, smallest first, whole thousands (default 1k and 20k, and
    100k without `quick`); the ratios are each larger size's p50 over the first's."""
    sizes = sizes or ((1_000, 20_000) if quick else (1_000, 20_000, 100_000))
    requests = 100 if quick else 300
    results: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedNatsServer(Path(tmp) / "nats")
        server.start()
        try:
            async with contextlib.AsyncExitStack() as stack:
                nc = await nats.connect(server.url)
                stack.push_async_callback(nc.close)
                events = await JetStreamEventStore.connect(server.url)
                stack.push_async_callback(events.close)
                clients: dict[int, TestClient] = {}
                for size in sizes:
                    client, store, seconds = await serve(stack, nc, events, size)
                    clients[size] = client
                    results[size] = {"build_s": seconds, "scan": await scan_ms(store, size, quick)}
                for (size, name), p50 in (await p50s(clients, requests)).items():
                    results[size][name] = p50
                rates: dict[str, tuple[float, float]] = {}
                if not quick:  # a few batches say nothing (warm-up and load noise): default run only
                    logs = {"runs": synthetic_commits(10_000), "mixed": history_of_size(random.Random(7), 60_000)}
                    rates = {log: await runner_rates(nc, log, commits) for log, commits in logs.items()}
        finally:
            server.stop()
    figures: dict[str, Any] = {}
    rows: list[tuple[str, str]] = []
    names = {"runs": "list", "threads": "threads", "filtered": "filtered", "tenant": "tenant"}
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
            (f"GET /v1/runs?limit=20 as a tenant (11 resources) p50 at {k} runs", f"{res['tenant']:.2f} ms"),
            (f"full scan of the run views (the old listing) at {k} runs", f"{res['scan']:.1f} ms"),
        ]
    for log, label in (("runs", "every commit starts a run"), ("mixed", "synthetic agent history")):
        if log not in rates:
            continue
        views_only, indexed = rates[log]
        figures[f"runner_{log}_commits_per_s_views_only"] = round(views_only)
        figures[f"runner_{log}_commits_per_s_indexed"] = round(indexed)
        figures[f"runner_{log}_index_ratio"] = round(indexed / views_only, 3)
        rows.append((f"projection runner, {label}: commits/s views only -> with index",
                     f"{views_only:.0f} -> {indexed:.0f} ({indexed / views_only:.2f}x)"))
    for size in sizes[1:]:  # list_ratio = 20k / 1k (the target); list_ratio_100k = 100k / 1k
        k = f"{size // 1000}k"
        for name, short in names.items():
            ratio = results[size][name] / results[sizes[0]][name]
            figures[f"{short}_ratio" + ("" if size == 20_000 else f"_{k}")] = round(ratio, 3)
            rows.append((f"{short} p50 {k} / {sizes[0] // 1000}k (target <= 2)", f"{ratio:.2f}x"))
    return rows, figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1k and 20k runs only (under 60 s)")
    args = parser.parse_args()
    from rich.console import Console
    from rich.table import Table

    rows, figures = asyncio.run(run(args.quick))
    table = Table(title="listing at scale")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for label, value in rows:
        table.add_row(label, value)
    Console(width=110).print(table)
    print(json.dumps({"bench": "reliability_list", **figures}))


if __name__ == "__main__":
    main()
