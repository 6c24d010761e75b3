"""SSE from the log: frame shape, exact resume after every event (mid-commit too), live follow
with heartbeats, run streams that end when the run finishes or suspends, and the bounded
per-client queue (a client that stops taking frames is dropped; one that keeps taking them gets a
history of any length).

The route checks run against what users run (`remote`: `agentlog serve`, and `agentlog gateway`
+ `agentlog worker`, one shared deployment per topology, so every test uses its own ids); the
`Pump` checks are units, and the small-queue check needs an in-process setting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentlog.eventlog.events import RunFinished, RunStarted, StepStarted, Termination
from agentlog.gateway.http import Settings
from agentlog.gateway.http.sse import Pump
from agentlog.gateway.operations.services import SSE_HEARTBEAT_ENV

from tests.gateway.test_http_runs import follow_run
from tests.support.http_stack import (  # noqa: F401
    RECORDED_SIZES,
    TIMEOUT,
    Api,
    Remote,
    SseEvent,
    body,
    error,
    event_ids,
    open_api,
    recorded_thread,
    remote,
    sse_events,
    uid,
)


async def _all(api: Remote | Api, path: str, **headers: str) -> list[SseEvent]:
    async with api.client.get(path, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        return await sse_events(resp)


async def test_frames_carry_position_type_and_ids(remote: Remote) -> None:
    async with asyncio.timeout(TIMEOUT):
        thread, run, seqs = uid("t"), uid("r"), []
        await recorded_thread(remote, thread, run, seqs=seqs)
        events = await _all(remote, f"/v1/threads/{thread}/events")
        assert [e.id for e in events] == event_ids(seqs)
        assert events[0].event == "ThreadCreated" and events[0].data["run_id"] is None
        assert events[1].event == "RunStarted" and events[1].data["run_id"] == run
        assert all(e.data["thread_id"] == thread and e.data["event"]["type"] == e.event for e in events)
        run_events = await _all(remote, f"/v1/runs/{run}/events")
        assert [e.id for e in run_events] == [e.id for e in events[1:]]


async def test_resume_after_every_event_gives_exactly_the_rest(remote: Remote) -> None:
    """For every k: read k events of a live stream, drop the connection, reconnect with
    Last-Event-ID (or ?after=) and get exactly events k.. — no gap, no repeat."""
    async with asyncio.timeout(TIMEOUT):
        thread, run = uid("t"), uid("r")
        await recorded_thread(remote, thread, run)
        full = await _all(remote, f"/v1/threads/{thread}/events")
        ids = [e.id for e in full]
        assert len(ids) == sum(RECORDED_SIZES) and full[-1].event == "RunFinished"
        for k in range(len(full) + 1):
            async with remote.client.get(f"/v1/threads/{thread}/events", params={"follow": "true"}) as resp:
                first = await sse_events(resp, k)
            assert [e.id for e in first] == ids[:k]
            headers = {"Last-Event-ID": first[-1].id} if k else {}
            rest = await _all(remote, f"/v1/threads/{thread}/events", **headers)
            assert [e.id for e in rest] == ids[k:], k
            assert [e.data for e in rest] == [e.data for e in full[k:]]
            if k:
                by_query = await _all(remote, f"/v1/threads/{thread}/events?after={first[-1].id}")
                assert [e.id for e in by_query] == ids[k:]
                run_rest = await _all(remote, f"/v1/runs/{run}/events", **headers)
                assert [e.id for e in run_rest] == [i for i in ids[k:] if i != ids[0]]


async def test_last_event_id_wins_and_bad_ids_are_400(remote: Remote) -> None:
    async with asyncio.timeout(TIMEOUT):
        thread, run, seqs = uid("t"), uid("r"), []
        await recorded_thread(remote, thread, run, seqs=seqs)
        ids = event_ids(seqs)
        rest = await _all(remote, f"/v1/threads/{thread}/events?after={ids[0]}", **{"Last-Event-ID": ids[-2]})
        assert [e.id for e in rest] == ids[-1:]
        path = f"/v1/threads/{thread}/events"
        for bad in ("nope", "0:0", f"{seqs[2]}:-1"):
            await error(await remote.client.get(path, headers={"Last-Event-ID": bad}), 400, "invalid_event_id")
        await error(await remote.client.get(path, params={"after": "x"}), 400, "invalid_input")
        await error(await remote.client.get(path, params={"follow": "maybe"}), 400, "invalid_input")
        await error(await remote.client.get(f"/v1/threads/{uid('t')}/events"), 404, "thread_not_found")


async def test_follow_tails_live_commits_with_heartbeats(remote: Remote) -> None:
    """The deployment sends a heartbeat every second (`AGENTLOG_SSE_HEARTBEAT`, conftest.py)."""
    async with asyncio.timeout(TIMEOUT):
        thread, run, seqs = uid("t"), uid("r"), []
        await recorded_thread(remote, thread, run, seqs=seqs)
        ids = event_ids(seqs)
        comments: list[str] = []
        async with remote.client.get(f"/v1/threads/{thread}/events", params={"follow": "true"},
                                     headers={"Last-Event-ID": ids[-2]}) as resp:
            assert [e.id for e in await sse_events(resp, 1)] == ids[-1:]
            other = uid("r")
            seq = await remote.append(thread, other, [RunStarted(run_id=other, agent_id="a"), StepStarted(step=1)])
            live = await sse_events(resp, 2, comments=comments)
            assert [e.id for e in live] == [f"{seq}:0", f"{seq}:1"]
            raw = await resp.content.readline()  # the log is quiet now: only heartbeats come
            assert raw.startswith(b":"), raw


async def test_followed_run_stream_ends_when_the_run_finishes(remote: Remote) -> None:
    async with asyncio.timeout(TIMEOUT):
        thread, run, other = uid("t"), uid("r"), uid("r")
        await remote.append(thread, run, [RunStarted(run_id=run, agent_id="a")])
        async with remote.client.get(f"/v1/runs/{run}/events", params={"follow": "true"}) as resp:
            assert [e.event for e in await sse_events(resp, 1)] == ["RunStarted"]
            await remote.append(thread, other, [RunStarted(run_id=other, agent_id="a")])
            seq = await remote.append(thread, run, [StepStarted(step=1),
                                                    RunFinished(termination=Termination(type="natural_end"))])
            rest = await sse_events(resp)  # to the end of the stream: the server closes it
            assert [e.id for e in rest] == [f"{seq}:0", f"{seq}:1"]


async def test_followed_run_stream_of_a_waiting_run_ends_after_history(remote: Remote) -> None:
    async with asyncio.timeout(TIMEOUT):
        thread, run = uid("t"), uid("r")
        await recorded_thread(remote, thread, run, finish=False)
        async with remote.client.get(f"/v1/runs/{run}/events", params={"follow": "true"}) as resp:
            events = await sse_events(resp)
        assert events[-1].event == "RunSuspended"


async def _frames(n: int, closed: list[bool]) -> AsyncIterator[bytes]:
    try:
        for i in range(n):
            yield b"data: %d\n\n" % i
    finally:
        closed.append(True)


async def test_slow_client_is_dropped_not_waited_for() -> None:
    async with asyncio.timeout(TIMEOUT):
        stuck = asyncio.Event()

        async def never_drains(_data: bytes) -> None:
            await stuck.wait()

        for stall in (0, 0.01):  # dropped at once, or once it took no frame for `stall` seconds
            closed: list[bool] = []
            pump = Pump(_frames(100, closed), never_drains, queue_size=3, heartbeat=60, stall=stall)
            assert await pump.run() == "overflow"
            assert closed == [True]


async def test_a_draining_client_gets_a_history_longer_than_its_queue() -> None:
    """The log is read faster than a client is written to, so a long history fills the queue;
    a client that keeps taking frames is not slow and gets every one."""
    async with asyncio.timeout(TIMEOUT):
        got: list[bytes] = []

        async def write(data: bytes) -> None:
            got.append(data)
            await asyncio.sleep(0)  # a network write yields

        closed: list[bool] = []
        assert await Pump(_frames(100, closed), write, queue_size=3, heartbeat=60).run() == "end"
        assert len(got) == 100 and closed == [True]


async def test_event_streams_longer_than_the_client_queue_end_whole(nats_server: Any) -> None:
    """In process: it needs a client queue of 2 frames, which no deployment setting gives."""
    settings = Settings(sse_queue=2, sse_heartbeat=0.2)
    async with asyncio.timeout(TIMEOUT), open_api(nats_server, settings=settings) as small:
        await recorded_thread(small, "t1", "r1")
        thread = await _all(small, "/v1/threads/t1/events")
        run = await _all(small, "/v1/runs/r1/events")
        assert [e.id for e in thread] == ["1:0", "2:0", "2:1", "2:2", "3:0", "3:1", "4:0", "5:0", "5:1"]
        assert [e.id for e in run] == [e.id for e in thread[1:]]


async def test_gone_client_ends_the_producer() -> None:
    async with asyncio.timeout(TIMEOUT):
        async def reset(_data: bytes) -> None:
            raise ConnectionResetError("client went away")

        async def endless(closed: list[bool]) -> AsyncIterator[bytes]:
            try:
                while True:
                    yield b"data: x\n\n"
                    await asyncio.sleep(0)
            finally:
                closed.append(True)

        closed: list[bool] = []
        pump = Pump(endless(closed), reset, queue_size=10, heartbeat=60)
        assert await pump.run() == "client_gone"
        assert closed == [True]


async def test_pump_delivers_everything_in_order() -> None:
    async with asyncio.timeout(TIMEOUT):
        got: list[bytes] = []

        async def write(data: bytes) -> None:
            got.append(data)

        closed: list[bool] = []
        assert await Pump(_frames(50, closed), write, queue_size=100).run() == "end"
        assert got == [b"data: %d\n\n" % i for i in range(50)]


async def test_an_unexpected_source_error_ends_the_stream_with_an_error_event() -> None:
    """A bug in a frame source must not leave the client on heartbeats forever: the stream ends
    with an `error` event (code `agentlog_error`, no internals)."""
    async with asyncio.timeout(TIMEOUT):
        got: list[bytes] = []

        async def write(data: bytes) -> None:
            got.append(data)

        async def broken() -> AsyncIterator[bytes]:
            yield b"data: 0\n\n"
            raise KeyError("internal detail")

        assert await Pump(broken(), write, queue_size=10, heartbeat=0.05).run() == "end"
        assert got[0] == b"data: 0\n\n"
        assert got[-1].startswith(b"event: error\n") and b'"code":"agentlog_error"' in got[-1]
        assert b"internal detail" not in b"".join(got)


async def test_deployed_follow_across_a_decision(remote: Remote) -> None:
    """A run that asks for approval: its follow ends at the pause, the run reads `waiting` at
    once; after the decision (202) the follow from Last-Event-ID gives exactly the rest, to
    the end; the whole stream is the two joined."""
    async with asyncio.timeout(TIMEOUT):
        started = await body(await remote.client.post(
            "/v1/runs", json={"agent_id": "sequential", "messages": "approval: deploy"}), 202)
        run_id = started["run_id"]
        first = await follow_run(remote, run_id)
        assert first[-1].event == "RunSuspended"
        (call,) = first[-1].data["event"]["call_ids"]
        run = await body(await remote.client.get(f"/v1/runs/{run_id}"), 200)
        assert run["status"] == "waiting" and run["calls"][call]["status"] == "suspended"
        decided = await body(await remote.client.post(f"/v1/runs/{run_id}/inputs", json={"decisions": [
            {"target_id": call, "decision_id": uid("d"), "action": "resume", "result": {"approved": True}}]}), 202)
        rest = await follow_run(remote, run_id, first[-1].id)
        assert rest[0].event == "ToolCallDecided" and int(rest[0].id.split(":")[0]) == decided["seq"]
        assert rest[-1].event == "RunFinished"
        whole = await _all(remote, f"/v1/runs/{run_id}/events")
        assert [e.id for e in whole] == [e.id for e in first + rest]
        run = await body(await remote.client.get(f"/v1/runs/{run_id}"), 200)
        assert run["status"] == "done" and run["calls"][call]["status"] == "succeeded"


def test_heartbeat_interval_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SSE_HEARTBEAT_ENV, raising=False)
    assert Settings().sse_heartbeat == 15.0
    monkeypatch.setenv(SSE_HEARTBEAT_ENV, "2.5")
    assert Settings().sse_heartbeat == 2.5
    for bad in ("soon", "0", "-1", "inf", "nan"):
        monkeypatch.setenv(SSE_HEARTBEAT_ENV, bad)
        with pytest.raises(ValueError, match=SSE_HEARTBEAT_ENV):
            Settings()
