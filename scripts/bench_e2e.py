#!/usr/bin/env python
"""One approval end to end, through the processes users run: `agentlog serve`, and
`agentlog gateway` + `agentlog worker` ("split"), each on a nats-server this script owns.

    python scripts/bench_e2e.py [--quick] [--long 222] [--short-runs N] [--long-samples N]

One approval cycle, timed from the client: `POST /v1/runs/{id}/inputs` (approve the waiting call)
-> the tool runs -> one model turn -> the next call waits -> `GET /v1/runs/{id}/events?follow=true`
with `Last-Event-ID` (the id of the last event the client saw: the previous `RunSuspended`) ends.
The follow is opened right after the 202, as a browser would.

- short: p50 of the 3rd decision of fresh runs (2 approval cycles of history);
- long:  p50 of the decisions of one run past `--long` cycles (222: ~890 commits, ~450 messages);
         once the long run is built, short and long samples alternate, so both are measured over
         the same minutes (a host that slows down midway weighs on both, not on one);
- cpu:   the agentlog processes' CPU per sampled cycle (mean; Linux schedstat of every thread):
         on a loaded machine wall time grows with the load, CPU time with the work;
- follow hangs: every follow of every cycle (the ones that build the long run included) is bounded
  by `--follow-timeout`; one that times out is a hang (counted, then the run is followed again
  from the same `Last-Event-ID` so the loop goes on). At least 500 follows in `--quick`.
  `follow_hangs_paused`: of those, the ones whose pause was already in the log (read without
  follow) when the follow timed out: the follower missed it, the run was not slow.

The app (`app` below, loaded by the child processes with `--app bench_e2e:app`) asks for approval
after every answer: a tool that is pending until decided, and a scripted model that calls it again.

`host_reference_ms`: the CPU ms of a fixed loop of pure Python, run between samples (p50): the
host's speed over the same minutes, to compare the ms figures of runs on different days by.

Prints a table and, as the very last line, `{"bench": "e2e", "serve_long_over_short": ..., ...}`.
Targets: `*_long_over_short` <= 1.5, `serve_long_p50_ms` <= 15, `follow_hangs` == 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "src"))  # agentlog from this checkout, installed or not

from agentlog.eventlog.events import Usage  # noqa: E402
from agentlog.runtime import (  # noqa: E402
    AgentSpec,
    App,
    ToolContext,
    ToolResult,
    tool,
)
from agentlog.runtime.models import ScriptedModel, Turn  # noqa: E402

TOPOLOGIES = ("serve", "split")
SHORT = 2
#: Given, so the scripted model does not count the words of the conversation on every turn.
USAGE = Usage(input_tokens=100, output_tokens=10)
HTTP_ROW = re.compile(r"HTTP\s+│\s+(http://127\.0\.0\.1:\d+)")


# == the app the child processes run ===============================================================


@tool
def approve(why: str, ctx: ToolContext) -> Any:
    """Pending until a human decides, then approved."""
    if ctx.decision is None:
        return ToolResult.pending(f"t-{ctx.call_id}", resume_mode="pass_decision_to_tool")
    return "approved"


def ask_again(req: Any) -> Turn:
    """Ask for approval after every answer (call ids from the conversation: any process numbers alike)."""
    asked = sum(1 for m in req.messages if m.role == "assistant")
    return Turn.tool("approve", {"why": f"cycle {asked}"}, id=f"ask{asked}", text=f"asking approval #{asked}",
                     usage=USAGE)


def app(_store: Any) -> App:
    agent = AgentSpec(id="cycler", model="cycler", tools=["approve"], tool_execution_mode="sequential",
                      max_rounds=100_000)
    return App(agents=[agent], tools=[approve], models={"cycler": ScriptedModel([ask_again], loop=True)})


# == processes =====================================================================================


class Proc:
    """One child: stdout copied to its log file by a thread (a full pipe would stall it), ready
    once its banner printed the HTTP / NATS rows."""

    def __init__(self, name: str, cmd: list[str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        log = open(log_path, "ab")  # the copying thread closes it
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SCRIPTS), str(ROOT / "src")])}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                     cwd=str(ROOT), env=env)
        self.ready = threading.Event()
        self.text = ""
        assert self.proc.stdout is not None
        threading.Thread(target=self._copy, args=(self.proc.stdout, log), daemon=True).start()

    def _copy(self, stdout: IO[bytes], log: IO[bytes]) -> None:
        with log:
            for raw in iter(stdout.readline, b""):
                log.write(raw)
                log.flush()
                if not self.ready.is_set():
                    self.text += raw.decode(errors="replace")
                    if "parts" in self.text and "NATS" in self.text:
                        self.ready.set()
        self.ready.set()

    def wait_ready(self, timeout: float = 90.0) -> str:
        if not self.ready.wait(timeout) or "parts" not in self.text:
            raise RuntimeError(f"{self.name} did not start (exit {self.proc.poll()}):\n"
                               f"{self.log_path.read_text(errors='replace')[-3000:]}")
        return self.text

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def cpu_ns(pids: list[int]) -> int:
    """CPU time (ns) the processes' threads have run so far (Linux `schedstat`; 0 elsewhere):
    unlike wall time, it does not grow when other work on the machine takes the cores."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
    return total


