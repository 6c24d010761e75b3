"""Cold resume from run-context snapshots on a real nats-server.

One run goes through many approval cycles; each cycle is a brand-new Runtime (nothing in memory)
deciding the waiting call. With `snapshots=KVSnapshotStore`, a decision reads one KV entry and the
thread's tail (nothing, when the snapshot is current) instead of the run's whole history, and the
log it writes is the same, commit for commit, as without snapshots. Stale, corrupt and forged
snapshots fall back to folding the log.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from agentlog.eventlog.errors import InvalidId
from agentlog.eventlog.events import Position, StoredCommit, ToolCallDecided
from agentlog.eventlog.memory import MemoryEventStore
from agentlog.projections.fold import fold_commits
from agentlog.projections.kv import KVViewStore
from agentlog.projections.runner import ProjectionRunner
from agentlog.runtime import (
    AgentSpec,
    DeterministicEntropy,
    Runtime,
    ToolContext,
    ToolResult,
    UnknownCall,
    tool,
)
from agentlog.runtime.inputs.commands import Decide
from agentlog.runtime.loop.hitl import CallNotSuspended
from agentlog.runtime.models.scripted import ScriptedModel, Turn
from agentlog.runtime.snapshots.format import decode_snapshot, encode_snapshot
from agentlog.runtime.snapshots.store import KVSnapshotStore, SnapshotWriter

from tests.support.runtime import store, thread_log  # noqa: F401  (fixture)

pytestmark = pytest.mark.asyncio


class CountingStore:
    """The real store, counting the commits reads hand out."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.read = 0

    async def read_thread(self, thread_id: str, after: int = 0) -> AsyncIterator[StoredCommit]:
        async for sc in self.inner.read_thread(thread_id, after):
            self.read += 1
            yield sc

    async def read_run(self, run_id: str, after: int = 0) -> AsyncIterator[StoredCommit]:
        async for sc in self.inner.read_run(run_id, after):
            self.read += 1
            yield sc

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@tool
def approve(ctx: ToolContext) -> Any:
    """Pending until a human decides; then done."""
    if ctx.decision is None:
        return ToolResult.pending(f"t-{ctx.call_id}", resume_mode="pass_decision_to_tool")
    return "approved"


def app(store: Any, entropy: DeterministicEntropy, snapshots: Any = None, *, text: str = "") -> Runtime:
    """A fresh process's Runtime: the model asks for approval again after every answer (call
    ids from the conversation, so any fresh model continues the numbering), saying `text`."""
    model = ScriptedModel([lambda req: Turn.tool("approve", id=f"ask{sum(m.role == 'assistant' for m in req.messages)}",
                                                 text=text)], loop=True)
    agent = AgentSpec(id="cycler", model=model, tools=["approve"], tool_execution_mode="sequential")
    return Runtime(store, agents=[agent], tools=[approve], entropy=entropy, snapshots=snapshots)


def suspended_call(result: Any) -> str:
    [call] = [c for c, v in result.run.calls.items() if v.status == "suspended"]
    return call


async def drive(store: Any, thread_id: str, prefix: str, modes: list[str], snaps: Any) -> list[int]:
    """Start a run, then one cycle per mode, each with a fresh Runtime. Modes: `plain` (no
    snapshots), `snap`, `corrupt` / `forged` (the run's snapshot is overwritten first).
    Returns the commits each cycle's decision read."""
    entropy = DeterministicEntropy(prefix=prefix)
    first = app(store, entropy, snaps)
    result = await first.run("cycler", "go", thread_id=thread_id, run_id=f"{thread_id}-run")
    await first.flush_snapshots()
    run_id = result.run_id
    reads: list[int] = []
    for i, mode in enumerate(modes):
        assert result.status == "waiting", result
        if mode == "corrupt":
            await snaps.put(run_id, b"{garbage")
        elif mode == "forged":
            snap = decode_snapshot(await snaps.get(run_id))
            assert snap is not None
            await snaps.put(run_id, encode_snapshot(msgspec.structs.replace(snap, seq=snap.seq + 10_000)))
        counting = CountingStore(store)
        rt = app(counting, entropy, None if mode == "plain" else snaps)
        res = await rt.decide(run_id, [{"target_id": suspended_call(result), "decision_id": f"d{i}",
                                        "action": "resume", "result": {"ok": True}, "updated_at": 1}])
        reads.append(counting.read)
        assert res.handle is not None and not res.duplicate
        result = await res.handle.result()
        await rt.flush_snapshots()  # the write is in the background; the next cycle should see it
    assert result.status == "waiting"
    return reads


async def test_cold_decisions_read_only_the_tail_and_write_the_same_log(store: Any) -> None:
    snaps = await KVSnapshotStore.open(store.nc)
    cycles = 8
    reads = await drive(store, "snap-a", "a", ["snap"] * cycles, snaps)
    # the snapshot is current every time: the tail is empty, the run's history is not read
    assert reads == [0] * cycles
    # the control (no snapshots; memory store, so the same ids can be written again) folds the
    # whole, growing thread every time, and writes exactly the same commits
    control = MemoryEventStore()
    plain_reads = await drive(control, "snap-a", "a", ["plain"] * cycles, None)
    assert plain_reads[-1] > plain_reads[0] > 0
    logged = await thread_log(store, "snap-a")
    assert [sc.commit for sc in logged] == [sc.commit for sc in await thread_log(control, "snap-a")]


