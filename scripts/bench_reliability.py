"""Reliability report: chaos and scale, one section per failure mode.

    python scripts/bench_reliability.py [--quick] [--only crash,in_doubt,outage,poison,disk,stop,list,cluster]
        [--runs N]

Sections (each `async def run(quick) -> (rows, figures)`; rows are label -> value for the table,
figures go in the last-line JSON with the section name as key prefix):

- `crash`: N runs through a real `agentlog serve` process, which is SIGKILLed while the
  runs are mid-tool; a second `agentlog serve` starts on the same NATS. Reports runs finished /
  failed / lost, duplicated commits, calls completed twice, and the time from the kill until the
  last run finished (bounded by the command lease, `AGENTLOG_WORKER_ACK_WAIT`).
- `in_doubt`: N runs of a tool declared not idempotent (`pay`: each execution appends a line to a
  file outside the log) through a real `agentlog serve`, SIGKILLed mid-call again and again
  (each time a new `serve` starts on the same NATS). A resolver follows the log and answers each
  call that went in doubt as a human who checks the payment system would: `mark_done` when the
  file holds as many executions as were allowed (the first, plus each retry), else `retry`.
  Reports the kills, calls started / in doubt / marked done / retried, and `double_executions`
  (executions beyond those allowed: must be 0), calls completed twice or never, runs lost.
- `outage`: N runs on an in-process worker; the real nats-server is stopped for longer
  than the store's 5 s request timeout mid-load and restarted on the same port and data dir.
  Reports runs finished / failed (any non-natural end) / lost and duplicates.
- `poison`: runs through `agentlog serve` whose threads get undecodable messages
  mid-run, then more runs on the same threads. Reports runs finished / lost, bad messages
  published / quarantined, listings and `/messages` still answering, health ok without a restart.
- `disk`: runs through `agentlog serve` when the log fills up (the events stream
  at a `discard: new` byte limit) and while it is full, then with room again. Reports the 503s
  and `degraded` health while full, runs lost (accepted or queued, never finished: 0), health ok
  after and no restart.
- `stop`: a process that drives runs is stopped (SIGTERM) while their tool runs, with a
  `--shutdown-timeout` shorter than the tool and the default command lease (30 s); the next
  process starts. Twice: `agentlog serve` on its embedded nats-server (which stops with it, the
  default deployment), and an `agentlog worker` beside a gateway on a nats-server that stays up.
  Reports the time from SIGTERM to the exit, from the next process being ready until every run
  finished (the bound: the tool's time + 3 s; a run left to its lease would take ~30 s) and its
  ratio to the tool's time, the runs the stopping process said it handed back, and runs lost /
  duplicated.
- `list` and `cluster`: `scripts/reliability_list.py` and
  `scripts/reliability_cluster.py`, imported only when selected.

Both chaos sections first run the same load without a fault, as the baseline of their wall-time
ratio (`*_wall_ratio` = faulty wall / fault-free wall, same run, same machine). Prints a table per
section and, as the very last line, one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import logging
import os
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
sys.path[:0] = [str(ROOT / "src"), str(SCRIPTS)]

from agentlog.eventlog.embedded.server import EmbeddedNatsServer  # noqa: E402
from agentlog.eventlog.events import RunFinished, StoredCommit, ToolCallCompleted, ToolCallStarted  # noqa: E402
from agentlog.eventlog.jetstream.store import JetStreamEventStore  # noqa: E402
from agentlog.runtime import AgentSpec, Runtime, ToolContext, tool  # noqa: E402
from agentlog.runtime.models.scripted import ScriptedModel, Turn  # noqa: E402

Rows = list[tuple[str, str]]
Figures = dict[str, Any]
Section = Callable[[bool], Awaitable[tuple[Rows, Figures]]]

#: Each run: STEPS tool steps of one `work` call (STEP_S seconds each), then a text answer.
STEPS = 3
STEP_S = 0.3
#: The outage: longer than the store's default 5 s request timeout (the failure the issue reports).
OUTAGE_S = 6.0
#: How long the lease of a killed serve process's commands lasts in the crash section.
ACK_WAIT_S = 2.0
#: Bound on every wait of a section (a run not finished by then counts as lost).
LIMIT_S = 60.0
#: The stop section: how long the tool of its runs takes (`BENCH_STOP_TOOL_S` in the processes),
#: and the stopped process's `--shutdown-timeout`, shorter than that.
STOP_TOOL_S = {True: 2.0, False: 5.0}
STOP_SHUTDOWN_S = 0.5
#: What the next process may take beyond the tool's time to finish a handed-back run.
STOP_SLACK_S = 3.0


# == the app (also loaded by the `agentlog serve` subprocesses: --app bench_reliability:app) =========


@tool
async def work(k: int) -> str:
    """A unit of work that takes a while (so faults land mid-tool)."""
    await asyncio.sleep(STEP_S)  # the workload itself
    return f"worked {k}"


@tool
async def long_work() -> str:
    """One long unit of work ($BENCH_STOP_TOOL_S seconds): a stop lands in the middle of it."""
    await asyncio.sleep(float(os.environ.get("BENCH_STOP_TOOL_S", "2")))  # the workload itself
    return "worked long"


@tool(idempotent=False)
async def pay(k: int, ctx: ToolContext) -> str:
    """A payment: its effect (a line `<run_id> <call_id>` appended to $BENCH_PAYMENTS, outside the
    log) must not happen twice; a kill lands before or after it."""
    await asyncio.sleep(STEP_S / 2)  # the workload itself
    fd = os.open(os.environ["BENCH_PAYMENTS"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, f"{ctx.run_id} {ctx.call_id}\n".encode())
    finally:
        os.close(fd)
    await asyncio.sleep(STEP_S / 2)
    return f"paid {k}"


def app(store: Any) -> Runtime:
    agent = AgentSpec(id="steady", model="steady", tools=["work"], max_rounds=STEPS + 2)
    turns = [Turn.tool("work", {"k": i}) for i in range(STEPS)] + [Turn.text("done")]
    model = ScriptedModel(turns, loop=True, position="conversation")
    long = AgentSpec(id="long", model="long", tools=["long_work"], max_rounds=3)
    long_model = ScriptedModel([Turn.tool("long_work"), Turn.text("done")], loop=True, position="conversation")
    paying = AgentSpec(id="paying", model="paying", tools=["pay"], max_rounds=STEPS + 2)
    paying_model = ScriptedModel([Turn.tool("pay", {"k": i}) for i in range(STEPS)] + [Turn.text("done")],
                                 loop=True, position="conversation")
    return Runtime(store, agents=[agent, long, paying], tools=[work, long_work, pay],
                   models={"steady": model, "long": long_model, "paying": paying_model})


# == shared: watching and tallying runs ==============================================================


class Progress:
    """Follows the whole log; counts per run the completed calls and whether it finished."""

    def __init__(self, store: JetStreamEventStore) -> None:
        self.store = store
        self.completed: Counter[str] = Counter()
        self.finished: set[str] = set()
        #: Threads with a finished run (a run whose id the caller never got: a refused POST's).
        self.finished_threads: set[str] = set()
        self.changed = asyncio.Condition()
        self._task = asyncio.ensure_future(self._follow())

    async def _follow(self) -> None:
        async with contextlib.aclosing(self.store.follow(None, 0)) as commits:
            async for sc in commits:
                run = sc.commit.run_id or ""
                for e in sc.commit.events:
                    if isinstance(e, ToolCallCompleted):
                        self.completed[run] += 1
                    elif isinstance(e, RunFinished):
                        self.finished.add(run)
                        self.finished_threads.add(sc.commit.thread_id)
                async with self.changed:
                    self.changed.notify_all()

    async def until(self, pred: Callable[[Progress], bool], timeout: float) -> bool:
        """Wait (bounded) until `pred` holds; False on timeout."""
        try:
            async with asyncio.timeout(timeout):
                async with self.changed:
                    await self.changed.wait_for(lambda: pred(self))
            return True
        except TimeoutError:
            return False

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def tally(store: JetStreamEventStore, runs: dict[str, str]) -> Figures:
    """runs: run_id -> thread_id. From the log: finished naturally / failed (another termination)
    / lost (no finish), duplicated commits, calls completed more than once."""
    figures = {"runs": len(runs), "finished": 0, "failed": 0, "lost": 0, "duplicated_commits": 0,
               "duplicated_completions": 0}
    for thread in sorted(set(runs.values())):
        commits: list[StoredCommit] = [sc async for sc in store.read_thread(thread)]
        ids = [sc.commit.commit_id for sc in commits]
        figures["duplicated_commits"] += len(ids) - len(set(ids))
        completions = Counter((sc.commit.run_id, e.call_id) for sc in commits for e in sc.commit.events
                              if isinstance(e, ToolCallCompleted))
        figures["duplicated_completions"] += sum(n - 1 for n in completions.values())
        ends = {sc.commit.run_id: e.termination.type for sc in commits for e in sc.commit.events
                if isinstance(e, RunFinished)}
        for run_id in (r for r, t in runs.items() if t == thread):
            end = ends.get(run_id)
            figures["lost" if end is None else "finished" if end == "natural_end" else "failed"] += 1
    return figures


def chaos_rows(figures: Figures) -> Rows:
    return [
        ("runs", str(figures["runs"])),
        ("finished (natural end)", str(figures["finished"])),
        ("failed (other termination)", str(figures["failed"])),
        ("lost (never finished)", str(figures["lost"])),
        ("duplicated commits", str(figures["duplicated_commits"])),
        ("calls completed twice", str(figures["duplicated_completions"])),
        ("fault-free wall s", f"{figures['baseline_wall_s']:.2f}"),
        ("faulty wall s", f"{figures['wall_s']:.2f}"),
        ("wall ratio (faulty / fault-free)", f"{figures['wall_ratio']:.2f}"),
    ]


def _finish_figures(figures: Figures, baseline_s: float, wall_s: float) -> Figures:
    figures.update(baseline_wall_s=round(baseline_s, 3), wall_s=round(wall_s, 3),
                   wall_ratio=round(wall_s / baseline_s, 3) if baseline_s else None)
    return figures


# == crash ==============================================================================================


async def _spawn(role: str, logdir: Path, name: str, *args: str, env: dict[str, str] | None = None
                 ) -> tuple[asyncio.subprocess.Process, str, str]:
    """`agentlog <role> --app bench_reliability:app <args>`, once its banner is printed: the
    process, its HTTP URL ("" for a worker) and its NATS URL."""
    agentlog = str(Path(sys.executable).parent / "agentlog")
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "AGENTLOG_LOG_LEVEL": "warning",
           "PYTHONPATH": str(SCRIPTS), **(env or {})}
    http = ["--port", "0", "--tokens", ""] if role in ("serve", "gateway") else []
    with open(logdir / f"{name}.log", "wb") as log:
        proc = await asyncio.create_subprocess_exec(
            agentlog, role, "--app", "bench_reliability:app", *http, *args,
            stdout=asyncio.subprocess.PIPE, stderr=log, stdin=asyncio.subprocess.DEVNULL, env=env, cwd=str(ROOT))
    assert proc.stdout is not None
    banner = ""
    while "NATS" not in banner:
        line = (await proc.stdout.readline()).decode()
        if not line:
            raise RuntimeError(f"agentlog {role} exited before its banner (see {logdir / name}.log)")
        banner += line
    found = re.search(r"HTTP\s+│\s+(http://127\.0\.0\.1:\d+)", banner)
    if http and not found:
        raise RuntimeError(f"no HTTP address in the {role} banner: {banner!r}")
    nats = re.search(r"NATS\s+│\s+(nats://127\.0\.0\.1:\d+)", banner)
    if not nats:
        raise RuntimeError(f"no NATS address in the {role} banner: {banner!r}")
    return proc, found.group(1) if found else "", nats.group(1)


async def _spawn_serve(nats_url: str, logdir: Path, name: str) -> tuple[asyncio.subprocess.Process, str]:
    proc, url, _nats = await _spawn("serve", logdir, name, "--nats", nats_url,
                                    env={"AGENTLOG_WORKER_ACK_WAIT": str(ACK_WAIT_S)})
    return proc, url


async def _post_runs(url: str, n: int, tag: str, agent_id: str = "steady") -> dict[str, str]:
    import aiohttp

    async with aiohttp.ClientSession(url) as http:
        async def one(i: int) -> tuple[str, str]:
            body = {"agent_id": agent_id, "messages": "go", "thread_id": f"{tag}{i}"}
            async with http.post("/v1/runs", json=body) as r:
                if r.status != 202:
                    raise RuntimeError(f"POST /v1/runs answered {r.status}: {await r.text()}")
                got = await r.json()
                return got["run_id"], got["thread_id"]

        return dict(await asyncio.gather(*(one(i) for i in range(n))))


@contextlib.asynccontextmanager
async def _testbed(name: str) -> AsyncIterator[tuple[Path, EmbeddedNatsServer, JetStreamEventStore, Progress]]:
    """A fresh nats-server in a temp dir, a store on it and a `Progress` over its whole log."""
    with tempfile.TemporaryDirectory(prefix=f"agentlog-bench-{name}-") as tmp:
        server = EmbeddedNatsServer(Path(tmp) / "nats")
        await server.astart()
        store = await JetStreamEventStore.connect(server.url)
        progress = Progress(store)
        try:
            yield Path(tmp), server, store, progress
        finally:
            await progress.close()
            await store.close()
            await server.astop()


async def _calm_then_chaos(submit: Callable[[str], Awaitable[dict[str, str]]],
                           fault: Callable[[], Awaitable[tuple[float, Figures]]],
                           store: JetStreamEventStore, progress: Progress) -> Figures:
    """The same load twice: without a fault (the baseline), then with `fault()` injected once every
    run is past its first call (all mid-run). `fault` returns when its damage is done and whatever
    it measured, with the instant recovery starts from (`recovery_s` = then -> all finished)."""
    t0 = time.perf_counter()
    calm = await submit("calm")
    await progress.until(lambda p: calm.keys() <= p.finished, LIMIT_S)
    baseline_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    chaos = await submit("chaos")
    await progress.until(lambda p: all(p.completed[r] >= 1 for r in chaos), LIMIT_S)
    mark, extra = await fault()
    await progress.until(lambda p: chaos.keys() <= p.finished, LIMIT_S)
    done = time.perf_counter()
    figures = _finish_figures(await tally(store, chaos), baseline_s, done - t0)
    figures["recovery_s"] = round(done - mark, 3)
    figures.update(extra)
    return figures


async def crash(quick: bool, runs: int | None = None) -> tuple[Rows, Figures]:
    n = runs or (20 if quick else 100)
    procs: list[asyncio.subprocess.Process] = []
    async with _testbed("crash") as (tmp, server, store, progress):
        try:
            first, url = await _spawn_serve(server.url, tmp, "first")
            procs.append(first)

            async def kill_and_restart() -> tuple[float, Figures]:
                first.send_signal(signal.SIGKILL)
                await first.wait()
                killed = time.perf_counter()
                second, _url = await _spawn_serve(server.url, tmp, "second")
                procs.append(second)
                return killed, {"ack_wait_s": ACK_WAIT_S}

            figures = await _calm_then_chaos(lambda tag: _post_runs(url, n, tag), kill_and_restart, store, progress)
        finally:
            for p in procs:
                if p.returncode is None:
                    p.kill()
                    await p.wait()
    rows = chaos_rows(figures) + [("kill -9 -> all finished s", f"{figures['recovery_s']:.2f}"),
                                  ("command lease (ack_wait) s", f"{ACK_WAIT_S:g}")]
    return rows, figures


# == in doubt ===========================================================================================


def _payments(path: Path) -> Counter[tuple[str, str]]:
    """(run_id, call_id) -> executions, from the payments file."""
    lines = path.read_text().splitlines() if path.exists() else []
    return Counter((run, call) for run, call in (line.split() for line in lines))


class Resolver:
    """Answers every call that goes in doubt, as a human who checks the payment system: the
    execution it allowed last is in the file -> `mark_done`, else `retry` (one more allowed)."""

    def __init__(self, store: JetStreamEventStore, payments: Path) -> None:
        self.store = store
        self.payments = payments
        self.url = ""
        self.ready = asyncio.Event()  # a serve answers at `url`
        self.allowed: Counter[tuple[str, str]] = Counter()
        self.started: set[tuple[str, str]] = set()
        self.in_doubt: Counter[tuple[str, str]] = Counter()
        self.marked_done = 0
        self.retried = 0
        self.errors = 0
        self._task = asyncio.ensure_future(self._follow())

    async def _follow(self) -> None:
        from agentlog.eventlog.events import IN_DOUBT_ACTION, ToolCallSuspended

        async with contextlib.aclosing(self.store.follow(None, 0)) as commits:
            async for sc in commits:
                run = sc.commit.run_id or ""
                for e in sc.commit.events:
                    if isinstance(e, ToolCallStarted):
                        if (run, e.call_id) not in self.started:
                            self.allowed[(run, e.call_id)] += 1  # the first execution
                        self.started.add((run, e.call_id))
                    elif isinstance(e, ToolCallSuspended) and e.ticket.action == IN_DOUBT_ACTION:
                        self.in_doubt[(run, e.call_id)] += 1
                        await self._resolve(run, e.call_id)

    async def _resolve(self, run_id: str, call_id: str) -> None:
        import aiohttp

        key = (run_id, call_id)
        happened = _payments(self.payments)[key] >= self.allowed[key]
        answer: dict[str, Any] = {"action": "mark_done", "result": "paid (checked)"} if happened else {"action": "retry"}
        decision = {"target_id": call_id, "decision_id": f"resolve-{call_id}-{self.in_doubt[key]}",
                    "action": "resume", "result": answer}
        while True:
            await self.ready.wait()
            try:
                async with aiohttp.ClientSession(self.url) as http:
                    async with http.post(f"/v1/runs/{run_id}/inputs", json={"decisions": [decision]}) as r:
                        if r.status in (200, 202):
                            break
                        self.errors += 1
                        return
            except aiohttp.ClientError:
                self.ready.clear()  # killed meanwhile: the next serve takes it
        if happened:
            self.marked_done += 1
        else:
            self.retried += 1
            self.allowed[key] += 1

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def in_doubt(quick: bool, runs: int | None = None) -> tuple[Rows, Figures]:
    n = runs or (10 if quick else 50)
    kills = 3 if quick else 8
    procs: list[asyncio.subprocess.Process] = []
    async with _testbed("in_doubt") as (tmp, server, store, progress):
        payments = tmp / "payments"
        resolver = Resolver(store, payments)
        env = {"AGENTLOG_WORKER_ACK_WAIT": str(ACK_WAIT_S), "BENCH_PAYMENTS": str(payments)}
        try:
            proc, resolver.url, _nats = await _spawn("serve", tmp, "serve-0", "--nats", server.url, env=env)
            procs.append(proc)
            resolver.ready.set()
            t0 = time.perf_counter()
            chaos = await _post_runs(resolver.url, n, "pay", agent_id="paying")
            for k in range(kills):
                # mid-call: once the runs have started calls since the last restart
                seen = len(resolver.started)
                await progress.until(lambda p, seen=seen: len(resolver.started) >= seen + max(1, n // 2)
                                     or chaos.keys() <= p.finished, LIMIT_S)
                if chaos.keys() <= progress.finished:
                    break
                resolver.ready.clear()
                proc.send_signal(signal.SIGKILL)
                await proc.wait()
                proc, resolver.url, _nats = await _spawn("serve", tmp, f"serve-{k + 1}", "--nats", server.url,
                                                         env=env)
                procs.append(proc)
                resolver.ready.set()
            await progress.until(lambda p: chaos.keys() <= p.finished, LIMIT_S)
            wall_s = time.perf_counter() - t0
            figures = await tally(store, chaos)
        finally:
            await resolver.close()
            for p in procs:
                if p.returncode is None:
                    p.kill()
                    await p.wait()
        executed = _payments(payments)
        ours = {key for key in resolver.started if key[0] in chaos}
        completed: Counter[tuple[str, str]] = Counter()
        for thread in sorted(set(chaos.values())):
            async for sc in store.read_thread(thread):
                for e in sc.commit.events:
                    if isinstance(e, ToolCallCompleted):
                        completed[(sc.commit.run_id or "", e.call_id)] += 1
    figures.update(
        kills=len(procs) - 1, calls=len(ours), suspensions=sum(resolver.in_doubt[key] for key in ours),
        calls_in_doubt=sum(1 for key in ours if resolver.in_doubt[key]),
        marked_done=resolver.marked_done, retried=resolver.retried, resolve_errors=resolver.errors,
        executions=sum(executed[key] for key in ours),
        double_executions=sum(max(0, executed[key] - resolver.allowed[key]) for key in ours),
        never_completed=sum(1 for key in ours if completed[key] == 0), wall_s=round(wall_s, 3),
    )
    rows: Rows = [
        ("runs", str(figures["runs"])),
        ("finished (natural end)", str(figures["finished"])),
        ("lost (never finished)", str(figures["lost"])),
        ("kill -9 mid-call", str(figures["kills"])),
        ("calls started", str(figures["calls"])),
        ("calls that went in doubt", str(figures["calls_in_doubt"])),
        ("in-doubt suspensions", str(figures["suspensions"])),
        ("resolved mark_done", str(figures["marked_done"])),
        ("resolved retry", str(figures["retried"])),
        ("executions (payments file)", str(figures["executions"])),
        ("double executions", str(figures["double_executions"])),
        ("calls completed twice", str(figures["duplicated_completions"])),
        ("calls never completed", str(figures["never_completed"])),
        ("wall s", f"{wall_s:.2f}"),
    ]
    return rows, figures


# == outage =============================================================================================


async def outage(quick: bool, runs: int | None = None) -> tuple[Rows, Figures]:
    from agentlog.runtime.inputs.commands import StartRun
    from agentlog.runtime.workers.commands import CommandClient
    from agentlog.runtime.workers.worker import Worker

    n = runs or (20 if quick else 100)
    async with _testbed("outage") as (_tmp, server, store, progress):
        worker = Worker(store, runtime=app(store), concurrency=n)
        try:
            await worker.start()
            client = CommandClient(store.nc)

            async def submit(tag: str) -> dict[str, str]:
                cmds = [StartRun(thread_id=f"{tag}{i}", agent_id="steady", messages=["go"]) for i in range(n)]
                await asyncio.gather(*(client.submit(c) for c in cmds))
                return {c.run_id: c.thread_id for c in cmds}

            async def stop_nats() -> tuple[float, Figures]:
                await server.astop()
                down = time.perf_counter()
                await asyncio.sleep(OUTAGE_S)  # the outage itself (the scenario, not synchronisation)
                await server.astart()  # same port, same data dir
                up = time.perf_counter()
                return up, {"outage_s": round(up - down, 3)}

            figures = await _calm_then_chaos(submit, stop_nats, store, progress)
        finally:
            await worker.stop(timeout=2)
    rows = chaos_rows(figures) + [("NATS down s", f"{figures['outage_s']:.2f}"),
                                  ("NATS back -> all finished s", f"{figures['recovery_s']:.2f}")]
    return rows, figures


# == stop ===============================================================================================


async def _all_started(store: JetStreamEventStore, runs: dict[str, str]) -> None:
    """Until every run's tool call has started (bounded by the caller)."""
    waiting = set(runs)
    async with contextlib.aclosing(store.follow(None, 0)) as commits:
        async for sc in commits:
            if any(isinstance(e, ToolCallStarted) for e in sc.commit.events):
                waiting.discard(sc.commit.run_id or "")
                if not waiting:
                    return


