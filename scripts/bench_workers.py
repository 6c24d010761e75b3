"""Worker throughput: runs/s completed by 1, 2 and 3 worker processes, and command-to-first-commit
latency (submit -> the run's RunStarted commit), against an in-process Runtime baseline.

    python scripts/bench_workers.py [--quick] [--runs N] [--threads N] [--concurrency N] [--repeat N]

Each configuration gets a fresh nats-server; the workers run this checkout's code, at the
concurrency `agentlog worker` has by default. Runs are small (`quick` agent: one tool call, then a
text answer: 4 commits), spread over threads, all submitted at once. The configurations are
measured in rounds (`--repeat`, default 5), each round every configuration once, baseline first,
and each figure is the median over the rounds: a quick round lasts a tenth of a second, so one
moment of another process on the machine moves a single measurement by a fifth or more.
Prints a table and, as the last line, `{"bench": "workers", ...}`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # agentlog from this checkout, installed or not

from agentlog.cli.logging import configure as configure_logging  # noqa: E402
from agentlog.eventlog.embedded.server import EmbeddedNatsServer  # noqa: E402
from agentlog.eventlog.jetstream.store import JetStreamEventStore  # noqa: E402
from agentlog.runtime import AgentSpec, Runtime, tool  # noqa: E402
from agentlog.runtime.inputs.commands import StartRun  # noqa: E402
from agentlog.runtime.models.scripted import ScriptedModel, Turn  # noqa: E402
from agentlog.runtime.workers.commands import CommandClient  # noqa: E402
from agentlog.runtime.workers.worker import DEFAULT_CONCURRENCY  # noqa: E402

from bench_e2e import cpu_ns  # noqa: E402


@tool
async def work(k: int) -> str:
    """A tiny unit of work."""
    return f"worked {k}"


def app(store: Any) -> Runtime:
    agent = AgentSpec(id="quick", model="quick", tools=["work"], max_rounds=5)
    model = ScriptedModel([Turn.tool("work", {"k": 7}), Turn.text("ok")], loop=True, position="conversation")
    return Runtime(store, agents=[agent], tools=[work], models={"quick": model})


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


async def spawn(url: str, logdir: Path, i: int, concurrency: int, *, app_spec: str = "bench_workers:app",
                extra: tuple[str, ...] = (), env: dict[str, str] | None = None) -> tuple[asyncio.subprocess.Process, Path]:
    """An `agentlog worker` process running `app_spec` (a module in scripts/); returns it
    and the file it creates once it consumes."""
    ready = logdir / f"ready{i}"
    out = open(logdir / f"w{i}.log", "wb")
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agentlog", "worker", "--nats", url, "--app", app_spec,
            "--concurrency", str(concurrency), "--ready-file", str(ready), *extra,
            stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, cwd=str(ROOT),
            env={**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT / "src"), str(ROOT / "scripts"))), **(env or {})},
        )
    finally:
        out.close()
    return proc, ready


async def stop_all(procs: list[asyncio.subprocess.Process]) -> None:
    """SIGTERM the workers (they stop gracefully), SIGKILL any still there after 10 s."""
    for p in procs:
        if p.returncode is None:
            p.terminate()
    for p in procs:
        try:
            async with asyncio.timeout(10):
                await p.wait()
        except TimeoutError:
            p.kill()
            await p.wait()


async def measure(workers: int, runs: int, threads: int, concurrency: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
        tmpd = Path(tmp)
        server = EmbeddedNatsServer(tmpd / "nats")
        server.start()
        procs: list[asyncio.subprocess.Process] = []
        store = await JetStreamEventStore.connect(server.url)
        try:
            client = CommandClient(store.nc)
            await client.ensure_stream()
            rt = app(store) if workers == 0 else None
            if workers:
                spawned = [await spawn(server.url, tmpd, i, concurrency) for i in range(workers)]
                procs = [p for p, _ in spawned]
                async with asyncio.timeout(60):
                    while not all(r.exists() for _, r in spawned):
                        await asyncio.sleep(0.05)  # start-up, outside the measured window
            submitted: dict[str, float] = {}
            first: dict[str, float] = {}
            finished: set[str] = set()
            done = asyncio.Event()

            async def follow() -> None:
                async for sc in store.follow():
                    rid = sc.commit.run_id
                    if rid and rid not in first:
                        first[rid] = time.time()
                    if any(type(e).__name__ == "RunFinished" for e in sc.commit.events):
                        finished.add(rid)
                        if len(finished) >= runs:
                            done.set()

            follower = asyncio.get_running_loop().create_task(follow())
            per_thread = runs // threads
            kinds = {"client": [os.getpid()], "workers": [p.pid for p in procs], "nats": [server.pid or 0]}
            cpu0 = {kind: cpu_ns(pids) for kind, pids in kinds.items()}
            t0 = time.perf_counter()

            async def one_thread(t: int) -> None:
                for r in range(per_thread):
                    rid = f"t{t}-r{r}"
                    submitted[rid] = time.time()
                    if rt is None:
                        await client.submit(StartRun(thread_id=f"t{t}", run_id=rid, agent_id="quick", messages=["hi"]))
                    else:  # baseline: the same runs driven in this process, thread by thread
                        await (await rt.start("quick", "hi", thread_id=f"t{t}", run_id=rid)).result()

            async with asyncio.timeout(300):
                await asyncio.gather(*(one_thread(t) for t in range(threads)))
                await done.wait()
            elapsed = time.perf_counter() - t0
            cpu = {kind: (cpu_ns(pids) - cpu0[kind]) / 1e6 / runs for kind, pids in kinds.items()}
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
            lat = [(first[r] - submitted[r]) * 1000 for r in submitted if r in first]
            return {"runs": len(finished), "seconds": elapsed, "runs_per_s": len(finished) / elapsed,
                    "p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95),
                    **{f"cpu_ms_{kind}": used for kind, used in cpu.items()}, "cpu_ms": sum(cpu.values())}
        finally:
            await stop_all(procs)
            await store.close()
            server.stop()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY,
                    help="runs each worker drives at once (default: the worker's own default)")
    ap.add_argument("--repeat", type=int, default=5, help="rounds of every configuration (medians)")
    args = ap.parse_args()
    runs = args.runs or (120 if args.quick else 600)
    threads = args.threads or (30 if args.quick else 100)
    configs = [0, 1, 2, 3]
    rounds: dict[int, list[dict[str, float]]] = {n: [] for n in configs}
    for _ in range(max(1, args.repeat)):
        for n in configs:
            rounds[n].append(await measure(n, runs, threads, args.concurrency))
    results = {n: {key: statistics.median(r[key] for r in measured) for key in measured[0]}
               for n, measured in rounds.items()}
    # each round's ratio against the baseline of the same round (the machine as it was then)
    ratios = {n: statistics.median(r["runs_per_s"] / b["runs_per_s"]
                                   for r, b in zip(rounds[n], rounds[0], strict=True))
              for n in configs}
    base = results[0]["runs_per_s"]
    print(f"bench_workers: {runs} runs over {threads} threads (4 commits each), worker concurrency {args.concurrency}, "
          f"{os.cpu_count()} CPUs, median of {max(1, args.repeat)} rounds")
    print(f"{'config':<24}{'runs/s':>10}{'x baseline':>12}{'p50 ms':>10}{'p95 ms':>10}"
          f"{'CPU ms/run':>12}{'client':>8}{'workers':>9}{'nats':>7}")
    for n in configs:
        r = results[n]
        name = "in-process baseline" if n == 0 else f"{n} worker process{'es' if n > 1 else ''}"
        print(f"{name:<24}{r['runs_per_s']:>10.1f}{ratios[n]:>12.2f}{r['p50_ms']:>10.1f}{r['p95_ms']:>10.1f}"
              f"{r['cpu_ms']:>12.2f}{r['cpu_ms_client']:>8.2f}{r['cpu_ms_workers']:>9.2f}{r['cpu_ms_nats']:>7.2f}")
    print("CPU ms/run: all three summed (client: this process, the whole runtime in the baseline); "
          f"{os.cpu_count()} CPUs to share")
    out: dict[str, Any] = {"bench": "workers", "quick": args.quick, "runs": runs, "threads": threads,
                           "concurrency": args.concurrency, "rounds": max(1, args.repeat),
                           "baseline_runs_per_s": round(base, 1)}
    for n in configs[1:]:
        r = results[n]
        out[f"w{n}_runs_per_s"] = round(r["runs_per_s"], 1)
        out[f"w{n}_ratio"] = round(ratios[n], 3)
        out[f"w{n}_first_commit_p50_ms"] = round(r["p50_ms"], 2)
        out[f"w{n}_first_commit_p95_ms"] = round(r["p95_ms"], 2)
        out[f"w{n}_cpu_ms_per_run"] = round(r["cpu_ms"], 3)
    out["baseline_first_commit_p50_ms"] = round(results[0]["p50_ms"], 2)
    out["baseline_cpu_ms_per_run"] = round(results[0]["cpu_ms"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    configure_logging("warning")  # run logs would drown the table (workers log to their own files)
    asyncio.run(main())
