#!/usr/bin/env python
"""Benchmark the request JSON decoder (`agentlog.gateway.operations.json_input.parse_json`: msgspec + the depth
walk, refusing lone surrogates and deep nesting) against the baseline it replaced, `json.loads`,
on the same bodies in the same run: a run start, a decision, an AG-UI request with 20 messages
and a 256 KB message. Prints a rich table, then ONE JSON line with every figure (the last line).

    .venv/bin/python scripts/bench_input.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # agentlog from this checkout

from rich.console import Console
from rich.table import Table

from agentlog.gateway.operations.json_input import parse_json


def bodies() -> dict[str, bytes]:
    agui = {"threadId": "t1", "runId": "r1", "tools": [], "context": [], "state": {"plan": {"steps": [1, 2, 3]}},
            "forwardedProps": {}, "messages": [{"id": f"m{i}", "role": "user" if i % 2 else "assistant",
                                                "content": f"message number {i} with some words in it"}
                                               for i in range(20)]}
    return {
        "start (small)": json.dumps({"agent_id": "deployer", "messages": "Ship release 1.4.2 to staging."}).encode(),
        "decision": json.dumps({"decisions": [{"target_id": "call_1", "decision_id": "ok-1", "action": "resume",
                                               "result": {"approved": True, "note": "fine"}}]}).encode(),
        "ag-ui, 20 messages": json.dumps(agui).encode(),
        "256 KB message": json.dumps({"agent_id": "a", "messages": "x" * 256 * 1024}).encode(),
    }


def best_rates(fns: list[Callable[[bytes], Any]], body: bytes, seconds: float, rounds: int = 10) -> list[float]:
    """Each fn's best calls/s over `rounds` alternating slices of `seconds / rounds` (the
    machine is shared: alternating slices expose both to the same load, best-of filters it)."""
    best = [0.0] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            best[i] = max(best[i], rate(fn, body, seconds / rounds))
    return best


def rate(fn: Callable[[bytes], Any], body: bytes, seconds: float) -> float:
    """Calls per second of fn(body) over about `seconds`."""
    n, start = 0, time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(50):
            fn(body)
        n += 50
        now = time.perf_counter()
        if now >= deadline:
            return n / (now - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="0.3 s per measurement instead of 2 s")
    args = p.parse_args()
    seconds = 0.3 if args.quick else 2.0
    table = Table(title=f"request JSON decoding ({seconds:g} s per cell, best of 10 alternating slices)")
    for col in ("body", "bytes", "json.loads /s", "parse_json /s", "ratio parse/loads"):
        table.add_column(col, justify="right" if col != "body" else "left")
    figures: dict[str, Any] = {"bench": "input", "quick": args.quick}
    for name, body in bodies().items():
        base, ours = best_rates([json.loads, parse_json], body, seconds)
        key = name.split(" ")[0].replace(",", "").replace("-", "").lower()
        figures.update({f"{key}_bytes": len(body), f"{key}_loads_per_s": round(base),
                        f"{key}_parse_per_s": round(ours), f"{key}_ratio": round(ours / base, 3)})
        table.add_row(name, str(len(body)), f"{base:,.0f}", f"{ours:,.0f}", f"{ours / base:.2f}")
    Console().print(table)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
