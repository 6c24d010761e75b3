"""Replication chaos: a real 3-node JetStream cluster on loopback, R3 streams,
runs through 2 worker processes, the events stream's leader SIGKILLed mid-load.

    python scripts/reliability_cluster.py [--quick] [--runs N]

What is checked (and reported): every submitted run finishes; no commit a worker saw acked is
missing from the log afterwards (lost); no commit id is in the log twice, no run has two
`RunFinished` (duplicated). The workers' connects run with the default replicas, so this also
shows they leave the operator's R3 alone (a reset to R1 would lose the leader's data).

`run(quick)` is the section `scripts/bench_reliability.py` imports; `chaos(...)` is what the test
(tests/eventlog/test_replicas.py) asserts on. Run alone, prints a table and, as the last line, one JSON
object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # agentlog from this checkout, installed or not
sys.path.insert(0, str(ROOT / "scripts"))

from agentlog.eventlog.errors import StoreUnavailable  # noqa: E402
from agentlog.eventlog.jetstream.store import JetStreamEventStore  # noqa: E402
from agentlog.eventlog.subjects import EVENTS_STREAM  # noqa: E402
from agentlog.runtime import Runtime  # noqa: E402
from agentlog.runtime.inputs.commands import StartRun  # noqa: E402
from agentlog.runtime.workers.commands import CommandClient, ensure_commands_stream  # noqa: E402
from agentlog.testing.cluster import LocalCluster, stream_leader  # noqa: E402

import bench_workers  # noqa: E402  (its worker app and process helpers)

#: Env var naming the file where a worker records `<commit_id> <seq>` of every acked append.
COMMIT_LOG_ENV = "RELIABILITY_COMMIT_LOG"


class _AckRecordingStore:
    """The worker's store, recording every append the cluster acknowledged (one O_APPEND write)."""

    def __init__(self, store: Any, path: str) -> None:
        self._store = store
        self._path = path

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def append(self, commit: Any, expected_version: Any) -> Any:
        res = await self._store.append(commit, expected_version)
        fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{commit.commit_id} {res.seq}\n".encode())
        finally:
            os.close(fd)
        return res


def app(store: Any) -> Runtime:
    """The workers' app: bench_workers' `quick` agent (one tool call, then an answer: 4 commits a
    run) on a store that records what was acked."""
    path = os.environ.get(COMMIT_LOG_ENV)
    return bench_workers.app(_AckRecordingStore(store, path) if path else store)


async def _submit(client: CommandClient, cmd: StartRun, deadline: float) -> None:
    """Submit, retrying the same command (deduplicated by its id) while the cluster fails over."""
    while True:
        try:
            await client.submit(cmd)
            return
        except Exception:  # noqa: BLE001 - timeouts / no responders during a leader election
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


def _log_tails(base_dir: Path, workers: int, lines: int = 30) -> str:
    """The end of each worker's log, for an error message CI prints (the files are gone after)."""
    tails = []
    for i in range(workers):
        path = base_dir / f"w{i}.log"
        text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else ["(no log)"]
        tails.append(f"--- {path.name}\n" + "\n".join(text))
    return "\n".join(tails)


