"""What only the real store can promise: data on disk across server restarts, bounded failures
while the server is down, idempotent stream setup, the server-version gate, and clean-up."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import nats
import pytest

from agentlog.eventlog import (
    AgentlogError,
    Commit,
    EmbeddedNatsServer,
    ServerTooOld,
    StoreUnavailable,
    collect,
    new_id,
    now_ms,
)
from agentlog.eventlog.events import StepStarted
from agentlog.eventlog.jetstream.store import (
    MIN_SERVER_VERSION,
    JetStreamEventStore,
    check_server_version,
    version_at_least,
)
from agentlog.eventlog.subjects import EVENTS_STREAM

WAIT = 20.0


def commit(thread: str, run: str | None = None) -> Commit:
    return Commit(commit_id=new_id(), thread_id=thread, run_id=run, ts=now_ms(), events=[StepStarted(step=1)])


async def connect(server: EmbeddedNatsServer, **kwargs: object) -> JetStreamEventStore:
    async with asyncio.timeout(WAIT):
        return await JetStreamEventStore.connect(server.url, **kwargs)  # type: ignore[arg-type]


async def stream_info(nc: nats.NATS) -> dict:
    reply = await nc.request(f"$JS.API.STREAM.INFO.{EVENTS_STREAM}", b"", timeout=5)
    return json.loads(reply.data)


async def test_data_survives_a_server_restart(nats_server: EmbeddedNatsServer) -> None:
    store = await connect(nats_server)
    written: dict[str, list[Commit]] = {"a": [], "b": []}
    version = {"a": 0, "b": 0}
    for i in range(10):
        thread = "a" if i % 3 else "b"
        c = commit(thread, "r1" if thread == "a" else None)
        version[thread] = (await store.append(c, version[thread])).seq
        written[thread].append(c)
    await store.close()
    nats_server.stop()
    nats_server.start()
    store = await connect(nats_server)
    try:
        async with asyncio.timeout(WAIT):
            for thread, commits in written.items():
                assert [sc.commit for sc in await collect(store.read_thread(thread))] == commits
                assert await store.thread_version(thread) == version[thread]
            assert await store.last_seq() == 10
            # OCC continues from the recovered versions.
            assert (await store.append(commit("a"), version["a"])).seq == 11
    finally:
        await store.close()


async def test_append_while_server_down_fails_then_succeeds_after_restart(
    nats_server: EmbeddedNatsServer,
) -> None:
    store = await connect(nats_server, request_timeout=0.5, reconnect_wait=0.1)
    try:
        v = (await store.append(commit("t"), 0)).seq
        await nats_server.astop()
        pending = commit("t")
        async with asyncio.timeout(WAIT):  # bounded: raises, never hangs
            with pytest.raises(StoreUnavailable):
                await store.append(pending, v)
            with pytest.raises(StoreUnavailable):
                await collect(store.read_thread("t"))
            with pytest.raises(StoreUnavailable):
                await store.thread_version("t")
        await nats_server.astart()
        async with asyncio.timeout(WAIT):
            while True:  # the client reconnects in the background; each try is bounded
                try:
                    result = await store.append(pending, v)
                    break
                except StoreUnavailable:
                    continue
            commits = await collect(store.read_thread("t"))
        assert result.seq == v + 1
        assert [sc.commit.commit_id for sc in commits].count(pending.commit_id) == 1
    finally:
        await store.close()


async def test_connect_to_nothing_is_store_unavailable(dead_nats_url: str) -> None:
    async with asyncio.timeout(WAIT):
        with pytest.raises(StoreUnavailable) as info:
            await JetStreamEventStore.connect(dead_nats_url, connect_timeout=1.0)
    # The reason after the colon names what went wrong, even when nats-py's exception has no text.
    reason = str(info.value).rsplit(": ", 1)[-1]
    assert reason.strip(), str(info.value)


async def test_stream_setup_is_idempotent_and_explicit(nats_server: EmbeddedNatsServer) -> None:
    first = await connect(nats_server)
    await first.append(commit("t"), 0)
    second = await connect(nats_server)
    try:
        info = await stream_info(second.nc)
        config = info["config"]
        assert config["subjects"] == ["agentlog.ev.>"]
        assert config["storage"] == "file"
        assert config["num_replicas"] == 1
        assert config["duplicate_window"] == 120 * 1_000_000_000
        assert config["allow_direct"] is True
        assert config["discard"] == "new"  # a size limit added later refuses commits, never drops them
        assert (config["max_msgs"], config["max_bytes"], config["max_age"]) == (-1, -1, 0)
        assert info["state"]["messages"] == 1  # connecting again kept the data
        assert await second.thread_version("t") == 1
    finally:
        await first.close()
        await second.close()


async def test_safe_settings_of_an_existing_stream_are_updated(nats_server: EmbeddedNatsServer) -> None:
    async with asyncio.timeout(WAIT):
        nc = await nats.connect(nats_server.url)
        try:
            js = nc.jetstream()
            await js.add_stream(name=EVENTS_STREAM, subjects=["agentlog.ev.>"], allow_direct=False,
                                duplicate_window=30.0)
            store = await JetStreamEventStore.connect(nc, duplicate_window=60.0)
            config = (await stream_info(nc))["config"]
            assert config["allow_direct"] is True
            assert config["duplicate_window"] == 60 * 1_000_000_000
            await store.close()
            assert nc.is_connected  # an adopted client stays open
        finally:
            await nc.close()


async def test_an_incompatible_stream_is_refused(nats_server: EmbeddedNatsServer) -> None:
    async with asyncio.timeout(WAIT):
        nc = await nats.connect(nats_server.url)
        try:
            await nc.jetstream().add_stream(name=EVENTS_STREAM, subjects=["other.>"])
            with pytest.raises(AgentlogError, match="subjects"):
                await JetStreamEventStore.connect(nc)
        finally:
            await nc.close()


@pytest.mark.parametrize(
    ("found", "ok"),
    [
        ("2.15.1", True),
        ("2.11.0", True),
        ("2.11.3", True),
        ("3.0.0", True),
        ("v2.12.0", True),
        ("2.11.0-RC.2", False),
        ("2.10.29", False),
        ("2.9.25", False),
        ("1.99.99", False),
        ("0.0.0-unknown", False),
        ("garbage", False),
    ],
)
def test_server_version_gate(found: str, ok: bool) -> None:
    assert MIN_SERVER_VERSION == "2.11.0"
    assert version_at_least(found) is ok
    if ok:
        check_server_version(found)
    else:
        with pytest.raises(ServerTooOld) as info:
            check_server_version(found)
        assert (info.value.found, info.value.needed) == (found, MIN_SERVER_VERSION)
        assert found in str(info.value) and MIN_SERVER_VERSION in str(info.value)


async def test_undecodable_message_is_quarantined_not_raised(nats_server: EmbeddedNatsServer) -> None:
    """Reads and the live tail put a quarantine stand-in at the bad message's seq (tests/eventlog/test_quarantine.py)."""
    store = await connect(nats_server, follow_heartbeat=0.3)
    try:
        await store.append(commit("t"), 0)
        await store.nc.request("agentlog.ev.t._", b"{not json", timeout=5)
        async with asyncio.timeout(WAIT):
            read = await collect(store.read_thread("t"))
            assert [type(e).__name__ for sc in read for e in sc.commit.events][-1] == "CommitQuarantined"
            follower = store.follow("t")
            assert (await anext(follower)).seq == 1
            assert (await anext(follower)).commit == read[1].commit
            await follower.aclose()
    finally:
        await store.close()