@contextlib.contextmanager
def deployment(kind: str, tmp: Path) -> Iterator[tuple[str, list[int]]]:
    """`serve`, or `gateway` + one `worker`, on a fresh nats-server; yields the HTTP URL and the
    agentlog processes' pids."""
    from agentlog.eventlog.embedded.server import EmbeddedNatsServer

    nats = EmbeddedNatsServer(tmp / "nats")
    nats.start()
    procs: list[Proc] = []
    try:
        roles = ["serve"] if kind == "serve" else ["worker", "gateway"]
        url = ""
        for role in roles:
            cmd = [sys.executable, "-m", "agentlog", role, "--nats", nats.url, "--app", "bench_e2e:app"]
            if role != "worker":
                cmd += ["--host", "127.0.0.1", "--port", "0", "--tokens", ""]
            proc = Proc(role, cmd, tmp / f"{role}.log")
            procs.append(proc)
            banner = proc.wait_ready()
            if role != "worker":
                found = HTTP_ROW.search(banner)
                assert found, banner
                url = found.group(1)
        yield url, [p.proc.pid for p in procs]
    finally:
        for proc in reversed(procs):
            proc.stop()
        nats.stop()


# == the client ====================================================================================


class Follow:
    """What one follow of the run's stream saw."""

    def __init__(self) -> None:
        self.last_id: str | None = None
        self.waiting_call: str | None = None
        self.paused = False
        self.events = 0


async def follow(session: Any, url: str, run_id: str, last_id: str | None, timeout: float) -> Follow | None:
    """Follow the run from `last_id` until the stream ends; None if it did not end in `timeout`."""
    seen = Follow()
    headers = {"Last-Event-ID": last_id} if last_id else {}
    try:
        async with asyncio.timeout(timeout):
            async with session.get(f"{url}/v1/runs/{run_id}/events", params={"follow": "true"},
                                   headers=headers) as resp:
                assert resp.status == 200, (resp.status, await resp.text())
                event_id = kind = None
                async for raw in resp.content:
                    line = raw.decode().rstrip("\n")
                    if line.startswith("id: "):
                        event_id = line[4:]
                    elif line.startswith("event: "):
                        kind = line[7:]
                    elif line.startswith("data: ") and kind is not None:
                        seen.events += 1
                        seen.last_id = event_id
                        if kind == "ToolCallSuspended":
                            seen.waiting_call = json.loads(line[6:])["event"]["call_id"]
                        elif kind in ("RunSuspended", "RunFinished"):
                            seen.paused = True
                        event_id = kind = None
    except TimeoutError:
        return None
    return seen