async def test_snapshot_resumed_handle_sees_the_whole_run(store: Any) -> None:
    snaps = await KVSnapshotStore.open(store.nc)
    await drive(store, "snap-h", "h", ["snap", "snap"], snaps)
    entropy = DeterministicEntropy(prefix="h2")
    rt = app(store, entropy, snaps)
    run_id = "snap-h-run"
    waiting = fold_commits([sc async for sc in store.read_run(run_id)]).runs[run_id]
    [call] = [c for c, v in waiting.calls.items() if v.status == "suspended"]
    res = await rt.decide(run_id, [{"target_id": call, "decision_id": "dh", "action": "resume", "updated_at": 1}])
    assert res.handle is not None
    result = await res.handle.result()
    logged = [sc async for sc in store.read_run(run_id)]
    assert result.run == fold_commits(logged).runs[run_id]
    seen = [(ce.position, ce.event) for ce in [ce async for ce in res.handle.events()]]
    assert seen == [(Position(sc.seq, i), ev) for sc in logged for i, ev in enumerate(sc.commit.events)]


async def test_stale_corrupt_and_forged_snapshots_fall_back_to_the_fold(store: Any) -> None:
    snaps = await KVSnapshotStore.open(store.nc)
    modes = ["snap", "plain", "snap", "corrupt", "snap", "forged", "snap"]
    reads = await drive(store, "snap-s", "s", modes, snaps)
    await drive(store, "snap-c", "c", ["plain"] * len(modes), None)
    assert reads[0] == 0
    assert reads[2] > 0  # stale (a plain cycle moved the run on): the tail is read and folded
    assert reads[3] > 0  # corrupt: a miss, the thread is folded
    assert reads[4] == 0  # ...and the run wrote a good snapshot again
    assert reads[5] > 0  # forged seq: the append conflicts, the retry folds without it
    a, b = await thread_log(store, "snap-s"), await thread_log(store, "snap-c")
    shape = lambda log: [[type(e).__name__ for e in sc.commit.events] for sc in log]  # noqa: E731
    assert shape(a) == shape(b)
    run_a = fold_commits(a).runs["snap-s-run"]
    run_b = fold_commits(b).runs["snap-c-run"]
    assert (run_a.status, sorted(run_a.calls), run_a.steps) == (run_b.status, sorted(run_b.calls), run_b.steps)


async def test_decision_errors_and_duplicates_on_the_snapshot_path(store: Any) -> None:
    snaps = await KVSnapshotStore.open(store.nc)
    await drive(store, "snap-e", "e", ["snap"], snaps)
    run_id = "snap-e-run"
    logged = [sc async for sc in store.read_run(run_id)]
    first_seq = next(sc.seq for sc in logged for e in sc.commit.events if type(e).__name__ == "ToolCallDecided")
    rt = app(store, DeterministicEntropy(prefix="e2"), snaps)
    dup = await rt.decide(run_id, [{"target_id": "ask0", "decision_id": "d0", "action": "resume", "updated_at": 1}])
    assert (dup.duplicate, dup.seq, dup.handle) == (True, first_seq, None)
    with pytest.raises(UnknownCall):
        await rt.decide(run_id, [{"target_id": "nope", "decision_id": "dx", "action": "resume"}])
    with pytest.raises(CallNotSuspended):
        await rt.decide(run_id, [{"target_id": "ask0", "decision_id": "dy", "action": "resume"}])
    assert [sc async for sc in store.read_run(run_id)] == logged  # nothing written


