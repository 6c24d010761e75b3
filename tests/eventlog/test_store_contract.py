"""The `EventStore` contract: one suite, run against `MemoryEventStore` and `JetStreamEventStore`
(on a real nats-server). Anything the runtime relies on about the log is pinned here."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from agentlog.eventlog import (
    AppendResult,
    Commit,
    CommitTooLarge,
    EmbeddedNatsServer,
    EventStore,
    InvalidCommit,
    InvalidId,
    MemoryEventStore,
    StoredCommit,
    StoreUnavailable,
    VersionConflict,
    collect,
    new_id,
    now_ms,
)
from agentlog.eventlog.events import (
    AnyEvent,
    Message,
    MessageAppended,
    RunStarted,
    StepFinished,
    StepStarted,
    ToolCallCompleted,
)
from agentlog.eventlog.jetstream.store import JetStreamEventStore

WAIT = 20.0  # upper bound for anything that could hang; never a sleep


@dataclass
class Harness:
    store: EventStore
    server: EmbeddedNatsServer | None = None


@pytest.fixture(params=["memory", "jetstream"])
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    if request.param == "memory":
        yield Harness(MemoryEventStore())
        return
    server: EmbeddedNatsServer = request.getfixturevalue("nats_server")
    async with asyncio.timeout(WAIT):
        store = await JetStreamEventStore.connect(server.url, request_timeout=5.0, follow_heartbeat=0.3)
    try:
        yield Harness(store, server)
    finally:
        async with asyncio.timeout(WAIT):
            await store.close()


def commit(thread: str, run: str | None = None, *events: AnyEvent, commit_id: str | None = None) -> Commit:
    return Commit(
        commit_id=new_id() if commit_id is None else commit_id,
        thread_id=thread,
        run_id=run,
        ts=now_ms(),
        events=list(events) or [StepStarted(step=1), StepFinished(step=1)],
    )


async def thread_commits(store: EventStore, thread: str, after: int = 0) -> list[StoredCommit]:
    async with asyncio.timeout(WAIT):
        return await collect(store.read_thread(thread, after))


async def test_append_then_read_in_order(harness: Harness) -> None:
    store = harness.store
    a1, b1, a2, a3 = commit("ta"), commit("tb"), commit("ta", "r1", RunStarted(run_id="r1", agent_id="ag")), commit("ta")
    r1 = await store.append(a1, 0)
    rb = await store.append(b1, 0)
    r2 = await store.append(a2, r1.seq)
    r3 = await store.append(a3, r2.seq)
    assert r1.seq < rb.seq < r2.seq < r3.seq
    assert not (r1.duplicate or r2.duplicate or r3.duplicate)
    got = await thread_commits(store, "ta")
    assert [sc.seq for sc in got] == [r1.seq, r2.seq, r3.seq]
    assert [sc.commit for sc in got] == [a1, a2, a3]
    assert [sc.commit for sc in await thread_commits(store, "tb")] == [b1]


async def test_empty_thread_reads_nothing(harness: Harness) -> None:
    assert await thread_commits(harness.store, "never-written") == []
    assert await harness.store.thread_version("never-written") == 0


async def test_occ_conflict_is_typed_and_writes_nothing(harness: Harness) -> None:
    store = harness.store
    first = await store.append(commit("t"), 0)
    before = await thread_commits(store, "t")
    last_before = await store.last_seq()
    with pytest.raises(VersionConflict) as info:
        await store.append(commit("t"), 0)
    assert info.value.expected == 0
    assert info.value.actual == first.seq
    assert info.value.thread_id == "t"
    stale = await store.append(commit("t"), first.seq)  # the right version still works
    with pytest.raises(VersionConflict) as info:
        await store.append(commit("t"), first.seq)
    assert (info.value.expected, info.value.actual) == (first.seq, stale.seq)
    assert [sc.seq for sc in await thread_commits(store, "t")] == [sc.seq for sc in before] + [stale.seq]
    assert await store.last_seq() == last_before + 1


async def test_occ_is_per_thread(harness: Harness) -> None:
    store = harness.store
    await store.append(commit("one"), 0)
    # Another thread moving the stream does not conflict with this one.
    assert (await store.append(commit("two"), 0)).seq == 2
    assert (await store.append(commit("one", "ra"), 1)).seq == 3


async def test_retry_with_stale_expected_version_is_a_duplicate(harness: Harness) -> None:
    store = harness.store
    c1, c2 = commit("t"), commit("t", "r")
    r1 = await store.append(c1, 0)
    r2 = await store.append(c2, r1.seq)
    await store.append(commit("other"), 0)
    last = await store.last_seq()
    # The thread has moved since c1/c2 were written: the retries still answer the original seq.
    assert await store.append(c1, 0) == AppendResult(r1.seq, duplicate=True)
    assert await store.append(c2, r1.seq) == AppendResult(r2.seq, duplicate=True)
    assert await store.last_seq() == last
    assert [sc.commit for sc in await thread_commits(store, "t")] == [c1, c2]


async def test_retry_without_expected_version_is_a_duplicate(harness: Harness) -> None:
    store = harness.store
    c1 = commit("t")
    r1 = await store.append(c1, None)
    await store.append(commit("t"), None)
    assert await store.append(c1, None) == AppendResult(r1.seq, duplicate=True)
    assert len(await thread_commits(store, "t")) == 2


async def test_read_from_a_position(harness: Harness) -> None:
    store = harness.store
    seqs = []
    version = 0
    for _ in range(5):
        version = (await store.append(commit("t"), version)).seq
        seqs.append(version)
        await store.append(commit("noise"), None)
    assert [sc.seq for sc in await thread_commits(store, "t", after=seqs[1])] == seqs[2:]
    assert [sc.seq for sc in await thread_commits(store, "t", after=seqs[1] + 1)] == seqs[2:]
    assert await thread_commits(store, "t", after=seqs[-1]) == []


async def test_read_run(harness: Harness) -> None:
    store = harness.store
    v = (await store.append(commit("t", "r1", RunStarted(run_id="r1", agent_id="a")), 0)).seq
    v = (await store.append(commit("t", None), v)).seq
    r1b = await store.append(commit("t", "r1"), v)
    r2 = await store.append(commit("t", "r2", RunStarted(run_id="r2", agent_id="a")), r1b.seq)
    await store.append(commit("u", "r3", RunStarted(run_id="r3", agent_id="a")), 0)
    async with asyncio.timeout(WAIT):
        run1 = await collect(store.read_run("r1"))
        run1_later = await collect(store.read_run("r1", after=run1[0].seq))
        run2 = await collect(store.read_run("r2"))
    assert [sc.seq for sc in run1] == [1, r1b.seq]
    assert all(sc.commit.run_id == "r1" for sc in run1)
    assert [sc.seq for sc in run1_later] == [r1b.seq]
    assert [sc.seq for sc in run2] == [r2.seq]


async def test_thread_version_and_last_seq(harness: Harness) -> None:
    store = harness.store
    assert await store.last_seq() == 0
    assert await store.thread_version("t") == 0
    a = await store.append(commit("t"), 0)
    b = await store.append(commit("u"), 0)
    c = await store.append(commit("t", "r"), a.seq)
    assert await store.thread_version("t") == c.seq
    assert await store.thread_version("u") == b.seq
    assert await store.last_seq() == c.seq


BAD_IDS = ["a.b", "*", ">", "has space", "", "x" * 129, "é", "tab\t", "a>b"]


@pytest.mark.parametrize("bad", BAD_IDS)
async def test_invalid_ids_are_rejected_before_publishing(harness: Harness, bad: str) -> None:
    store = harness.store
    await store.append(commit("ok"), 0)
    last = await store.last_seq()
    with pytest.raises(InvalidId):
        await store.append(commit(bad), None)
    with pytest.raises(InvalidId):
        await store.append(commit("ok", bad), None)
    with pytest.raises(InvalidId):
        await store.append(commit("ok", commit_id=bad), None)
    async with asyncio.timeout(WAIT):
        with pytest.raises(InvalidId):
            await collect(store.read_thread(bad))
        with pytest.raises(InvalidId):
            await collect(store.read_run(bad))
        with pytest.raises(InvalidId):
            await store.thread_version(bad)
        follower = store.follow(bad)
        with pytest.raises(InvalidId):
            await anext(follower)
        await follower.aclose()
    assert await store.last_seq() == last
    assert len(await thread_commits(store, "ok")) == 1


async def test_max_length_id_is_accepted(harness: Harness) -> None:
    thread = "x" * 128
    result = await harness.store.append(commit(thread), 0)
    assert await harness.store.thread_version(thread) == result.seq


async def test_oversize_commit_is_rejected_and_nothing_written(harness: Harness) -> None:
    store = harness.store
    big = commit("t", None, MessageAppended(message=Message(id="m", role="user", content="x" * 2_000_000)))
    with pytest.raises(CommitTooLarge) as info:
        await store.append(big, 0)
    assert info.value.size > info.value.limit
    assert await store.last_seq() == 0
    assert await thread_commits(store, "t") == []


async def _follow_into(store: EventStore, thread: str | None, after: int, out: asyncio.Queue[StoredCommit]) -> None:
    async for sc in store.follow(thread, after):
        await out.put(sc)


async def _take(queue: asyncio.Queue[StoredCommit], n: int) -> list[StoredCommit]:
    async with asyncio.timeout(WAIT):
        return [await queue.get() for _ in range(n)]


async def test_follow_gets_existing_then_new_commits_in_order(harness: Harness) -> None:
    store = harness.store
    v = (await store.append(commit("t"), 0)).seq
    await store.append(commit("noise"), 0)
    queue: asyncio.Queue[StoredCommit] = asyncio.Queue()
    task = asyncio.create_task(_follow_into(store, "t", 0, queue))
    try:
        [first] = await _take(queue, 1)  # the follow is live from here on
        assert first.seq == v
        appended = []
        for _ in range(20):
            c = commit("t")
            v = (await store.append(c, v)).seq
            appended.append((v, c))
            await store.append(commit("noise"), None)
        got = await _take(queue, 20)
        assert [(sc.seq, sc.commit) for sc in got] == appended
        assert queue.empty()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_follow_all_threads_from_a_position(harness: Harness) -> None:
    store = harness.store
    seqs = [(await store.append(commit(t), None)).seq for t in ("a", "b", "c")]
    queue: asyncio.Queue[StoredCommit] = asyncio.Queue()
    task = asyncio.create_task(_follow_into(store, None, seqs[0], queue))
    try:
        got = await _take(queue, 2)
        assert [sc.seq for sc in got] == seqs[1:]
        more = [(await store.append(commit(t), None)).seq for t in ("d", "a")]
        assert [sc.seq for sc in await _take(queue, 2)] == more
        assert [sc.commit.thread_id for sc in got] == ["b", "c"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_follow_can_be_closed_by_breaking_out(harness: Harness) -> None:
    store = harness.store
    await store.append(commit("t"), 0)
    follower = store.follow("t")
    async with asyncio.timeout(WAIT):
        first = await anext(follower)
        await follower.aclose()
    assert first.seq == 1


async def test_follow_survives_server_restart(harness: Harness) -> None:
    if harness.server is None:
        pytest.skip("only the JetStream store has a server to restart")
    store, server = harness.store, harness.server
    v = (await store.append(commit("t"), 0)).seq
    queue: asyncio.Queue[StoredCommit] = asyncio.Queue()
    task = asyncio.create_task(_follow_into(store, "t", 0, queue))
    try:
        assert [sc.seq for sc in await _take(queue, 1)] == [v]
        before_restart = commit("t")
        v = (await store.append(before_restart, v)).seq
        assert [sc.commit for sc in await _take(queue, 1)] == [before_restart]
        async with asyncio.timeout(WAIT):
            await server.astop()
            await server.astart()
        appended = []
        for _ in range(3):
            c = commit("t")
            async with asyncio.timeout(WAIT):
                v = (await _append_when_back(store, c, v)).seq
            appended.append((v, c))
        got = await _take(queue, 3)
        assert [(sc.seq, sc.commit) for sc in got] == appended
        # Nothing repeated after the reconnect: the next thing out is the next commit.
        sentinel = commit("t")
        v = (await store.append(sentinel, v)).seq
        assert [(sc.seq, sc.commit) for sc in await _take(queue, 1)] == [(v, sentinel)]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _append_when_back(store: EventStore, c: Commit, expected: int) -> AppendResult:
    """Retry an append while the client reconnects; retrying the same commit is always safe."""
    while True:
        try:
            return await store.append(c, expected)
        except StoreUnavailable:
            continue


async def test_long_reads_cross_batches(harness: Harness) -> None:
    store = harness.store
    if isinstance(store, JetStreamEventStore):
        store.read_batch = 7  # force many batched direct gets, some cut by bytes
        store.read_max_bytes = 1_000
    version, expected = 0, []
    for i in range(60):
        c = commit("long")
        version = (await store.append(c, version)).seq
        expected.append((version, c))
        if i % 4 == 0:
            await store.append(commit("noise"), None)
    got = await thread_commits(store, "long")
    assert [(sc.seq, sc.commit) for sc in got] == expected
    assert [sc.seq for sc in await thread_commits(store, "long", after=expected[29][0])] == [
        seq for seq, _ in expected[30:]
    ]


async def test_racing_writers_form_one_linear_history(harness: Harness) -> None:
    """Writers that race on one thread under OCC: each commit lands exactly once, every loser
    gets a VersionConflict and retries at the new version, nobody's order is broken."""
    store = harness.store

    async def writer(name: str) -> list[str]:
        mine = []
        for i in range(5):
            c = commit("race", None, StepStarted(step=i))
            while True:
                try:
                    await store.append(c, await store.thread_version("race"))
                    break
                except VersionConflict:
                    continue
            mine.append(c.commit_id)
        return mine

    async with asyncio.timeout(WAIT):
        per_writer = await asyncio.gather(*(writer(f"w{n}") for n in range(8)))
    log = [sc.commit.commit_id for sc in await thread_commits(store, "race")]
    assert len(log) == len(set(log)) == 40
    for mine in per_writer:
        assert [cid for cid in log if cid in set(mine)] == mine


# msgspec does not validate Literal fields or JSON-ness at construction: these commits can be
# built in Python but could never be read back, so the store must refuse them before publishing.
UNREADABLE = [
    MessageAppended(message=Message(id="m1", role="robot", content="hi")),  # type: ignore[arg-type]
    MessageAppended(message=Message(id="m1", role="user", visibility="secret")),  # type: ignore[arg-type]
    ToolCallCompleted(call_id="c1", outcome="maybe", result=1),  # type: ignore[arg-type]
    ToolCallCompleted(call_id="c1", outcome="succeeded", result=object()),
]


@pytest.mark.parametrize("event", UNREADABLE, ids=["role", "visibility", "outcome", "non_json"])
async def test_commits_that_would_not_decode_are_rejected_before_publishing(
    harness: Harness, event: AnyEvent
) -> None:
    store = harness.store
    await store.append(commit("ok"), 0)
    last = await store.last_seq()
    with pytest.raises(InvalidCommit):
        await store.append(commit("ok", None, event), None)
    assert await store.last_seq() == last
    assert [c.seq for c in await thread_commits(store, "ok")] == [last]