class Driver:
    """One run driven through approval cycles over HTTP."""

    def __init__(self, session: Any, url: str, timeout: float, pids: list[int] | None = None) -> None:
        self.pids = pids or []
        self.cpu_ms: list[float] = []  # the agentlog processes' CPU in each cycle
        self.session = session
        self.url = url
        self.timeout = timeout
        self.run_id = ""
        self.last_id: str | None = None
        self.call: str | None = None
        self.cycles = 0
        self.follows = 0
        self.hangs = 0
        self.hangs_paused = 0  # of the hangs: the pause was in the log when the follow timed out

    async def _follow_to_pause(self) -> None:
        """Follow from the last event seen; a follow that does not end in time is a hang (counted),
        then the run is followed again from the same position until the pause is seen."""
        for _ in range(20):
            self.follows += 1
            seen = await follow(self.session, self.url, self.run_id, self.last_id, self.timeout)
            if seen is None:
                self.hangs += 1
                self.hangs_paused += await self._paused_in_log()
                print(f"follow hang: run {self.run_id} from {self.last_id}", file=sys.stderr, flush=True)
                continue
            if seen.last_id is not None:
                self.last_id = seen.last_id
            if seen.waiting_call is not None:
                self.call = seen.waiting_call
            if seen.paused:
                return
        raise RuntimeError(f"run {self.run_id}: no pause after 20 follows")

    async def _paused_in_log(self) -> bool:
        """Is a pause after the last event seen in the log (a read without follow)?"""
        headers = {"Last-Event-ID": self.last_id} if self.last_id else {}
        async with self.session.get(f"{self.url}/v1/runs/{self.run_id}/events", headers=headers) as resp:
            text = await resp.text()
        return any(line in ("event: RunSuspended", "event: RunFinished") for line in text.splitlines())

    async def start(self) -> None:
        async with self.session.post(f"{self.url}/v1/runs", json={"agent_id": "cycler", "messages": "go"}) as resp:
            assert resp.status == 202, (resp.status, await resp.text())
            self.run_id = (await resp.json())["run_id"]
        await self._follow_to_pause()

    async def cycle(self) -> float:
        """One approval; returns its ms (POST to the end of the follow)."""
        assert self.call is not None
        body = {"decisions": [{"target_id": self.call, "decision_id": f"d{self.cycles}", "action": "resume",
                               "result": {"ok": True}}]}
        self.call = None
        c0 = cpu_ns(self.pids)
        t0 = time.perf_counter()
        async with self.session.post(f"{self.url}/v1/runs/{self.run_id}/inputs", json=body) as resp:
            assert resp.status == 202, (resp.status, await resp.text())
            await resp.read()
        await self._follow_to_pause()
        ms = 1000 * (time.perf_counter() - t0)
        self.cpu_ms.append((cpu_ns(self.pids) - c0) / 1e6)
        self.cycles += 1
        assert self.call is not None, "the run did not ask again"
        return ms


def host_reference_ms() -> float:
    """CPU ms of a fixed piece of pure Python in this process: how fast the host runs code at
    that moment. Shared 2-core hosts drift by a third and more within minutes (the same loop
    took 216 and 394 ms), and the ms figures above drift with them; this tells a slow host
    from slow code when runs of different days are compared."""
    start = time.process_time()
    total = 0
    for i in range(100_000):
        total += i % 7
    return 1000 * (time.process_time() - start)


