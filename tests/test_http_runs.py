"""Run read routes: list with filters and pagination, get, 404s and bad ids."""

from __future__ import annotations

import asyncio
from typing import Any

from agentlog.eventlog.events import RunStarted

from test_http_support import (  # noqa: F401
    TIMEOUT,
    Api,
    Remote,
    api,
    body,
    error,
    recorded_thread,
    remote,
    sse_events,
    uid,
)


async def _runs(api: Api) -> int:
    await recorded_thread(api, "t1", "r1")
    await recorded_thread(api, "t2", "r2", finish=False)
    return await api.append("t1", "r3", [RunStarted(run_id="r3", agent_id="other", parent_run_id="r1")])


async def test_list_and_filters(api: Api) -> None:
    async with asyncio.timeout(TIMEOUT):
        seq = await _runs(api)
        q = {"min_seq": seq}
        everything = await body(await api.client.get("/v1/runs", params=q), 200)
        assert [r["run_id"] for r in everything["runs"]] == ["r1", "r2", "r3"] and everything["total"] == 3
        cases = [
            ({"thread_id": "t1"}, ["r1", "r3"]),
            ({"status": "done"}, ["r1"]),
            ({"status": "waiting"}, ["r2"]),
            ({"status": "running"}, ["r3"]),
            ({"agent_id": "other"}, ["r3"]),
            ({"parent_run_id": "r1"}, ["r3"]),
            ({"limit": 1, "offset": 1}, ["r2"]),
            ({"limit": 0}, ["r1"]),
            ({"offset": 3}, []),
        ]
        for params, wanted in cases:
            got = await body(await api.client.get("/v1/runs", params={**q, **params}), 200)
            assert [r["run_id"] for r in got["runs"]] == wanted, params
        for bad in ({"status": "sleeping"}, {"thread_id": "a.b"}, {"parent_run_id": "_"}, {"limit": "x"}):
            await error(await api.client.get("/v1/runs", params=bad), 400, "invalid_input")


async def test_get_run(api: Api) -> None:
    async with asyncio.timeout(TIMEOUT):
        seq = await _runs(api)
        run = await body(await api.client.get("/v1/runs/r2", params={"min_seq": seq}), 200)
        assert run["thread_id"] == "t2" and run["status"] == "waiting"
        assert run["calls"]["c1"]["status"] == "suspended"
        await error(await api.client.get("/v1/runs/nope"), 404, "run_not_found")
        await error(await api.client.get("/v1/runs/a.b"), 400, "invalid_id")
        await error(await api.client.get("/v1/runs/_"), 400, "invalid_id")
        await error(await api.client.get("/v1/runs/nope/events"), 404, "run_not_found")


# -- what users run: serve, gateway + worker ------------------------------------------------------


async def follow_run(remote: Remote, run_id: str, last_event_id: str | None = None) -> list[Any]:
    """The run's events (SSE, followed) until it finishes or waits."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    async with remote.client.get(f"/v1/runs/{run_id}/events", params={"follow": "true"}, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        return await sse_events(resp)


async def test_deployed_start_then_read_list_and_follow(remote: Remote) -> None:
    """A run started over HTTP is readable at once (no min_seq), listed with its thread,
    followed to its end; the read right after the follow ends shows it done."""
    async with asyncio.timeout(TIMEOUT):
        started = await body(await remote.client.post("/v1/runs", json={"agent_id": "open", "messages": "text: hi"}),
                             202)
        run_id, thread_id = started["run_id"], started["thread_id"]
        listed = await body(await remote.client.get("/v1/runs", params={"thread_id": thread_id}), 200)
        assert [r["run_id"] for r in listed["runs"]] == [run_id]  # a thread's runs: no min_seq needed
        run = await body(await remote.client.get(f"/v1/runs/{run_id}"), 200)
        assert run["thread_id"] == thread_id and run["last_seq"] >= started["seq"]
        events = await follow_run(remote, run_id)
        assert "RunStarted" in [e.event for e in events[:2]] and events[-1].event == "RunFinished"
        run = await body(await remote.client.get(f"/v1/runs/{run_id}"), 200)
        assert run["status"] == "done" and run["last_seq"] == int(events[-1].id.split(":")[0])
        listed = await body(await remote.client.get("/v1/runs", params={"thread_id": thread_id,
                                                                        "min_seq": run["last_seq"]}), 200)
        assert [r["run_id"] for r in listed["runs"]] == [run_id] and listed["runs"][0]["status"] == "done"
        unknown = uid("r")
        await error(await remote.client.get(f"/v1/runs/{unknown}"), 404, "run_not_found")
        await error(await remote.client.get(f"/v1/runs/{unknown}/events"), 404, "run_not_found")
        await error(await remote.client.get("/v1/runs/a.b"), 400, "invalid_id")
        await error(await remote.client.post("/v1/runs", json={"agent_id": "nobody", "messages": "hi"}),
                    404, "agent_not_found")