def _handed_back(log: Path) -> int:
    """How many runs the stopping process said it handed back (`handing N runs back (...)`)."""
    found = re.findall(r"handing (\d+) runs? back", log.read_text(errors="replace"))
    return sum(int(n) for n in found)


async def _takeover(store: JetStreamEventStore, runs: dict[str, str], ready: float) -> tuple[float, Figures]:
    """Seconds from `ready` until every run finished, and the tally."""
    progress = Progress(store)
    try:
        await progress.until(lambda p: runs.keys() <= p.finished, LIMIT_S)
        took = time.perf_counter() - ready
    finally:
        await progress.close()
    return took, await tally(store, runs)


async def _stop_serve(tmp: Path, n: int, env: dict[str, str]) -> Figures:
    """`agentlog serve` on its embedded nats-server: SIGTERM mid-tool, then the next `serve` on the
    same data dir (its nats-server was stopped with the first one, and starts again with it)."""
    from agentlog.eventlog.roles import load_or_create_credentials

    data = tmp / "data"
    args = ("--data-dir", str(data), "--shutdown-timeout", str(STOP_SHUTDOWN_S))
    first, url, nats = await _spawn("serve", tmp, "stop-serve-first", *args, env=env)
    try:
        login = load_or_create_credentials(data).login("readonly")
        store = await JetStreamEventStore.connect(nats, **login)
        try:
            runs = await _post_runs(url, n, "s", "long")
            await asyncio.wait_for(_all_started(store, runs), LIMIT_S)
        finally:
            await store.close()
        signalled = time.perf_counter()
        first.send_signal(signal.SIGTERM)
        await first.wait()
        exit_s = time.perf_counter() - signalled
        second, _url, nats = await _spawn("serve", tmp, "stop-serve-second", *args, env=env)
        ready = time.perf_counter()
        try:
            store = await JetStreamEventStore.connect(nats, **login)
            try:
                took, figures = await _takeover(store, runs, ready)
            finally:
                await store.close()
        finally:
            second.send_signal(signal.SIGTERM)
            await second.wait()
    finally:
        if first.returncode is None:
            first.kill()
            await first.wait()
    figures.update(takeover_s=round(took, 3), exit_s=round(exit_s, 3),
                   handed_back=_handed_back(tmp / "stop-serve-first.log"))
    return figures