def p50(values: list[float]) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[(len(values) - 1) // 2]


async def measure(url: str, pids: list[int], args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        long_run = Driver(session, url, args.follow_timeout, pids)
        drivers: list[Driver] = [long_run]
        await long_run.start()
        for _ in range(args.long):
            await long_run.cycle()
        # The samples alternate (a fresh run's 3rd decision, then the long run's next one), so
        # the host's drift over the bench (frequency, other tenants) weighs on both alike: the
        # ratio is the run's length, not the minute it was measured in.
        short: list[float] = []
        short_cpu: list[float] = []
        long: list[float] = []
        long_cpu: list[float] = []
        reference: list[float] = []
        for i in range(max(args.short_runs, args.long_samples)):
            if i < args.short_runs:
                d = Driver(session, url, args.follow_timeout, pids)
                drivers.append(d)
                await d.start()
                for _ in range(SHORT):
                    await d.cycle()
                short.append(await d.cycle())  # the decision with 2 cycles of history
                short_cpu.append(d.cpu_ms[-1])
            if i < args.long_samples:
                long.append(await long_run.cycle())
                long_cpu.append(long_run.cpu_ms[-1])
            reference.append(host_reference_ms())  # between samples: it slows none of them
        cpu_short, cpu_long = sum(short_cpu) / len(short_cpu), sum(long_cpu) / len(long_cpu)
        return {"short_p50_ms": round(p50(short), 2), "long_p50_ms": round(p50(long), 2),
                "long_over_short": round(p50(long) / p50(short), 2),
                "cpu_short_ms": round(cpu_short, 2), "cpu_long_ms": round(cpu_long, 2),
                "cpu_long_over_short": round(cpu_long / cpu_short, 2) if cpu_short else float("nan"),
                "follows": sum(x.follows for x in drivers), "follow_hangs": sum(x.hangs for x in drivers),
                "follow_hangs_paused": sum(x.hangs_paused for x in drivers),
                "cycles": sum(x.cycles for x in drivers), "long_cycles_end": long_run.cycles,
                "host_reference_ms": round(p50(reference), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples (>= 500 follows in all)")
    ap.add_argument("--long", type=int, default=222, help="approval cycles of the long run before its samples")
    ap.add_argument("--short-runs", type=int, default=None, help="fresh runs sampled at 2 cycles (per topology)")
    ap.add_argument("--long-samples", type=int, default=None, help="decisions sampled past --long (per topology)")
    ap.add_argument("--follow-timeout", type=float, default=10.0, help="a follow that takes longer is a hang")
    ap.add_argument("--topologies", default=",".join(TOPOLOGIES))
    args = ap.parse_args()
    args.short_runs = args.short_runs if args.short_runs is not None else (20 if args.quick else 60)
    args.long_samples = args.long_samples if args.long_samples is not None else (20 if args.quick else 60)
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    from rich.console import Console
    from rich.table import Table

    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp:
        for kind in args.topologies.split(","):
            with deployment(kind, Path(tmp) / kind) as (url, pids):
                results[kind] = asyncio.run(measure(url, pids, args))

    table = Table(title="one approval end to end over HTTP (POST inputs -> tool -> model -> next ask -> follow ends)")
    for col in ("topology", "short p50 ms", f"long p50 ms (>{args.long} cycles)", "long/short",
                "cpu short / long ms", "cpu long/short", "follows", "hangs", "host ref ms"):
        table.add_column(col, justify="right")
    for kind, r in results.items():
        table.add_row(kind, f"{r['short_p50_ms']:.2f}", f"{r['long_p50_ms']:.2f}", f"{r['long_over_short']:.2f}",
                      f"{r['cpu_short_ms']:.1f} / {r['cpu_long_ms']:.1f}", f"{r['cpu_long_over_short']:.2f}",
                      str(r["follows"]), str(r["follow_hangs"]), f"{r['host_reference_ms']:.2f}")
    Console().print(table)
    doc: dict[str, Any] = {"bench": "e2e", "quick": args.quick, "short_cycles": SHORT, "long_cycles": args.long}
    for kind, r in results.items():
        doc.update({f"{kind}_{key}": value for key, value in r.items()})
    doc["follows"] = sum(r["follows"] for r in results.values())
    doc["follow_hangs"] = sum(r["follow_hangs"] for r in results.values())
    #: of the hangs, those whose pause was in the log when the follow timed out (the follower
    #: missed it, rather than the run being slow)
    doc["follow_hangs_paused"] = sum(r["follow_hangs_paused"] for r in results.values())
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