async def _consumers(nc: nats.NATS) -> int:
    return int((await stream_info(nc))["state"]["consumer_count"])


async def test_thread_follows_share_one_consumer_removed_after_the_last(nats_server: EmbeddedNatsServer) -> None:
    """However many threads and follows, one consumer (the store's live tail); it goes once the
    last follow has ended for `follow_linger`, and a later follow brings it back."""
    # the default heartbeat: a short one lets a loaded machine stall the tail into recreating its
    # consumer, and an old consumer whose delete timed out then lingers until it expires
    store = await connect(nats_server, follow_linger=0.2)
    try:
        await store.append(commit("t"), 0)
        await store.append(commit("u"), 0)
        async with asyncio.timeout(WAIT):
            follows = [store.follow(t) for t in ("t", "t", "u")]
            assert [(await anext(f)).seq for f in follows] == [1, 1, 2]
            assert await _consumers(store.nc) == 1
            for f in follows:
                await f.aclose()
            while await _consumers(store.nc):  # the tail lingers, then deletes its consumer
                await asyncio.sleep(0.05)

            started = asyncio.Event()

            async def tail() -> None:
                async for _ in store.follow("t"):
                    started.set()

            task = asyncio.create_task(tail())
            await started.wait()
            assert await _consumers(store.nc) == 1
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            while await _consumers(store.nc):
                await asyncio.sleep(0.05)
    finally:
        await store.close()