async def chaos(base_dir: Path, *, runs: int = 200, threads: int = 50, workers: int = 2,
                kill_after: float = 0.25, timeout: float = 150.0) -> dict[str, Any]:
    """The scenario; returns the figures (runs, finished, lost, duplicated, leader_killed, seconds...)."""
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout
    commit_log = base_dir / "acked.log"
    procs: list[asyncio.subprocess.Process] = []
    async with LocalCluster(base_dir / "cluster", 3) as cluster:
        store = await JetStreamEventStore.connect(cluster.urls, replicas=3, request_timeout=5.0)
        try:
            await ensure_commands_stream(store.nc.jetstream(timeout=5.0), replicas=3)
            spawned = [await bench_workers.spawn(cluster.url, base_dir, i, 8, app_spec="reliability_cluster:app",
                                                 extra=("--ack-wait", "5", "--shutdown-timeout", "5"),
                                                 env={COMMIT_LOG_ENV: str(commit_log)})
                       for i in range(workers)]
            procs = [p for p, _ in spawned]
            while not all(r.exists() for _, r in spawned):
                if time.monotonic() > deadline or any(p.returncode is not None for p in procs):
                    raise StoreUnavailable(f"workers did not start:\n{_log_tails(base_dir, workers)}")
                await asyncio.sleep(0.05)
            load_start = time.perf_counter()
            finished: Counter[str] = Counter()
            progress = asyncio.Event()

            async def follow() -> None:
                async for sc in store.follow():
                    if any(type(e).__name__ == "RunFinished" for e in sc.commit.events):
                        finished[sc.commit.run_id or ""] += 1
                        progress.set()

            follower = asyncio.get_running_loop().create_task(follow())
            client = CommandClient(store.nc)
            per_thread = runs // threads
            commands = [StartRun(thread_id=f"t{t}", run_id=f"t{t}-r{r}", agent_id="quick", messages=["hi"])
                        for r in range(per_thread) for t in range(threads)]
            await asyncio.gather(*(_submit(client, cmd, deadline) for cmd in commands))
            leader = ""
            try:
                while len(finished) < len(commands):
                    if not leader and len(finished) >= kill_after * len(commands):
                        leader = await stream_leader(store.nc, EVENTS_STREAM)
                        cluster.node(leader).kill()  # SIGKILL the events stream's leader mid-load
                    progress.clear()
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    try:
                        await asyncio.wait_for(progress.wait(), remaining)
                    except TimeoutError:
                        break
            finally:
                follower.cancel()
                await asyncio.gather(follower, return_exceptions=True)
            load_seconds = time.perf_counter() - load_start
            await bench_workers.stop_all(procs)
            log = [(sc.seq, sc.commit) async for sc in _read_all(store)]
            in_stream = (await store.nc.jetstream(timeout=5.0).stream_info(EVENTS_STREAM)).state.messages
        finally:
            await bench_workers.stop_all(procs)
            await store.close()
    by_seq = {seq: commit.commit_id for seq, commit in log}
    acked = [line.split() for line in commit_log.read_text().splitlines()] if commit_log.exists() else []
    lost = sum(1 for commit_id, seq in acked if by_seq.get(int(seq)) != commit_id)
    ids = Counter(commit.commit_id for _, commit in log)
    finished_in_log = Counter(commit.run_id for _, commit in log
                              if any(type(e).__name__ == "RunFinished" for e in commit.events))
    duplicated = sum(n - 1 for n in ids.values() if n > 1) + sum(n - 1 for n in finished_in_log.values() if n > 1)
    broken = _broken_runs(log)
    return {"runs": len(commands), "finished": sum(1 for c in commands if finished_in_log[c.run_id] >= 1),
            "lost": lost, "duplicated": duplicated, "acked_commits": len(acked), "commits": len(log),
            "stream_messages": in_stream, "broken_runs": len(broken),
            "leader_killed": leader or None, "workers": workers, "load_seconds": round(load_seconds, 2),
            "seconds": round(time.perf_counter() - t0, 2)}


def _broken_runs(log: list[tuple[int, Any]]) -> set[str]:
    """Runs the log tells an inconsistent story of: a call completed that never started, or an
    end other than natural_end (e.g. an error finish commit written in the middle of a failover)."""
    started: set[tuple[str, str]] = set()
    broken: set[str] = set()
    for _, commit in log:
        for event in commit.events:
            kind = type(event).__name__
            if kind == "ToolCallStarted":
                started.add((commit.run_id, event.call_id))
            elif kind == "ToolCallCompleted" and (commit.run_id, event.call_id) not in started:
                broken.add(commit.run_id)
            elif kind == "RunFinished" and event.termination.type != "natural_end":
                broken.add(commit.run_id)
    return broken


async def _read_all(store: JetStreamEventStore) -> Any:
    """Every commit in the log now (followed up to the last sequence)."""
    last = await store.last_seq()
    if last == 0:
        return
    async for sc in store.follow(None, 0):
        yield sc
        if sc.seq >= last:
            return


async def run(quick: bool) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """The benchmark section: table rows (label, value) and the figures for the JSON line."""
    with tempfile.TemporaryDirectory(prefix="reliability-cluster-") as tmp:
        figures = await chaos(Path(tmp), runs=200 if quick else 1000, threads=50 if quick else 100)
    rows = [
        ("cluster", "3 nats-server nodes on loopback, R3 streams, 2 worker processes"),
        ("runs submitted / finished", f"{figures['runs']} / {figures['finished']}"),
        ("stream leader SIGKILLed mid-load", figures["leader_killed"] or "no"),
        ("commits acked to workers / in log", f"{figures['acked_commits']} / {figures['commits']}"),
        ("lost commits", str(figures["lost"])),
        ("duplicated commits", str(figures["duplicated"])),
        ("runs with an inconsistent log / not natural_end", str(figures["broken_runs"])),
        ("seconds (load / total)", f"{figures['load_seconds']:.1f} / {figures['seconds']:.1f}"),
    ]
    return rows, figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="200 runs (default 1000)")
    args = ap.parse_args()
    rows, figures = asyncio.run(run(args.quick))
    width = max(len(label) for label, _ in rows)
    print("reliability: cluster chaos")
    for label, value in rows:
        print(f"  {label:<{width}}  {value}")
    print(json.dumps({"bench": "reliability_cluster", "quick": args.quick, **figures}))


if __name__ == "__main__":
    from agentlog.cli.logging import configure as configure_logging

    configure_logging("warning")
    main()
