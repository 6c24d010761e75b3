"""SSE from the log: frame shape, exact resume after every event (mid-commit too), live follow
with heartbeats, run streams that end when the run finishes or suspends, and the bounded
per-client queue (a client that stops taking frames is dropped; one that keeps taking them gets a
history of any length)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from agentlog.eventlog.events import RunFinished, RunStarted, StepStarted, Termination
from agentlog.gateway.http import Settings
from agentlog.gateway.http.sse import Pump

from test_http_runs import follow_run
from test_http_support import (  # noqa: F401
    TIMEOUT,
    Api,
    Remote,
    api,
    body,
    error,
    open_api,
    recorded_thread,
    remote,
    sse_events,
    uid,
)


async def _all(api: Api, path: str, **headers: str):
    async with api.client.get(path, headers=headers) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        return await sse_events(resp)


async def test_frames_carry_position_type_and_ids(api: Api) -> None:
    async with asyncio.timeout(TIMEOUT):
        await recorded_thread(api, "t1", "r1")
        events = await _all(api, "/v1/threads/t1/events")
        assert [e.id for e in events] == ["1:0", "2:0", "2:1", "2:2", "3:0", "3:1", "4:0", "5:0", "5:1"]
        assert events[0].event == "ThreadCreated" and events[0].data["run_id"] is None
        assert events[1].event == "RunStarted" and events[1].data["run_id"] == "r1"
        assert all(e.data["thread_id"] == "t1" and e.data["event"]["type"] == e.event for e in events)
        run = await _all(api, "/v1/runs/r1/events")
        assert [e.id for e in run] == [e.id for e in events[1:]]


async def test_resume_after_every_event_gives_exactly_the_rest(api: Api) -> None:
    """For every k: read k events of a live stream, drop the connection, reconnect with
    Last-Event-ID (or ?after=) and get exactly events k.. — no gap, no repeat."""
    async with asyncio.timeout(TIMEOUT):
        await recorded_thread(api, "t1", "r1")
        full = await _all(api, "/v1/threads/t1/events")
        ids = [e.id for e in full]
        for k in range(len(full) + 1):
            async with api.client.get("/v1/threads/t1/events", params={"follow": "true"}) as resp:
                first = await sse_events(resp, k)
            assert [e.id for e in first] == ids[:k]
            headers = {"Last-Event-ID": first[-1].id} if k else {}
            rest = await _all(api, "/v1/threads/t1/events", **headers)
            assert [e.id for e in rest] == ids[k:], k
            assert [e.data for e in rest] == [e.data for e in full[k:]]
            if k:
                by_query = await _all(api, f"/v1/threads/t1/events?after={first[-1].id}")
                assert [e.id for e in by_query] == ids[k:]
                run_rest = await _all(api, "/v1/runs/r1/events", **headers)
                assert [e.id for e in run_rest] == [i for i in ids[k:] if i != "1:0"]


async def test_last_event_id_wins_and_bad_ids_are_400(api: Api) -> None:
    async with asyncio.timeout(TIMEOUT):
        await recorded_thread(api, "t1", "r1")
        rest = await _all(api, "/v1/threads/t1/events?after=1:0", **{"Last-Event-ID": "5:0"})
        assert [e.id for e in rest] == ["5:1"]
        for bad in ("nope", "0:0", "3:-1"):
            await error(await api.client.get("/v1/threads/t1/events", headers={"Last-Event-ID": bad}),
                        400, "invalid_event_id")
        await error(await api.client.get("/v1/threads/t1/events", params={"after": "x"}), 400, "invalid_input")
        await error(await api.client.get("/v1/threads/t1/events", params={"follow": "maybe"}), 400, "invalid_input")
        await error(await api.client.get("/v1/threads/none/events"), 404, "thread_not_found")


async def test_follow_tails_live_commits_with_heartbeats(api: Api) -> None:
    async with asyncio.timeout(TIMEOUT):
        await recorded_thread(api, "t1", "r1")
        comments: list[str] = []
        async with api.client.get("/v1/threads/t1/events", params={"follow": "true"},
                                  headers={"Last-Event-ID": "5:0"}) as resp:
            assert [e.id for e in await sse_events(resp, 1)] == ["5:1"]
            seq = await api.append("t1", "r9", [RunStarted(run_id="r9", agent_id="a"), StepStarted(step=1)])
            live = await sse_events(resp, 2, comments=comments)
            assert [e.id for e in live] == [f"{seq}:0", f"{seq}:1"]
            raw = await resp.content.readline()  # the log is quiet now: only heartbeats come
            assert raw.startswith(b":"), raw


async def test_followed_run_stream_ends_when_the_run_finishes(api: Api) -> None:
    async with asyncio.timeout(TIMEOUT):
        await api.append("t1", "r1", [RunStarted(run_id="r1", agent_id="a")])
        async with api.client.get("/v1/runs/r1/events", params={"follow": "true"}) as resp:
            assert [e.event for e in await sse_events(resp, 1)] == ["RunStarted"]
            await api.append("t1", "other", [RunStarted(run_id="other", agent_id="a")])
            seq = await api.append("t1", "r1", [StepStarted(step=1),
                                                RunFinished(termination=Termination(type="natural_end"))])
            rest = await sse_events(resp)  # to the end of the stream: the server closes it
            assert [e.id for e in rest] == [f"{seq}:0", f"{seq}:1"]


async def test_followed_run_stream_of_a_waiting_run_ends_after_history(api: Api) -> None:
    async with asyncio.timeout(TIMEOUT):
        await recorded_thread(api, "t1", "r1", finish=False)
        async with api.client.get("/v1/runs/r1/events", params={"follow": "true"}) as resp:
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


# -- what users run: serve, gateway + worker ------------------------------------------------------


async def _remote_all(remote: Remote, path: str, **headers: str) -> list[Any]:
    async with remote.client.get(path, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        return await sse_events(resp)


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
        whole = await _remote_all(remote, f"/v1/runs/{run_id}/events")
        assert [e.id for e in whole] == [e.id for e in first + rest]
        run = await body(await remote.client.get(f"/v1/runs/{run_id}"), 200)
        assert run["status"] == "done" and run["calls"][call]["status"] == "succeeded"


async def test_deployed_resume_after_every_event_gives_exactly_the_rest(remote: Remote) -> None:
    async with asyncio.timeout(TIMEOUT):
        thread, run = uid("t"), uid("r")
        await recorded_thread(remote, thread, run)  # type: ignore[arg-type]
        full = await _remote_all(remote, f"/v1/threads/{thread}/events")
        ids = [e.id for e in full]
        assert len(ids) == 9 and full[-1].event == "RunFinished"
        for k in range(1, len(full) + 1):
            rest = await _remote_all(remote, f"/v1/threads/{thread}/events", **{"Last-Event-ID": ids[k - 1]})
            assert [e.id for e in rest] == ids[k:], k
            run_rest = await _remote_all(remote, f"/v1/runs/{run}/events?after={ids[k - 1]}")
            assert [e.id for e in run_rest] == [i for i in ids[k:] if i != ids[0]]