async def _stop_worker(tmp: Path, n: int, env: dict[str, str]) -> Figures:
    """`agentlog gateway` + `agentlog worker` on a nats-server that stays up: SIGTERM the worker
    mid-tool, then start the next worker."""
    procs: list[asyncio.subprocess.Process] = []
    server = EmbeddedNatsServer(tmp / "nats")
    await server.astart()
    try:
        store = await JetStreamEventStore.connect(server.url)
        try:
            gateway, url, _nats = await _spawn("gateway", tmp, "stop-gateway", "--nats", server.url, env=env)
            procs.append(gateway)
            worker_args = ("--nats", server.url, "--shutdown-timeout", str(STOP_SHUTDOWN_S), "--concurrency", str(n))
            first, _url, _nats = await _spawn("worker", tmp, "stop-worker-first", *worker_args, env=env)
            procs.append(first)
            runs = await _post_runs(url, n, "w", "long")
            await asyncio.wait_for(_all_started(store, runs), LIMIT_S)
            signalled = time.perf_counter()
            first.send_signal(signal.SIGTERM)
            await first.wait()
            exit_s = time.perf_counter() - signalled
            second, _url, _nats = await _spawn("worker", tmp, "stop-worker-second", *worker_args, env=env)
            procs.append(second)
            took, figures = await _takeover(store, runs, time.perf_counter())
        finally:
            await store.close()
    finally:
        for p in procs:
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
                await p.wait()
        await server.astop()
    figures.update(takeover_s=round(took, 3), exit_s=round(exit_s, 3),
                   handed_back=_handed_back(tmp / "stop-worker-first.log"))
    return figures