async def test_closing_the_store_removes_the_tail_and_ends_its_follows(nats_server: EmbeddedNatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    store = await connect(nats_server)  # the default heartbeat, as above
    try:
        await store.append(commit("t"), 0)
        async with asyncio.timeout(WAIT):
            follower = store.follow("t")
            await anext(follower)
            pending = asyncio.ensure_future(anext(follower))
            await store.close()
            with pytest.raises(StoreUnavailable):
                await pending
            assert await _consumers(nc) == 0
    finally:
        await store.close()
        await nc.close()


async def test_context_manager_closes_an_owned_connection(nats_server: EmbeddedNatsServer) -> None:
    async with await connect(nats_server) as store:
        await store.append(commit("t"), 0)
        nc = store.nc
    assert nc.is_closed


async def test_unanswered_requests_fail_within_the_request_timeout(nats_server: EmbeddedNatsServer) -> None:
    """A frozen server keeps the TCP connection up but answers nothing: every pending request,
    including concurrent ones, must fail with StoreUnavailable instead of hanging."""
    store = await connect(nats_server, request_timeout=0.5)
    pid = nats_server._proc.pid  # type: ignore[union-attr]
    try:
        v = (await store.append(commit("t"), 0)).seq
        os.kill(pid, signal.SIGSTOP)
        try:
            # kill() returns before the stop takes effect: on a busy machine the server answered
            # a request sent right after it (a flake). Wait until it really is frozen.
            async with asyncio.timeout(WAIT):
                await _until_stopped(pid)
            async with asyncio.timeout(WAIT):
                results = await asyncio.gather(
                    *(store.append(commit("t"), v) for _ in range(5)),
                    collect(store.read_thread("t")),
                    store.thread_version("t"),
                    return_exceptions=True,
                )
        finally:
            os.kill(pid, signal.SIGCONT)
        assert all(isinstance(r, StoreUnavailable) for r in results), results
        async with asyncio.timeout(WAIT):
            assert await store.thread_version("t") >= v
    finally:
        await store.close()


async def _until_stopped(pid: int) -> None:
    """Return once every thread of `pid` is in the stopped state (Linux /proc), polling."""
    tasks = Path(f"/proc/{pid}/task")
    if not tasks.is_dir():
        pytest.skip("needs Linux /proc to know when SIGSTOP has taken effect")

    def stopped() -> bool:
        states = []
        for stat in tasks.glob("*/stat"):
            try:
                states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
            except (OSError, IndexError):
                continue  # a thread that just exited
        return bool(states) and all(state in ("T", "t") for state in states)

    while not stopped():
        await asyncio.sleep(0.001)  # polling an observable condition, not a timed wait


async def test_a_taken_port_is_refused_not_mistaken_for_our_server(
    nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    """Another process listening on the port must not pass for our server (it did: start()
    only checked that the port answered, so tests ran against a foreign server and its data)."""
    other = EmbeddedNatsServer(tmp_path / "other", port=nats_server.port)
    with pytest.raises(StoreUnavailable, match="taken"):
        await other.astart()
    assert not other.running


async def test_a_picked_port_lost_to_a_race_is_replaced(nats_server: EmbeddedNatsServer, tmp_path: Path) -> None:
    store = await connect(nats_server)
    try:
        await store.append(commit("theirs"), 0)
    finally:
        await store.close()
    ours = EmbeddedNatsServer(tmp_path / "ours")
    ours.port = nats_server.port  # as if someone bound the port free_port() gave us before we did
    await ours.astart()
    try:
        assert ours.running and ours.port != nats_server.port
        store = await connect(ours)
        try:
            assert await store.last_seq() == 0  # our own, empty server, not the other one
        finally:
            await store.close()
        # A restart keeps the port (clients reconnect to it).
        port = ours.port
        await ours.astop()
        await ours.astart()
        assert ours.port == port
    finally:
        await ours.astop()


async def test_a_follow_whose_create_answer_is_lost_leaves_no_orphan_consumer(
    nats_server: EmbeddedNatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a loaded server a consumer create can time out after the server made the consumer. The
    retry must adopt that consumer (same name, same config: idempotent), not make a second one
    that nobody reads until it expires (CI once counted 3 consumers where 2 were expected)."""
    store = await connect(nats_server)
    try:
        async with asyncio.timeout(WAIT):
            first = await store.append(commit("orph"), 0)
            real_api = store._api
            lost: list[str] = []

            async def lose_first_create_answer(subject: str, payload: bytes):  # type: ignore[no-untyped-def]
                answer = await real_api(subject, payload)
                if subject.startswith("$JS.API.CONSUMER.CREATE.") and not lost:
                    lost.append(subject)
                    raise StoreUnavailable("timed out (the answer was lost)")
                return answer

            monkeypatch.setattr(store, "_api", lose_first_create_answer)
            feed = store.follow("orph")
            assert (await anext(feed)).seq == first.seq
            second = await store.append(commit("orph"), first.seq)
            assert (await anext(feed)).seq == second.seq  # from the live tail's consumer
            reply = await store.nc.request(f"$JS.API.CONSUMER.LIST.{EVENTS_STREAM}", b"{}", timeout=5)
            following = [c for c in json.loads(reply.data)["consumers"]
                         if c["config"].get("filter_subject") == "agentlog.ev.>"]
            assert lost and len(following) == 1
            await feed.aclose()
    finally:
        await store.close()
