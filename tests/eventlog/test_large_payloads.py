"""Large tool outputs by reference in the JetStream Object Store (real nats-server with a small
max payload), plus property tests of the pure offload/resolve pair."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentlog.eventlog import CommitTooLarge, EmbeddedNatsServer
from agentlog.eventlog.codec import decode_commit, encode_commit
from agentlog.eventlog.events import Commit, Message, MessageAppended, PayloadRef, ToolCallCompleted
from agentlog.eventlog.jetstream.payloads import PayloadMissing, has_refs, offload, resolve
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.runtime import AgentSpec, App, DeterministicEntropy, Runtime, tool
from agentlog.runtime.models import ScriptedModel, Turn
from agentlog.runtime.replay.verify import verify_run

from tests.support.runtime import events_of, logged, store  # noqa: F401  (fixture, on the server above)

LIMIT = 64 * 1024
BIG = 100 * 1024


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNatsServer]:
    """conftest's server with a small max payload (the `store` fixture connects to it)."""
    server = EmbeddedNatsServer(tmp_path / "nats", max_payload=LIMIT)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@tool
def dump(n: int) -> dict[str, Any]:
    """A tool with a large output."""
    return {"rows": ["r" * 99 for _ in range(n)]}


@pytest.mark.asyncio
async def test_oversized_tool_result_is_stored_by_reference(store: JetStreamEventStore) -> None:
    spec = AgentSpec(id="agent", model=ScriptedModel([Turn.tool("dump", {"n": BIG // 100}), "done"],
                                                     position="conversation"), tools=["dump"])
    rt = Runtime(store, agents=[spec], tools=[dump], entropy=DeterministicEntropy())
    async with asyncio.timeout(30):
        result = await rt.run("agent", "go")
        log = await logged(rt, result)
    assert result.termination.type == "natural_end"
    # reads resolve the reference: the full value, in the event and in the tool message
    [done] = events_of(log, "ToolCallCompleted")
    assert done.result_ref is None and len(done.result["rows"]) == BIG // 100
    [tool_msg] = [e.message for e in events_of(log, "MessageAppended") if e.message.role == "tool"]
    assert msgspec.json.decode(tool_msg.content) == done.result
    # the log itself holds references: every message fits the server's max payload
    js = store.nc.jetstream()
    raws = [await js.get_msg(store.stream, sc.seq, direct=True) for sc in log]
    assert all(len(r.data) <= LIMIT for r in raws)
    stored = [decode_commit(r.data) for r in raws if has_refs(r.data)]
    assert len(stored) == 1
    [raw_done] = [e for e in stored[0].events if type(e) is ToolCallCompleted]
    assert raw_done.result is None and raw_done.result_ref.size > LIMIT
    # the run view keeps the reference (a KV value has the same limit); replay sees the value
    assert result.run.calls[done.call_id].status == "succeeded"
    async with asyncio.timeout(30):
        report = await verify_run(store, result.run_id, App(agents=[spec], tools=[dump]))
    assert report.ok, report.divergence


@pytest.mark.asyncio
async def test_oversized_user_message_still_rejected(store: JetStreamEventStore) -> None:
    big = Commit(commit_id="c1", thread_id="t", run_id=None, ts=1,
                 events=[MessageAppended(message=Message(id="m", role="user", content="x" * BIG))])
    with pytest.raises(CommitTooLarge):
        await store.append(big, 0)
    assert [sc async for sc in store.read_thread("t")] == []


# -- pure offload / resolve ---------------------------------------------------------------------


class DictBlobs:
    bucket = "b"

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    async def put(self, name: str, data: bytes) -> None:
        self.data[name] = data

    async def get_ref(self, ref: PayloadRef) -> bytes:
        if ref.name not in self.data:
            raise PayloadMissing(ref.name)
        return self.data[ref.name]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


def tool_commit(results: list[Any]) -> Commit:
    events: list[Any] = []
    for i, r in enumerate(results):
        events.append(ToolCallCompleted(call_id=f"c{i}", outcome="succeeded", result=r, message_id=f"m{i}"))
        content = r if isinstance(r, str) else msgspec.json.encode(r).decode()
        events.append(MessageAppended(message=Message(id=f"m{i}", role="tool", content=content, tool_call_id=f"c{i}")))
    return Commit(commit_id="k", thread_id="t", run_id="r", ts=1, events=events)


def size(c: Commit) -> int:
    return len(encode_commit(c))


@given(st.lists(json_values, min_size=1, max_size=4), st.integers(min_value=0, max_value=2000))
def test_offload_then_resolve_is_identity(results: list[Any], limit: int) -> None:
    commit = tool_commit(results)
    blobs = DictBlobs()

    async def go() -> tuple[Commit, Commit]:
        small = await offload(commit, limit, blobs, size)
        return small, await resolve(decode_commit(encode_commit(small)), blobs.get_ref)

    small, back = asyncio.run(go())
    assert back == commit
    if size(commit) <= limit:
        assert small is commit and not blobs.data  # nothing moves when it fits
    # whatever moved was the largest first, and only tool outputs move
    assert all(name.startswith("k.") for name in blobs.data)


def test_a_tampered_payload_is_a_typed_error() -> None:
    commit = tool_commit(["y" * 500])
    blobs = DictBlobs()

    async def go() -> None:
        small = await offload(commit, 200, blobs, size)
        for name in blobs.data:
            blobs.data[name] = b'"tampered"'
        await resolve(small, blobs.get_ref)

    with pytest.raises(PayloadMissing, match="does not match"):
        asyncio.run(go())