async def stop(quick: bool, runs: int | None = None) -> tuple[Rows, Figures]:
    n = runs or (5 if quick else 20)
    tool_s = STOP_TOOL_S[quick]
    env = {"BENCH_STOP_TOOL_S": str(tool_s)}  # the default lease (30 s): what a user runs
    figures: Figures = {"runs": n, "tool_s": tool_s, "shutdown_timeout_s": STOP_SHUTDOWN_S,
                        "bound_s": tool_s + STOP_SLACK_S}
    rows: Rows = [("runs stopped mid-tool (each topology)", str(n)), ("tool s", f"{tool_s:g}"),
                  ("--shutdown-timeout s", f"{STOP_SHUTDOWN_S:g}"), ("bound: tool + 3 s", f"{tool_s + STOP_SLACK_S:g}")]
    with tempfile.TemporaryDirectory(prefix="agentlog-bench-stop-") as tmp:
        for kind, scenario in (("serve", _stop_serve), ("worker", _stop_worker)):
            where = Path(tmp) / kind
            where.mkdir()
            got = await scenario(where, n, env)
            ok = got["finished"] == n and got["takeover_s"] <= tool_s + STOP_SLACK_S
            figures.update({f"{kind}_{k}": v for k, v in got.items()})
            figures[f"{kind}_takeover_over_tool"] = round(got["takeover_s"] / tool_s, 3)
            figures[f"{kind}_within_bound"] = ok
            label = "serve (embedded NATS)" if kind == "serve" else "worker (beside a gateway)"
            rows += [(f"{label}: SIGTERM -> exited s", f"{got['exit_s']:.2f}"),
                     (f"{label}: next ready -> all finished s", f"{got['takeover_s']:.2f}"),
                     (f"{label}: / tool time", f"{got['takeover_s'] / tool_s:.2f}"),
                     (f"{label}: said handed back", str(got["handed_back"])),
                     (f"{label}: finished / lost / dup commits",
                      f"{got['finished']} / {got['lost']} / {got['duplicated_commits']}"),
                     (f"{label}: within the bound", str(ok))]
    return rows, figures