class RunReadsRecorded(CountingStore):
    """The real store, recording where each `read_run` starts (`after`)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.run_reads_after: list[int] = []

    def read_run(self, run_id: str, after: int = 0) -> AsyncIterator[StoredCommit]:
        self.run_reads_after.append(after)
        return super().read_run(run_id, after)


async def test_a_worker_given_a_decision_again_does_not_read_the_run_from_its_first_commit(store: Any) -> None:
    """A worker gets each decision twice: its queued command and the live shortcut, in either
    order. The second finds it recorded (before the snapshot, once the run has paused again);
    the worker uses only the handle, so it does not look up which commit recorded it, a read
    of the run from its first commit."""
    snaps = await KVSnapshotStore.open(store.nc)
    await drive(store, "snap-w", "w", ["snap", "snap"], snaps)
    run_id = "snap-w-run"
    decided = [e.decision for sc in [sc async for sc in store.read_run(run_id)] for e in sc.commit.events
               if type(e) is ToolCallDecided and e.decision.decision_id == "d1"]
    logged = [sc async for sc in store.read_run(run_id)]
    recording = RunReadsRecorded(store)
    rt = app(recording, DeterministicEntropy(prefix="w2"), snaps)
    assert await rt.execute(Decide(thread_id="snap-w", run_id=run_id, decisions=decided)) == "done"
    assert 0 not in recording.run_reads_after, recording.run_reads_after
    assert [sc async for sc in store.read_run(run_id)] == logged  # a duplicate: nothing written


class ReadsRecorded:
    """The real snapshot store, recording every read (what a bad id must never reach)."""

    def __init__(self, inner: KVSnapshotStore) -> None:
        self.inner = inner
        self.reads: list[str] = []

    async def get(self, key: str) -> bytes | None:
        self.reads.append(key)
        return await self.inner.get(key)

    async def get_with_prefixes(self, key: str, prefixes: list[str]) -> tuple[bytes | None, dict[str, bytes]]:
        self.reads += [key, *prefixes]
        return await self.inner.get_with_prefixes(key, prefixes)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("thread_id", ["*", "snap-b.>", "a b", ""])
async def test_a_bad_thread_id_is_refused_before_any_read(store: Any, thread_id: str) -> None:
    """A cold resume's first read puts the thread id into subject wildcards, where `*` would read
    the message chunks of every thread (dropped then, as the entry's thread does not match, but
    read). So a bad thread id is `InvalidId` before anything is read or written."""
    snaps = await KVSnapshotStore.open(store.nc)
    await drive(store, "snap-b", "b", ["snap"], snaps)
    logged = [sc async for sc in store.read_thread("snap-b")]
    recorded = ReadsRecorded(snaps)
    rt = app(store, DeterministicEntropy(prefix="b2"), recorded)
    for attempt in (
        rt.decide("snap-b-run", [{"target_id": "ask1", "decision_id": "dz", "action": "resume"}], thread_id=thread_id),
        rt.resume("snap-b-run", thread_id=thread_id),
        rt.write_snapshot("snap-b-run", thread_id=thread_id),
    ):
        with pytest.raises(InvalidId):
            await attempt
    assert recorded.reads == []
    assert [sc async for sc in store.read_thread("snap-b")] == logged  # nothing written


async def test_snapshot_bucket_is_created_idempotently(store: Any) -> None:
    first = await KVSnapshotStore.open(store.nc)
    await first.put("r1", b"x")
    again = await KVSnapshotStore.open(store.nc)  # adopts the existing bucket, data kept
    assert await again.get("r1") == b"x"
    assert await again.get("r2") is None


async def test_projection_runner_keeps_snapshots_of_runs_no_loop_snapshotted(store: Any) -> None:
    """A run driven without snapshots (an older worker, a crashed one): the projection runner's
    `SnapshotWriter` writes its snapshot, and a cold decision then reads nothing but the tail."""
    snaps = await KVSnapshotStore.open(store.nc)
    views = await KVViewStore.open(store.nc)
    writer = SnapshotWriter(app(store, DeterministicEntropy(prefix="w0"), snaps))
    async with ProjectionRunner(store.nc, views, after_batch=writer, fetch_timeout=0.2) as runner:
        entropy = DeterministicEntropy(prefix="w")
        result = await app(store, entropy).run("cycler", "go", thread_id="snap-w", run_id="snap-w-run")
        assert result.status == "waiting"
        head = await store.thread_version("snap-w")
        await runner.wait_for(head)
        await writer.wait_written("snap-w-run", head)
    snap = decode_snapshot(await snaps.get("snap-w-run"))
    assert snap is not None and snap.seq == head
    counting = CountingStore(store)
    rt = app(counting, entropy, snaps)
    res = await rt.decide("snap-w-run", [{"target_id": suspended_call(result), "decision_id": "dw",
                                          "action": "resume", "updated_at": 1}])
    assert counting.read == 0
    assert res.handle is not None and (await res.handle.result()).status == "waiting"


async def test_snapshot_writer_skips_a_run_its_runtime_snapshotted_itself(store: Any) -> None:
    """`agentlog serve` hooks a `SnapshotWriter` over its own Runtime into the projections: a run
    that Runtime drove to a pause was snapshotted by its loop, so the writer does not fold and
    write the same snapshot again (once per approval). A run nobody snapshotted it still writes."""
    snaps = await KVSnapshotStore.open(store.nc)
    rt = app(store, DeterministicEntropy(prefix="k"), snaps)
    result = await rt.run("cycler", "go", thread_id="snap-k", run_id="snap-k-run")
    assert result.status == "waiting"
    await rt.flush_snapshots()
    writer = SnapshotWriter(rt)
    await writer([await rt.run_view("snap-k-run")])
    assert writer.writes == 0
    other = await app(store, DeterministicEntropy(prefix="k2")).run("cycler", "go", thread_id="snap-k2",
                                                                     run_id="snap-k2-run")
    assert other.status == "waiting"
    await writer([await rt.run_view("snap-k2-run")])
    assert writer.writes == 1


async def test_lazy_snapshot_store_opens_the_bucket_at_first_use(store: Any) -> None:
    lazy = KVSnapshotStore.lazy(store.nc)
    assert lazy.kv is None
    assert await lazy.get("nothing") is None
    await lazy.put("r9", b"v")
    assert await (await KVSnapshotStore.open(store.nc)).get("r9") == b"v"
