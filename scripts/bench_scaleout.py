#!/usr/bin/env python
"""Several `agentlog gateway` processes on one NATS: what a second gateway costs, and what losing one does.

    python scripts/bench_scaleout.py [--quick] [--runs N] [--sections writes,failover]

Every run is one approval: start (`gated` agent: a call that waits for a human), follow until it
waits, approve, follow until it finishes. The client is `agentlog.client`, one per gateway.

- writes: the same runs through 1 gateway (+ 1 worker), then 2 gateways (+ 1 worker) sharing one
  nats-server, the client alternating gateways, one run at a time (`--writes-concurrency`). KV puts (run and thread views, listing index)
  per commit of the log: `gateways_2_view_writes_per_commit` = 2 gateways / 1 gateway (only the
  holder of the writer lease writes; target <= 1.1). Also the CPU seconds per run of all the
  agentlog processes (Linux schedstat), over the same runs driven in this one process (a
  `Runtime` and a lease-less `ProjectionRunner`, no HTTP): `split_cpu_per_run_over_inprocess`
  (1 gateway + 1 worker) and `gateways_2_cpu_per_run_over_inprocess`. And the same client load
  through one `agentlog serve` (gateway and worker in one process): `split_cpu_per_run_over_serve`,
  what splitting the tiers into processes costs, the HTTP, SSE and projection work of the
  gateway being in both.
- failover (`failover()`, which tests/e2e/test_scaleout.py asserts on): a 3-node cluster, R3,
  2 gateways and 2 workers; the client alternates gateways for starts, decisions, reads (with
  `min_seq`) and follows; a third of the way in, the gateway holding the writer lease is
  SIGKILLed, then restarted once another one writes; the last third of the runs starts after
  the restart. `runner_failover_s`: from the SIGKILL until the views hold a commit appended right
  after it (target <= 5). `lost_runs`, `duplicate_runs` (target 0), `stale_reads` (a read with
  `min_seq` answered with a view older than it: 0), `views_match` (every view equals the fold of
  the log afterwards, and so do the listings). `/v1/changes` stays live on every gateway: a
  stream opened on the other gateway before the kill is told of the run followed across it
  (`changes_after_kill`), and one opened on the restarted gateway (a standby then) of every run
  started after the restart (`changes_missed`: 0).

Prints a rich table and, as the very last line, `{"bench": "scaleout", ...}`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "src"))  # agentlog from this checkout, installed or not
sys.path.insert(0, str(SCRIPTS))

from agentlog.client.aio import AsyncClient  # noqa: E402
from agentlog.client.errors import Conflict, ConnectionFailed, Unavailable  # noqa: E402
from agentlog.eventlog.events import Commit, Position, RunFinished, RunStarted, ThreadCreated, Usage  # noqa: E402
from agentlog.eventlog.jetstream.store import JetStreamEventStore  # noqa: E402
from agentlog.runtime import (  # noqa: E402
    AgentSpec,
    App,
    ToolContext,
    ToolResult,
    tool,
)
from agentlog.runtime.models import ScriptedModel, Turn  # noqa: E402

import bench_e2e  # noqa: E402  (its process wrapper and CPU reader)

APP = "bench_scaleout:app"
USAGE = Usage(input_tokens=100, output_tokens=10)
CALL = "gate"
T = TypeVar("T")


# == the app the child processes run ===============================================================


@tool
def approve(why: str, ctx: ToolContext) -> Any:
    """Pending until a human decides, then approved."""
    if ctx.decision is None:
        return ToolResult.pending(f"t-{ctx.call_id}", resume_mode="pass_decision_to_tool")
    return "approved"


def agent() -> tuple[AgentSpec, ScriptedModel]:
    spec = AgentSpec(id="gated", model="gated", tools=["approve"], max_rounds=4)
    model = ScriptedModel([Turn.tool("approve", {"why": "ship"}, id=CALL, usage=USAGE), Turn.text("shipped", usage=USAGE)],
                          loop=True, position="conversation")
    return spec, model


def app(_store: Any) -> App:
    spec, model = agent()
    return App(agents=[spec], tools=[approve], models={"gated": model})


# == processes =====================================================================================


class Topology:
    """`agentlog gateway` and `agentlog worker` processes on one NATS URL (a server or a cluster);
    `front="serve"`: `agentlog serve` processes in the gateways' place (then give `workers=0`)."""

    def __init__(self, tmp: Path, nats_url: str, *, gateways: int, workers: int, replicas: int | None = None,
                 front: str = "gateway") -> None:
        self.tmp = tmp
        self.front = front
        self.nats_url = nats_url
        self.replicas = replicas
        self.gateways: list[bench_e2e.Proc | None] = [None] * gateways
        #: Each gateway's HTTP URL; None while it is down.
        self.urls: list[str | None] = [None] * gateways
        self.workers: list[bench_e2e.Proc] = []
        self.starts = Counter[str]()
        self._workers = workers

    def _proc(self, name: str, role: str) -> bench_e2e.Proc:
        cmd = [sys.executable, "-m", "agentlog", role, "--nats", self.nats_url, "--app", APP]
        if self.replicas:
            cmd += ["--replicas", str(self.replicas)]
        if role in ("gateway", "serve"):
            cmd += ["--host", "127.0.0.1", "--port", "0", "--tokens", ""]
        else:
            cmd += ["--concurrency", "16"]
        self.starts[name] += 1
        return bench_e2e.Proc(name, cmd, self.tmp / f"{name}.log")

    def start(self) -> None:
        """Every process at once (as a service manager starts them), then wait for each."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        gateways = [self._proc(f"gateway-{i}", self.front) for i in range(len(self.gateways))]
        self.workers = [self._proc(f"worker-{i}", "worker") for i in range(self._workers)]
        for i, proc in enumerate(gateways):
            self._ready(i, proc)
        for worker in self.workers:
            worker.wait_ready()

    def start_gateway(self, i: int) -> None:
        self._ready(i, self._proc(f"gateway-{i}", "gateway"))

    def _ready(self, i: int, proc: bench_e2e.Proc) -> None:
        self.gateways[i] = proc
        found = bench_e2e.HTTP_ROW.search(proc.wait_ready())
        assert found, proc.text
        self.urls[i] = found.group(1)

    def kill_gateway(self, i: int) -> None:
        """SIGKILL: nothing drains, the lease is not given back."""
        proc, self.gateways[i], self.urls[i] = self.gateways[i], None, None
        assert proc is not None
        proc.proc.kill()
        proc.proc.wait(timeout=30)

    @property
    def pids(self) -> list[int]:
        return [*self.gateway_pids, *self.worker_pids]

    @property
    def gateway_pids(self) -> list[int]:
        """The processes serving HTTP (`agentlog gateway`, or `serve`), running now."""
        return [p.proc.pid for p in self.gateways if p is not None]

    @property
    def worker_pids(self) -> list[int]:
        return [p.proc.pid for p in self.workers]

    def stop(self) -> None:
        for proc in [*self.gateways, *self.workers]:
            if proc is not None:
                proc.stop()

    def logs(self, lines: int = 40) -> str:
        out = []
        for path in sorted(self.tmp.glob("*.log")):
            out.append(f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)


# == the client ====================================================================================


class Load:
    """Runs driven through the gateways of a `Topology`, each step on the next gateway in turn;
    a gateway that does not answer (killed, restarting) or answers 503 is skipped for the next."""

    def __init__(self, topology: Topology, *, tag: str, checks: bool, deadline: float) -> None:
        self.topology = topology
        self.tag = tag
        self.checks = checks
        self.deadline = deadline
        self._clients: dict[str, AsyncClient] = {}
        self.accepted: list[str] = []  # runs whose start a gateway accepted (or found already there)
        self.finished = 0
        self.progress = asyncio.Event()
        self.reads = 0
        self.stale_reads = 0
        #: answers skipped for the next gateway, by kind
        self.skipped = Counter[str]()
        self.follow_resumes = 0
        self.follow_repeats = 0  # an event seen twice, or out of order, across a resumed stream
        self.read_gateways = Counter[int]()

    def client(self, i: int) -> AsyncClient | None:
        url = self.topology.urls[i % len(self.topology.urls)]
        if url is None:
            return None
        if url not in self._clients:
            self._clients[url] = AsyncClient(url, timeout=30.0, max_reconnects=0)
        return self._clients[url]

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()

    async def call(self, k: int, op: Callable[[AsyncClient], Awaitable[T]], what: str) -> tuple[T, int]:
        """`op` on gateway `k`, else on the next ones; returns its answer and the gateway."""
        n = len(self.topology.urls)
        attempt = 0
        while time.monotonic() < self.deadline:
            i = (k + attempt) % n
            attempt += 1
            client = self.client(i)
            if client is None:
                if attempt % n == 0:
                    await asyncio.sleep(0.1)  # every gateway down at once: wait for one
                continue
            try:
                return await op(client), i
            except ConnectionFailed:
                self.skipped[f"{what}_connection_failed"] += 1
            except Unavailable as exc:
                self.skipped[f"{what}_{exc.code}"] += 1
                await asyncio.sleep(0.05)
        raise TimeoutError(f"{what}: no gateway answered before the deadline")

    async def drive(self, i: int) -> None:
        thread_id, run_id = f"t{i}-{self.tag}", f"r{i}-{self.tag}"
        start, _ = await self.call(i, lambda c: self._start(c, thread_id, run_id), "start")
        self.accepted.append(run_id)
        await self.read(i + 1, run_id, start)
        last = await self.follow(i + 1, run_id, None)
        decision = {"target_id": CALL, "decision_id": f"{run_id}-ok", "action": "resume",
                    "result": {"approved": True}}
        decided, _ = await self.call(i, lambda c: c.runs.decide(run_id, [decision]), "decide")
        await self.read(i + 1, run_id, decided["seq"])
        await self.follow(i, run_id, last)
        self.finished += 1
        self.progress.set()

    @staticmethod
    async def _start(client: AsyncClient, thread_id: str, run_id: str) -> int:
        try:
            return int((await client.runs.create("gated", "go", thread_id=thread_id, run_id=run_id))["seq"])
        except Conflict as exc:
            if exc.code != "run_conflict":
                raise
        # an earlier attempt landed (its gateway died before it answered): the run's first commit
        async with aclosing(client.runs.stream(run_id, follow=False)) as events:
            async for event in events:
                return event.seq
        raise ConnectionFailed(f"run {run_id} exists but its stream is empty")

    async def read(self, k: int, run_id: str, min_seq: int) -> None:
        """The run's view with `min_seq` (read-your-writes): stale if older than `min_seq`."""
        if not self.checks:
            return
        view, gateway = await self.call(k, lambda c: c.runs.get(run_id, min_seq=min_seq), "read")
        self.reads += 1
        self.read_gateways[gateway] += 1
        if view["last_seq"] < min_seq:
            self.stale_reads += 1

    async def follow(self, k: int, run_id: str, after: str | None) -> str:
        """Follow the run until it pauses (waits for a human, or finishes); a stream that breaks
        is resumed after its last event on the next gateway. Returns the last event id."""
        last = after
        n = len(self.topology.urls)
        attempt = 0
        while time.monotonic() < self.deadline:
            client = self.client(k + attempt)
            attempt += 1
            if client is None:
                if attempt % n == 0:
                    await asyncio.sleep(0.1)
                continue
            try:
                async with aclosing(client.runs.stream(run_id, after=last, follow=True)) as events:
                    async for event in events:
                        if last is not None and _position(event.id) <= _position(last):
                            self.follow_repeats += 1
                        last = event.id
                        if event.pauses:
                            return last
            except ConnectionFailed:
                self.follow_resumes += 1
            except Unavailable as exc:
                self.skipped[f"follow_{exc.code}"] += 1
                await asyncio.sleep(0.05)
        raise TimeoutError(f"run {run_id}: no pause before the deadline")

    async def follow_thread(self, k: int, thread_id: str, run_id: str, seen: list[str], connected: asyncio.Event) -> None:
        """Follow the thread from its start until `run_id` finishes, appending each event id to
        `seen`; a stream that breaks is resumed (`Last-Event-ID`) on the next gateway."""
        after: str | None = None
        while time.monotonic() < self.deadline:
            client = self.client(k)
            k += 1
            if client is None:
                continue
            try:
                async with aclosing(client.threads.stream(thread_id, after=after, follow=True)) as events:
                    async for event in events:
                        seen.append(event.id)
                        after = event.id
                        connected.set()
                        if event.type == "RunFinished" and event.run_id == run_id:
                            return
            except ConnectionFailed:
                self.follow_resumes += 1
        raise TimeoutError(f"thread {thread_id}: {run_id} did not finish before the deadline")

    async def run(self, indices: range, concurrency: int) -> None:
        gate = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with gate:
                await self.drive(i)

        await asyncio.gather(*(one(i) for i in indices))

    async def settled(self, seq: int) -> None:
        """Until every gateway's views hold `seq` (a listing with `min_seq` answers)."""
        for i in range(len(self.topology.urls)):
            while True:
                client = self.client(i)
                if client is None:
                    raise RuntimeError(f"gateway {i} is down")
                try:
                    await client.runs.list(min_seq=seq, limit=1)
                    break
                except Unavailable:
                    if time.monotonic() > self.deadline:
                        raise
                    await asyncio.sleep(0.05)

    async def writer(self) -> int | None:
        """The gateway whose runner holds the writer lease (its `/health` says so)."""
        for i in range(len(self.topology.urls)):
            client = self.client(i)
            if client is not None:
                with contextlib.suppress(ConnectionFailed, Unavailable):
                    if (await client.health())["projection"]["writer"]:
                        return i
        return None


