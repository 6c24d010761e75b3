"""Determinism groundwork for verified replay: the same scripted scenario on fresh JetStream
stores writes the same log -- equal after normalising ids and timestamps with the system entropy,
and byte-for-byte equal (commit ids, ts, seqs) with the deterministic one."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentlog.eventlog.codec import encode_commit
from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.runtime import AgentSpec, DeterministicEntropy, PermissionPlugin, Runtime, ToolContext, tool
from agentlog.runtime.loop.entropy import Entropy, SystemEntropy
from agentlog.runtime.models import ScriptedModel, Turn

pytestmark = pytest.mark.asyncio


@tool
def add(a: int, b: int, ctx: ToolContext) -> int:
    """Add and remember."""
    ctx.set(f"/sum_{a}_{b}", a + b)
    return a + b


@tool
def secret(path: str) -> str:
    """Never allowed on /etc."""
    return path


async def scenario(server: EmbeddedNatsServer, entropy: Entropy) -> list[bytes]:
    store = await JetStreamEventStore.connect(server.url)
    try:
        model = ScriptedModel([
            Turn.tools(("add", {"a": 1, "b": 2}), ("secret", {"path": "/etc/passwd"}), text="let me see"),
            Turn.tools(("add", {"a": 3, "b": 4}), ("nope", {})),
            "all done",
            "nothing more",
        ])
        agent = AgentSpec(
            id="agent", model=model, tools=["add", "secret"], tool_execution_mode="sequential",
            plugins=[PermissionPlugin(deny=[{"tool": "secret", "args": {"path": "/etc/*"}}])],
            system_prompt="Be exact.", max_rounds=10,
        )
        rt = Runtime(store, agents=[agent], tools=[add, secret], entropy=entropy)
        async with asyncio.timeout(10):
            first = await rt.run("agent", "compute")
            await rt.run("agent", "and now?", parent_run_id=first.run_id)
        return [
            encode_commit(sc.commit) + b"@" + str(sc.seq).encode()
            async for sc in store.read_thread(first.thread_id)
        ]
    finally:
        await store.close()


_HEX_ID = re.compile(r"[0-9a-f]{32}")


def normalise(log: list[bytes]) -> list[Any]:
    """Ids -> their order of first appearance; ts/duration -> 0."""
    names: dict[str, str] = {}
    text = "\n".join(x.decode() for x in log)
    text = _HEX_ID.sub(lambda m: names.setdefault(m.group(0), f"ID{len(names)}"), text)
    out = []
    for line in text.split("\n"):
        raw, _, seq = line.rpartition("@")
        doc = msgspec.json.decode(raw)
        doc["ts"] = 0
        for ev in doc["events"]:
            if ev["type"] == "InferenceCompleted":  # 0 ms is omitted on the wire, so set it always
                ev["duration_ms"] = 0
                # per-part request digests cover ids too (the conversation's): named like ids
                parts = ev.get("request_digests") or {}
                ev["request_digests"] = {k: names.setdefault(v, f"ID{len(names)}") for k, v in parts.items()}
        out.append((doc, seq))
    return out


async def two_runs(tmp_path: Path, make_entropy: Any) -> tuple[list[bytes], list[bytes]]:
    logs = []
    for name in ("a", "b"):
        server = EmbeddedNatsServer(tmp_path / name)
        server.start()
        try:
            logs.append(await scenario(server, make_entropy()))
        finally:
            server.stop()
    return logs[0], logs[1]


async def test_system_entropy_logs_equal_after_normalising_ids_and_timestamps(tmp_path: Path) -> None:
    a, b = await two_runs(tmp_path, SystemEntropy)
    assert a != b  # real ids and clocks differ...
    assert normalise(a) == normalise(b)  # ...and that is the only difference
    assert len(a) == 8  # two runs: 6 commits + 2


async def test_deterministic_entropy_logs_are_identical(tmp_path: Path) -> None:
    a, b = await two_runs(tmp_path, DeterministicEntropy)
    assert a == b