# == poison =============================================================================================

#: Bytes that are not a commit, as anyone with `worker`/`gateway` NATS credentials can publish them.
POISONS = (b"{not json", b"\x00\xff garbage", b'{"v": 99, "commit_id": "x", "thread_id": "x", "ts": 1, "events": []}')


async def _http_json(url: str, path: str) -> tuple[int, Any]:
    import aiohttp

    async with aiohttp.ClientSession(url) as http, http.get(path) as r:
        text = await r.text()
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text


async def _cli_ok(nats_url: str, *args: str) -> bool:
    """`agentlog <args> --nats URL` exits 0 (what an operator runs)."""
    agentlog = str(Path(sys.executable).parent / "agentlog")
    proc = await asyncio.create_subprocess_exec(
        agentlog, *args, "--nats", nats_url, "--json", stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL, stdin=asyncio.subprocess.DEVNULL)
    return await proc.wait() == 0


def _quarantined(metrics_text: str) -> int:
    for line in metrics_text.splitlines():
        if line.startswith("agentlog_commits_quarantined_total"):
            return int(float(line.split()[-1]))
    return -1


async def poison(quick: bool, runs: int | None = None) -> tuple[Rows, Figures]:
    """N runs through `agentlog serve`; once all are mid-run, undecodable messages are published on
    their threads (thread level and on the run's own subject), then, once those runs are done,
    N more runs go on the same threads. Every run must finish, listings and /messages keep working, every bad message is
    quarantined once, health stays ok, and no process is restarted."""
    import nats as nats_client

    n = runs or (10 if quick else 50)
    async with _testbed("poison") as (tmp, server, store, progress):
        proc, url = await _spawn_serve(server.url, tmp, "serve")
        try:
            t0 = time.perf_counter()
            first = await _post_runs(url, n, "p")
            await progress.until(lambda p: all(p.completed[r] >= 1 for r in first), LIMIT_S)
            nc = await nats_client.connect(server.url)
            try:
                js = nc.jetstream()
                bad = 0
                for i, (run_id, thread) in enumerate(first.items()):
                    await js.publish(f"agentlog.ev.{thread}._", POISONS[i % len(POISONS)])
                    await js.publish(f"agentlog.ev.{thread}.{run_id}", POISONS[(i + 1) % len(POISONS)])
                    bad += 2
            finally:
                await nc.close()
            await progress.until(lambda p: first.keys() <= p.finished, LIMIT_S)
            second = await _post_runs(url, n, "p")  # the same threads, past their bad messages
            everything = {**first, **second}
            await progress.until(lambda p: everything.keys() <= p.finished, LIMIT_S)
            wall = time.perf_counter() - t0
            figures = await tally(store, everything)
            messages = [(await _http_json(url, f"/v1/threads/{t}/messages"))[0] for t in sorted(set(first.values()))]
            listings = await _cli_ok(server.url, "runs") and await _cli_ok(server.url, "threads")
            status, body = await _http_json(url, "/health")
            _, metrics = await _http_json(url, "/metrics")
            figures.update(poisoned=bad, quarantined=_quarantined(str(metrics)),
                           messages_ok=sum(s == 200 for s in messages), threads=len(messages),
                           listings_ok=listings, healthy=status == 200 and body.get("status") == "ok",
                           restarted=proc.returncode is not None, wall_s=round(wall, 3))
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    rows = [
        ("runs (half after the bad messages)", str(figures["runs"])),
        ("finished (natural end)", str(figures["finished"])),
        ("failed (other termination)", str(figures["failed"])),
        ("lost (never finished)", str(figures["lost"])),
        ("bad messages published", str(figures["poisoned"])),
        ("quarantined (metric)", str(figures["quarantined"])),
        ("threads whose /messages answer 200", f"{figures['messages_ok']}/{figures['threads']}"),
        ("agentlog runs + threads exit 0", str(figures["listings_ok"])),
        ("health ok, no restart", str(figures["healthy"] and not figures["restarted"])),
        ("wall s", f"{figures['wall_s']:.2f}"),
    ]
    return rows, figures