class Changes:
    """`GET /v1/changes` on one gateway, its frames collected as they come."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.frames: list[dict[str, Any]] = []
        self.arrived = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        import aiohttp

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as http, \
                http.get(f"{self.url}/v1/changes") as resp:
            buf = b""
            async for chunk in resp.content.iter_any():
                buf += chunk
                while b"\n\n" in buf:
                    raw, buf = buf.split(b"\n\n", 1)
                    for line in raw.decode().split("\n"):
                        if line.startswith("data: "):
                            self.frames.append(json.loads(line.removeprefix("data: ")))
                            self.arrived.set()

    def told(self, run_id: str, seq: int) -> bool:
        """A frame named the run at `seq` or later, or said reload at `seq` or later."""
        return any(f["seq"] >= seq and (f["reload"] or run_id in f["runs"]) for f in self.frames[1:])

    async def until_told(self, last: dict[str, int], deadline: float) -> list[str]:
        """Wait (bounded) until every run of `last` (run id -> its last seq) was told; the runs not told."""
        while True:
            missing = [r for r, seq in last.items() if not self.told(r, seq)]
            if not missing or self._task.done() or time.monotonic() > deadline:
                return missing
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), max(0.1, deadline - time.monotonic()))

    async def aclose(self) -> None:
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task


def _position(event_id: str) -> tuple[int, int]:
    position = Position.parse(event_id)
    return position.seq, position.index


# == checks on the log and the views ===============================================================


async def log_commits(store: JetStreamEventStore) -> list[Any]:
    """Every commit of the log (followed up to its last seq)."""
    last = await store.last_seq()
    out: list[Any] = []
    if last == 0:
        return out
    async for sc in store.follow(None, 0):
        out.append(sc)
        if sc.seq >= last:
            break
    return out


async def check_log_and_views(store: JetStreamEventStore, accepted: list[str]) -> dict[str, Any]:
    """Lost and duplicated runs in the log; whether the KV views and the listings equal its fold."""
    from agentlog.projections import fold_commits
    from agentlog.projections.kv import KVViewStore

    commits = await log_commits(store)
    started = Counter(e.run_id for sc in commits for e in sc.commit.events if isinstance(e, RunStarted))
    finished = Counter(sc.commit.run_id for sc in commits for e in sc.commit.events if isinstance(e, RunFinished))
    ids = Counter(sc.commit.commit_id for sc in commits)
    expected = fold_commits(commits)
    views = await KVViewStore.open(store.nc)
    threads = {t.thread_id: t for t in await views.list_threads()}
    runs = {r.run_id: r for r in await views.list_runs()}
    listing_match = True
    for status in ("running", "waiting", "done", "failed"):
        page, total = await views.run_page({"status": status}, 200, 0)
        want = sorted(r for r, v in expected.runs.items() if v.status == status)
        listing_match &= total == len(want) and (total > 200 or sorted(v.run_id for v in page) == want)
    _, live = await views.thread_page({}, 1, 0)
    listing_match &= live == sum(1 for t in expected.threads.values() if not t.deleted)
    return {
        "commits": len(commits),
        "lost_runs": sum(1 for r in set(accepted) if finished[r] == 0),
        "duplicate_runs": sum(1 for n in started.values() if n > 1) + sum(1 for n in finished.values() if n > 1),
        "duplicate_commits": sum(n - 1 for n in ids.values() if n > 1),
        "views_match": threads == expected.threads and runs == expected.runs,
        "listing_match": listing_match,
    }


async def kv_puts(store: JetStreamEventStore) -> dict[str, int]:
    """Messages ever written to the view buckets (their streams' last seq): one per put."""
    js = store.nc.jetstream()
    out = {}
    for name in ("runs", "threads", "index"):
        out[name] = (await js.stream_info(f"KV_agentlog_{name}")).state.last_seq
    return out


# == sections ======================================================================================


async def writes(tmp: Path, runs: int, gateways: int, concurrency: int, timeout: float, *,
                 workers: int = 1, front: str = "gateway") -> dict[str, Any]:
    """`runs` runs through `gateways` gateways (`front`: `agentlog gateway`, or `serve`) and
    `workers` workers on a fresh nats-server: KV puts per commit, CPU seconds per run of the
    agentlog processes."""
    from agentlog.eventlog.embedded.server import EmbeddedNatsServer

    tmp.mkdir(parents=True, exist_ok=True)
    with EmbeddedNatsServer(tmp / "nats") as nats:
        topology = Topology(tmp, nats.url, gateways=gateways, workers=workers, front=front)
        store = await JetStreamEventStore.connect(nats.url)
        load = Load(topology, tag=f"w{gateways}", checks=False, deadline=time.monotonic() + timeout)
        try:
            await asyncio.to_thread(topology.start)
            kinds = {"gateways": topology.gateway_pids, "workers": topology.worker_pids}
            cpu0 = {kind: bench_e2e.cpu_ns(pids) for kind, pids in kinds.items()}
            t0 = time.perf_counter()
            await load.run(range(runs), concurrency)
            await load.settled(await store.last_seq())
            seconds = time.perf_counter() - t0
            by_kind = {kind: (bench_e2e.cpu_ns(pids) - cpu0[kind]) / 1e9 for kind, pids in kinds.items()}
            cpu = sum(by_kind.values())
            puts = await kv_puts(store)
            commits = await store.last_seq()
        finally:
            await load.aclose()
            await store.close()
            await asyncio.to_thread(topology.stop)
    return {"runs": runs, "commits": commits, **{f"{k}_puts": v for k, v in puts.items()},
            "puts_per_commit": sum(puts.values()) / commits, "cpu_s_per_run": cpu / runs,
            **{f"{kind}_cpu_s_per_run": used / runs for kind, used in by_kind.items()}, "seconds": seconds}


async def inprocess(tmp: Path, runs: int, concurrency: int) -> dict[str, Any]:
    """The same runs in this one process: a `Runtime` and a `ProjectionRunner` on a nats-server,
    no HTTP. CPU seconds per run of this process."""
    from agentlog.eventlog.embedded.server import EmbeddedNatsServer
    from agentlog.projections.kv import KVViewStore
    from agentlog.projections.runner import ProjectionRunner
    from agentlog.runtime import Runtime

    tmp.mkdir(parents=True, exist_ok=True)
    with EmbeddedNatsServer(tmp / "nats") as nats:
        store = await JetStreamEventStore.connect(nats.url)
        views = await KVViewStore.open(store.nc)
        runner = ProjectionRunner(store.nc, views)
        spec, model = agent()
        runtime = Runtime(store, agents=[spec], tools=[approve], models={"gated": model}, views=views)
        gate = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with gate:
                handle = await runtime.start("gated", "go", thread_id=f"t{i}-in", run_id=f"r{i}-in")
                await handle.result()
                decided = await runtime.decide(f"r{i}-in", [{"target_id": CALL, "decision_id": f"r{i}-ok",
                                                             "action": "resume", "result": {"approved": True}}])
                assert decided.handle is not None
                await decided.handle.result()

        try:
            await runner.start()
            cpu0 = time.process_time()
            await asyncio.gather(*(one(i) for i in range(runs)))
            await runner.wait_for(await store.last_seq(), timeout=60)
            cpu = time.process_time() - cpu0
        finally:
            await runtime.aclose()
            await runner.stop()
            await store.close()
    return {"runs": runs, "cpu_s_per_run": cpu / runs}


async def failover(tmp: Path, *, runs: int = 30, concurrency: int = 6, timeout: float = 240.0) -> dict[str, Any]:
    """The chaos scenario (module docstring); returns its figures."""
    from agentlog.projections.kv import KVViewStore
    from agentlog.testing.cluster import LocalCluster

    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout
    figures: dict[str, Any] = {}
    async with LocalCluster(tmp / "cluster", 3) as cluster:
        topology = Topology(tmp, cluster.url, gateways=2, workers=2, replicas=3)
        store = await JetStreamEventStore.connect(cluster.urls, replicas=3, request_timeout=5.0)
        load = Load(topology, tag="f", checks=True, deadline=deadline)
        restarted = asyncio.Event()
        streams: list[Changes] = []
        try:
            await asyncio.to_thread(topology.start)
            views = await KVViewStore.open(store.nc)
            third = max(1, runs // 3)

            async def after_restart(i: int) -> None:
                await restarted.wait()
                await load.drive(i)

            gate = asyncio.Semaphore(concurrency)

            async def one(i: int) -> None:
                async with gate:
                    await (after_restart(i) if i >= 2 * third else load.drive(i))

            driving = asyncio.get_running_loop().create_task(
                asyncio.wait_for(asyncio.gather(*(one(i) for i in range(runs))), timeout))
            while load.finished < third and not driving.done():
                load.progress.clear()
                progressed = asyncio.ensure_future(load.progress.wait())
                await asyncio.wait([driving, progressed], return_when=asyncio.FIRST_COMPLETED)
                progressed.cancel()
            if driving.done():
                driving.result()  # raises what went wrong
            killed = await load.writer()
            assert killed is not None, "no gateway says it writes the views"
            # A run that waits for its approval across the kill, its thread followed live on the
            # gateway about to die: the stream must go on from the other gateway, losing and
            # repeating nothing.
            sentinel_thread, sentinel_run = "t-sentinel", "r-sentinel"
            await load.call(killed, lambda c: load._start(c, sentinel_thread, sentinel_run), "start")
            load.accepted.append(sentinel_run)
            await load.follow(killed, sentinel_run, None)
            seen: list[str] = []
            connected = asyncio.Event()
            streaming = asyncio.get_running_loop().create_task(
                load.follow_thread(killed, sentinel_thread, sentinel_run, seen, connected))
            await asyncio.wait_for(connected.wait(), timeout)
            in_flight = len(load.accepted) - load.finished
            survivor_changes = Changes(topology.urls[1 - killed] or "")
            streams.append(survivor_changes)
            await asyncio.wait_for(survivor_changes.arrived.wait(), timeout)  # its first frame
            watch = await views.meta.watch(f"position.{views.generation}")
            killed_at = time.monotonic()
            await asyncio.to_thread(topology.kill_gateway, killed)
            probe = Commit(commit_id="probe-c", thread_id="probe", run_id=None, ts=1, events=[ThreadCreated()])
            probe_seq = (await store.append(probe, 0)).seq
            failover_s = None
            try:
                async with asyncio.timeout(max(1.0, deadline - time.monotonic())):
                    while failover_s is None:
                        entry = await watch.updates(timeout=None)
                        if entry is not None and entry.value and int(entry.value) >= probe_seq:
                            failover_s = time.monotonic() - killed_at
            finally:
                await watch.stop()
            survivor = await load.writer()
            approval = {"target_id": CALL, "decision_id": "sentinel-ok", "action": "resume",
                        "result": {"approved": True}}
            await load.call(killed + 1, lambda c: c.runs.decide(sentinel_run, [approval]), "decide")
            await asyncio.wait_for(streaming, timeout)
            load.finished += 1
            await asyncio.to_thread(topology.start_gateway, killed)
            restarted_changes = Changes(topology.urls[killed] or "")
            streams.append(restarted_changes)
            await asyncio.wait_for(restarted_changes.arrived.wait(), timeout)
            restarted.set()
            await driving
            await load.settled(await store.last_seq())
            figures.update(await check_log_and_views(store, load.accepted))
            run_last: dict[str, int] = {}
            for sc in await log_commits(store):
                if sc.commit.run_id is not None:
                    run_last[sc.commit.run_id] = sc.seq
            started_later = {f"r{i}-f": run_last[f"r{i}-f"] for i in range(2 * third, runs)}
            missed = await restarted_changes.until_told(started_later, min(deadline, time.monotonic() + 30))
            across = await survivor_changes.until_told({sentinel_run: run_last[sentinel_run]},
                                                       min(deadline, time.monotonic() + 30))
            logged = [f"{sc.seq}:{i}" async for sc in store.read_thread(sentinel_thread)
                      for i in range(len(sc.commit.events))]
            figures.update({
                "runs": runs, "accepted_runs": len(set(load.accepted)), "finished_runs": load.finished,
                "failed_runs": runs + 1 - load.finished, "in_flight_at_kill": in_flight,
                "runner_failover_s": round(failover_s, 3) if failover_s is not None else None,
                "takeover": survivor is not None and survivor != killed,
                "restarted": topology.starts[f"gateway-{killed}"] == 2,
                "reads": load.reads, "stale_reads": load.stale_reads,
                "reads_per_gateway": [load.read_gateways[i] for i in range(2)],
                "follow_resumes": load.follow_resumes, "follow_repeats": load.follow_repeats,
                # the thread followed across the kill saw exactly its events, in order
                "stream_across_kill_exact": seen == logged,
                "skipped": dict(load.skipped),
                "changes_after_kill": not across, "changes_missed": len(missed),
            })
        except BaseException as exc:
            exc.add_note(topology.logs())
            raise
        finally:
            for stream in streams:
                await stream.aclose()
            await load.aclose()
            await store.close()
            await asyncio.to_thread(topology.stop)
    figures["seconds"] = round(time.perf_counter() - t0, 2)
    return figures


# == main ==========================================================================================


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    doc: dict[str, Any] = {"bench": "scaleout", "quick": args.quick, "runs": args.runs}
    sections = args.sections.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-scaleout-") as tmp:
        base = Path(tmp)
        if "writes" in sections:
            one = await writes(base / "g1", args.runs, 1, args.writes_concurrency, args.timeout)
            two = await writes(base / "g2", args.runs, 2, args.writes_concurrency, args.timeout)
            local = await inprocess(base / "in", args.runs, args.writes_concurrency)
            serve = await writes(base / "serve", args.runs, 1, args.writes_concurrency, args.timeout,
                                 workers=0, front="serve")
            doc.update({f"gateways_1_{k}": v for k, v in one.items() if k != "runs"})
            doc.update({f"gateways_2_{k}": v for k, v in two.items() if k != "runs"})
            doc["inprocess_cpu_s_per_run"] = local["cpu_s_per_run"]
            doc["gateways_2_view_writes_per_commit"] = round(two["puts_per_commit"] / one["puts_per_commit"], 3)
            doc["split_cpu_per_run_over_inprocess"] = round(one["cpu_s_per_run"] / local["cpu_s_per_run"], 2)
            doc["gateways_2_cpu_per_run_over_inprocess"] = round(two["cpu_s_per_run"] / local["cpu_s_per_run"], 2)
            doc["serve_cpu_s_per_run"] = serve["cpu_s_per_run"]
            doc["split_cpu_per_run_over_serve"] = round(one["cpu_s_per_run"] / serve["cpu_s_per_run"], 2)
        if "failover" in sections:
            chaos = await failover(base / "failover", runs=args.runs, concurrency=args.concurrency,
                                   timeout=args.timeout)
            doc.update({f"failover_{k}": v for k, v in chaos.items()
                        if k not in ("runner_failover_s", "lost_runs", "duplicate_runs")})
            doc.update({k: chaos[k] for k in ("runner_failover_s", "lost_runs", "duplicate_runs")})
    return doc


def table(doc: dict[str, Any]) -> Any:
    from rich.table import Table

    t = Table(title=f"scale-out: {doc['runs']} approval runs per configuration{' (quick)' if doc['quick'] else ''}")
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_column("target", justify="right")
    rows = [
        ("view puts per commit, 1 gateway", "gateways_1_puts_per_commit", ""),
        ("view puts per commit, 2 gateways", "gateways_2_puts_per_commit", ""),
        ("  2 gateways / 1 gateway", "gateways_2_view_writes_per_commit", "<= 1.1"),
        ("CPU ms per run, in-process", "inprocess_cpu_s_per_run", ""),
        ("CPU ms per run, 1 gateway + 1 worker", "gateways_1_cpu_s_per_run", ""),
        ("  of which the gateway", "gateways_1_gateways_cpu_s_per_run", ""),
        ("  of which the worker", "gateways_1_workers_cpu_s_per_run", ""),
        ("CPU ms per run, 2 gateways + 1 worker", "gateways_2_cpu_s_per_run", ""),
        ("  split / in-process", "split_cpu_per_run_over_inprocess", "<= 1.5"),
        ("  2 gateways / in-process", "gateways_2_cpu_per_run_over_inprocess", ""),
        ("CPU ms per run, agentlog serve (same HTTP load)", "serve_cpu_s_per_run", ""),
        ("  split / serve", "split_cpu_per_run_over_serve", ""),
        ("failover: SIGKILL -> views written again (s)", "runner_failover_s", "<= 5"),
        ("failover: runs lost / duplicated", None, "0 / 0"),
        ("failover: reads with min_seq / stale", None, "- / 0"),
        ("failover: views and listings equal the fold", None, "yes"),
        ("failover: follows resumed on the other gateway", "failover_follow_resumes", ""),
        ("failover: /v1/changes runs missed on the restarted gateway", "failover_changes_missed", "0"),
    ]
    for label, key, target in rows:
        if key is not None:
            if key not in doc:
                continue
            value = doc[key]
            if key.endswith("cpu_s_per_run"):
                value *= 1000  # shown in ms
            text = f"{value:.3f}" if isinstance(value, float) else str(value)
        elif "lost" in label:
            if "lost_runs" not in doc:
                continue
            text = f"{doc['lost_runs']} / {doc['duplicate_runs']}"
        elif "stale" in label:
            if "failover_reads" not in doc:
                continue
            text = f"{doc['failover_reads']} / {doc['failover_stale_reads']}"
        else:
            if "failover_views_match" not in doc:
                continue
            text = "yes" if doc["failover_views_match"] and doc["failover_listing_match"] else "NO"
        t.add_row(label, text, target)
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="30 runs per configuration (default 100)")
    ap.add_argument("--runs", type=int, default=None)
    ap.add_argument("--concurrency", type=int, default=8, help="runs at once in the failover section")
    ap.add_argument("--writes-concurrency", type=int, default=1,
                    help="runs at once in the writes section (1: how a view's puts coalesce in a batch "
                         "depends on what else came in it, and so on the timing, the same in both configurations)")
    ap.add_argument("--timeout", type=float, default=300.0, help="bound of each section (s)")
    ap.add_argument("--sections", default="writes,failover")
    args = ap.parse_args()
    args.runs = args.runs or (30 if args.quick else 100)
    from agentlog.cli.logging import configure as configure_logging

    configure_logging("error")
    doc = asyncio.run(measure(args))
    from rich.console import Console

    Console().print(table(doc))
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
