"""Gateway speed: `GET /v1/runs/{id}` against a bare aiohttp JSON handler, and SSE fan-out lag.

    python scripts/bench_gateway.py [--quick] [--clients N] [--seconds S] [--followers N]

1. Reads. One `agentlog.cli.assembly` (embedded NATS, views, runtime, HTTP) and, in the same process, a
   bare aiohttp app whose one handler returns the same JSON bytes. The same aiohttp client
   (keep-alive, `--clients` concurrent tasks looping for `--seconds`) loads each in turn; we report
   requests/s, p50 and p99, and the ratio gateway/bare (target >= 0.5). Both servers share the
   process (and the 2 cores) with the client, so the ratio is like for like.
2. Fan-out. `--followers` SSE clients follow one run (`GET /v1/runs/{id}/events?follow=true`). The
   run is held in its first tool until every follower has its stream open, then makes many
   commits; for each event a follower receives live, lag = receive wall time - the commit's `ts`
   (stamped when the commit is built, just before the append; same machine clock). p50/p99/max
   over all (follower, event) pairs, and whether every follower got every event in order.

Prints a rich table and, as the very last line, `{"bench": "gateway", ...}`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # agentlog from this checkout, installed or not

import aiohttp  # noqa: E402
import structlog  # noqa: E402
from aiohttp import web  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from agentlog.cli.assembly import ServerConfig, serve  # noqa: E402
from agentlog.gateway.operations.connection import ConnectionOptions  # noqa: E402
from agentlog.runtime import (  # noqa: E402
    AgentSpec,
    App,
    ToolContext,
    tool,
)
from agentlog.runtime.models.scripted import ScriptedModel, Turn  # noqa: E402

_gates: dict[str, asyncio.Event] = {}
_STEPS = {"n": 20}


@tool
async def hold(ctx: ToolContext) -> str:
    """Keep the run live until every follower is connected."""
    _gates["entered"].set()
    await _gates["open"].wait()
    return "released"


@tool
async def work(k: int, ctx: ToolContext) -> str:
    """A small unit of work with a state patch."""
    ctx.set(f"/w{k}", k)
    return f"worked {k}"


def bench_app(_store: Any) -> App:
    script: list[Any] = [Turn.tool("hold", {})]
    script += [Turn.tools(("work", {"k": 2 * i}), ("work", {"k": 2 * i + 1})) for i in range(_STEPS["n"])]
    script.append(Turn.text("done"))
    agents = [AgentSpec(id="fan", model="fan", tools=["hold", "work"], max_rounds=_STEPS["n"] + 5),
              AgentSpec(id="one", model="one", tools=["work"], max_rounds=3)]
    models = {"fan": ScriptedModel(script, position="conversation"),
              "one": ScriptedModel([Turn.tool("work", {"k": 1}), Turn.text("ok")], loop=True,
                                   position="conversation")}
    return App(agents=agents, tools=[hold, work], models=models)


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


async def load(url: str, clients: int, seconds: float) -> dict[str, float]:
    """`clients` tasks GET `url` back to back on one keep-alive session for `seconds`."""
    latencies: list[float] = []
    errors = [0]
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        for _ in range(clients):  # warm the connections
            async with http.get(url) as r:
                await r.read()
        deadline = time.perf_counter() + seconds

        async def client() -> None:
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                async with http.get(url) as r:
                    await r.read()
                    if r.status != 200:
                        errors[0] += 1
                latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.perf_counter() - t0
    return {"rps": len(latencies) / elapsed, "p50_ms": pct(latencies, 50) * 1000,
            "p99_ms": pct(latencies, 99) * 1000, "requests": len(latencies), "errors": errors[0]}


async def bare_server(body: bytes) -> tuple[web.AppRunner, str]:
    async def handler(_request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/bare", handler)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # noqa: SLF001
    return runner, f"http://127.0.0.1:{port}/bare"


async def follow(http: aiohttp.ClientSession, url: str, opened: list[int], all_open: asyncio.Event,
                 total: int) -> list[tuple[str, float]]:
    """Read one SSE stream to its end: (event id, receive wall ms) per event."""
    got: list[tuple[str, float]] = []
    async with http.get(url, headers={"Accept": "text/event-stream"}) as resp:
        buf = b""
        async for chunk in resp.content.iter_any():
            now = time.time() * 1000
            buf += chunk
            while b"\n\n" in buf:
                block, buf = buf.split(b"\n\n", 1)
                if block.startswith(b"id: "):
                    got.append((block[4:block.index(b"\n")].decode(), now))
                    if len(got) == 1:
                        opened[0] += 1
                        if opened[0] == total:
                            all_open.set()
    return got


async def fanout(server: Any, followers: int) -> dict[str, Any]:
    _gates.update(entered=asyncio.Event(), open=asyncio.Event())
    accepted = await server.dispatcher.start_run("fan", "go")
    await _gates["entered"].wait()
    store = server.store
    gate_seq = await store.last_seq()
    url = f"{server.http_url}/v1/runs/{accepted.run_id}/events?follow=true"
    opened, all_open = [0], asyncio.Event()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        tasks = [asyncio.create_task(follow(http, url, opened, all_open, followers)) for _ in range(followers)]
        await all_open.wait()
        _gates["open"].set()
        received = await asyncio.gather(*tasks)
    commits = [c async for c in store.read_run(accepted.run_id)]
    ts = {str(p): c.commit.ts for c in commits for p, _e in c.positioned()}
    expected = [str(p) for c in commits for p, _e in c.positioned()]
    lags = [recv - ts[ident] for got in received for ident, recv in got if int(ident.split(":")[0]) > gate_seq]
    complete = all([ident for ident, _ in got] == expected for got in received)
    live_events = sum(1 for ident in expected if int(ident.split(":")[0]) > gate_seq)
    return {"followers": followers, "events": len(expected), "live_events": live_events,
            "deliveries": len(lags), "lag_p50_ms": pct(lags, 50), "lag_p99_ms": pct(lags, 99),
            "lag_max_ms": max(lags) if lags else float("nan"), "complete_in_order": complete}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    _STEPS["n"] = args.steps
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        config = ServerConfig(port=0, tokens="", app=bench_app, connection=ConnectionOptions(data_dir=Path(tmp)))
        async with serve(config) as server:
            accepted = await server.dispatcher.start_run("one", "hi")
            handle_seq = accepted.seq
            async with aiohttp.ClientSession() as http:  # the run view, once it is in the views
                url = f"{server.http_url}/v1/runs/{accepted.run_id}"
                async with http.get(url, params={"min_seq": str(handle_seq)}) as r:
                    body = await r.read()
            runner, bare_url = await bare_server(body)
            try:
                results = {}
                for name, target in (("bare", bare_url), ("gateway", url), ("bare2", bare_url), ("gateway2", url)):
                    results[name] = await load(target, args.clients, args.seconds / 2)
            finally:
                await runner.cleanup()
            fan = await fanout(server, args.followers)

    def merged(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
        n = a["requests"] + b["requests"]
        return {"rps": (a["rps"] + b["rps"]) / 2, "p50_ms": (a["p50_ms"] + b["p50_ms"]) / 2,
                "p99_ms": max(a["p99_ms"], b["p99_ms"]), "requests": n, "errors": a["errors"] + b["errors"]}

    bare = merged(results["bare"], results["bare2"])
    gw = merged(results["gateway"], results["gateway2"])
    return {"bare": bare, "gateway": gw, "ratio": gw["rps"] / bare["rps"], "fanout": fan,
            "clients": args.clients, "seconds": args.seconds, "body_bytes": len(body)}


def report(r: dict[str, Any], quick: bool) -> None:
    out = Console(width=120)
    t = Table(title=f"gateway bench{' (quick)' if quick else ''}: {r['clients']} keep-alive clients, "
                    f"{r['seconds']:.0f}s per target, {r['body_bytes']} B body", title_justify="left")
    for col in ("target", "req/s", "p50 ms", "p99 ms", "requests", "errors"):
        t.add_column(col, justify="right" if col != "target" else "left")
    for name, label in (("bare", "bare aiohttp JSON handler"), ("gateway", "GET /v1/runs/{id}")):
        x = r[name]
        t.add_row(label, f"{x['rps']:.0f}", f"{x['p50_ms']:.2f}", f"{x['p99_ms']:.2f}", str(x["requests"]),
                  str(x["errors"]))
    t.add_row("ratio gateway/bare", f"{r['ratio']:.2f}", "", "", "", "target >= 0.5")
    out.print(t)
    f = r["fanout"]
    t2 = Table(title=f"SSE fan-out: {f['followers']} followers of one run "
                     f"({f['events']} events, {f['live_events']} live)", title_justify="left")
    for col in ("deliveries", "lag p50 ms", "lag p99 ms", "lag max ms", "all got every event in order"):
        t2.add_column(col, justify="right")
    t2.add_row(str(f["deliveries"]), f"{f['lag_p50_ms']:.1f}", f"{f['lag_p99_ms']:.1f}", f"{f['lag_max_ms']:.1f}",
               str(f["complete_in_order"]))
    out.print(t2)


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a smaller run (< 60 s)")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=float, default=None, help="load seconds per target (split in 2 rounds)")
    p.add_argument("--followers", type=int, default=200)
    p.add_argument("--steps", type=int, default=None, help="steps of the followed run")
    args = p.parse_args()
    args.seconds = args.seconds or (4.0 if args.quick else 20.0)
    args.steps = args.steps or (8 if args.quick else 25)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    r = asyncio.run(main(args))
    report(r, args.quick)
    doc = {"bench": "gateway", "quick": args.quick, "clients": r["clients"], "seconds_per_target": r["seconds"],
           "gateway_rps": round(r["gateway"]["rps"], 1), "gateway_p50_ms": round(r["gateway"]["p50_ms"], 3),
           "gateway_p99_ms": round(r["gateway"]["p99_ms"], 3), "bare_rps": round(r["bare"]["rps"], 1),
           "bare_p50_ms": round(r["bare"]["p50_ms"], 3), "bare_p99_ms": round(r["bare"]["p99_ms"], 3),
           "get_run_ratio": round(r["ratio"], 3), "errors": r["gateway"]["errors"] + r["bare"]["errors"],
           "sse_followers": r["fanout"]["followers"], "sse_events": r["fanout"]["events"],
           "sse_live_events": r["fanout"]["live_events"], "sse_deliveries": r["fanout"]["deliveries"],
           "sse_lag_p50_ms": round(r["fanout"]["lag_p50_ms"], 2), "sse_lag_p99_ms": round(r["fanout"]["lag_p99_ms"], 2),
           "sse_lag_max_ms": round(r["fanout"]["lag_max_ms"], 2),
           "sse_complete_in_order": r["fanout"]["complete_in_order"]}
    print(json.dumps(doc))


if __name__ == "__main__":
    cli()