# == disk ===============================================================================================


async def _limit_events(nats_url: str, room: int | None) -> None:
    """Leave `room` bytes in the events stream with `discard: new` (what a full disk or a quota
    does to writes), or lift the limit (None)."""
    import nats as nats_client
    from nats.js.api import DiscardPolicy

    nc = await nats_client.connect(nats_url)
    try:
        js = nc.jetstream()
        info = await js.stream_info("AGENTLOG_EVENTS")
        config = info.config
        config.max_bytes = -1 if room is None else info.state.bytes + room
        config.discard = DiscardPolicy.OLD if room is None else DiscardPolicy.NEW
        await js.update_stream(config)
    finally:
        await nc.close()


async def _post_statuses(url: str, n: int, tag: str) -> tuple[dict[str, str], list[int]]:
    """POST n runs on threads `<tag><i>`: (accepted run -> thread, every status answered)."""
    import aiohttp

    async with aiohttp.ClientSession(url) as http:
        async def one(i: int) -> tuple[int, Any]:
            body = {"agent_id": "steady", "messages": "go", "thread_id": f"{tag}{i}"}
            async with http.post("/v1/runs", json=body) as r:
                return r.status, await r.json()

        answers = await asyncio.gather(*(one(i) for i in range(n)))
    return {b["run_id"]: b["thread_id"] for s, b in answers if s == 202}, [s for s, _ in answers]


async def disk(quick: bool, runs: int | None = None) -> tuple[Rows, Figures]:
    """N runs through `agentlog serve` are mid-run when the log fills up (the events stream at a
    `discard: new` byte limit); N more are posted while it is full (503, or 202 if they squeeze in)
    and /health must say `degraded`. Then there is room again: every run accepted or queued
    finishes, health is `ok`, and the serve process was never restarted."""
    n = runs or (10 if quick else 50)
    async with _testbed("disk") as (tmp, server, store, progress):
        proc, url = await _spawn_serve(server.url, tmp, "serve")
        try:
            t0 = time.perf_counter()
            before = await _post_runs(url, n, "d")
            await progress.until(lambda p: all(p.completed[r] >= 1 for r in before), LIMIT_S)
            await _limit_events(server.url, 0)
            full_at = time.perf_counter()
            during, statuses = await _post_statuses(url, n, "full")
            _, degraded = await _http_json(url, "/health")
            await _limit_events(server.url, None)
            freed = time.perf_counter()
            # a refused POST is still queued: its thread must get a finished run too
            refused = [f"full{i}" for i, s in enumerate(statuses) if s != 202]
            await progress.until(lambda p: before.keys() <= p.finished and during.keys() <= p.finished
                                 and set(refused) <= p.finished_threads, LIMIT_S)
            figures = await tally(store, {**before, **during})
            finished_threads = set(refused) & progress.finished_threads
            after, _ = await _post_statuses(url, n, "after")
            await progress.until(lambda p: after.keys() <= p.finished, LIMIT_S)
            recovered = time.perf_counter()
            status, health = await _http_json(url, "/health")
            figures.update(
                refused_503=sum(s == 503 for s in statuses), accepted_while_full=len(during),
                queued_refused=len(refused), queued_refused_finished=len(finished_threads),
                lost=figures["lost"] + len(refused) - len(finished_threads),
                after_accepted=len(after), degraded_seen=degraded.get("status") == "degraded",
                healthy_after=status == 200 and health.get("status") == "ok",
                restarted=proc.returncode is not None,
                full_s=round(freed - full_at, 3), recovery_s=round(recovered - freed, 3),
                wall_s=round(recovered - t0, 3))
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    rows = [
        ("runs mid-run when the log filled", str(n)),
        ("POSTs while full: 503", str(figures["refused_503"])),
        ("/health while full", "degraded" if figures["degraded_seen"] else "NOT degraded"),
        ("runs finished (natural end)", str(figures["finished"])),
        ("failed (other termination)", str(figures["failed"])),
        ("refused POSTs whose queued run finished", f"{figures['queued_refused_finished']}/{figures['queued_refused']}"),
        ("lost (accepted or queued, never finished)", str(figures["lost"])),
        ("duplicated commits", str(figures["duplicated_commits"])),
        ("runs accepted after room is back", f"{figures['after_accepted']}/{n}"),
        ("health ok after, no restart", str(figures["healthy_after"] and not figures["restarted"])),
        ("full s (until room is back)", f"{figures['full_s']:.2f}"),
        ("room back -> new runs done s", f"{figures['recovery_s']:.2f}"),
    ]
    return rows, figures


# == the report =====================================================================================


def _external(module: str, **options: Any) -> Section:
    """A section kept in its own module, `scripts/<module>.py` (`async def run(quick, **options)`),
    imported only when selected (the cluster section needs three nats-servers, the list one builds
    20k runs)."""

    async def run(quick: bool) -> tuple[Rows, Figures]:
        return await importlib.import_module(module).run(quick, **options)

    return run


def sections(runs: int | None, list_sizes: tuple[int, ...] | None = None) -> dict[str, Section]:
    return {
        "crash": lambda quick: crash(quick, runs),
        "in_doubt": lambda quick: in_doubt(quick, runs),
        "outage": lambda quick: outage(quick, runs),
        "poison": lambda quick: poison(quick, runs),
        "disk": lambda quick: disk(quick, runs),
        "stop": lambda quick: stop(quick, runs),
        "list": _external("reliability_list", **({"sizes": list_sizes} if list_sizes else {})),
        "cluster": _external("reliability_cluster"),
    }


def prefixed(name: str, figures: Figures) -> Figures:
    """Section figures under `<name>_` (kept as is when a module already prefixed them)."""
    return {(k if k.startswith(f"{name}_") else f"{name}_{k}"): v for k, v in figures.items()}


def print_table(name: str, rows: Iterable[tuple[str, str]], seconds: float) -> None:
    rows = list(rows)
    width = max([len(label) for label, _ in rows] + [20])
    print(f"\n[{name}]  ({seconds:.1f} s)")
    for label, value in rows:
        print(f"  {label:<{width}}  {value:>12}")


async def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: finishes in well under a minute")
    ap.add_argument("--only", help="comma-separated sections (crash, in_doubt, outage, poison, disk, stop, list, "
                                   "cluster); "
                                   "default all")
    ap.add_argument("--runs", type=int, help="runs per chaos section (default 20 quick, 100 full)")
    ap.add_argument("--list-sizes", help="the list section's run counts, comma separated, smallest first, whole "
                                         "thousands (default 1000,20000 quick, 1000,20000,100000 full)")
    args = ap.parse_args(argv)
    list_sizes = tuple(int(size) for size in args.list_sizes.split(",")) if args.list_sizes else None
    available = sections(args.runs, list_sizes)
    chosen = [s.strip() for s in args.only.split(",")] if args.only else list(available)
    unknown = [s for s in chosen if s not in available]
    if unknown:
        ap.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(available)}")

    from agentlog.cli.logging import configure as configure_logging

    configure_logging("error")
    logging.getLogger("agentlog").setLevel(logging.ERROR)  # stdlib loggers too (quarantine, projections)
    out: Figures = {"bench": "reliability", "quick": args.quick, "sections": chosen}
    print(f"bench_reliability: sections {', '.join(chosen)}{' (quick)' if args.quick else ''}, {os.cpu_count()} CPUs")
    failed: list[str] = []
    for name in chosen:
        t0 = time.perf_counter()
        try:
            rows, figures = await available[name](args.quick)
        except Exception as exc:  # noqa: BLE001 - a section that breaks is reported, the others still run
            rows, figures = [("FAILED", f"{type(exc).__name__}: {exc}")], {"error": f"{type(exc).__name__}: {exc}"}
            failed.append(name)
        print_table(name, rows, time.perf_counter() - t0)
        out.update(prefixed(name, figures))
    out["failed_sections"] = failed
    print(json.dumps(out))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
