"""Run read routes: list with filters and pagination, get, 404s and bad ids; against what users
run (`remote`: `agentlog serve`, and `agentlog gateway` + `agentlog worker`, one shared deployment
per topology, so every test uses its own ids)."""

from __future__ import annotations

import asyncio
from typing import Any

from agentlog.eventlog.events import RunStarted
from agentlog.eventlog.ids import new_id

from tests.support.http_stack import (  # noqa: F401
    TIMEOUT,
    Remote,
    body,
    error,
    recorded_thread,
    remote,
    sse_events,
    uid,
)


async def _runs(remote: Remote) -> tuple[int, list[str], list[str], list[str]]:
    """Three runs on two new threads: r1 done and r2 waiting (agent A), r3 running (agent B, a
    child of r1). Their ids sort after every other id of the shared log, in this order
    (generated ids are time-ordered), so they are the last page of an unfiltered listing.
    Returns the last seq, the run ids, the thread ids and the agent ids."""
    base = f"zz{new_id()}"
    runs = [f"{base}{n}" for n in "abc"]
    threads, agents = [uid("t"), uid("t")], [uid("a"), uid("a")]
    await recorded_thread(remote, threads[0], runs[0], agent_id=agents[0])
    await recorded_thread(remote, threads[1], runs[1], finish=False, agent_id=agents[0])
    seq = await remote.append(threads[0], runs[2], [RunStarted(run_id=runs[2], agent_id=agents[1],
                                                               parent_run_id=runs[0])])
    return seq, runs, threads, agents


async def test_list_and_filters(remote: Remote) -> None:
    async with asyncio.timeout(TIMEOUT):
        seq, (r1, r2, r3), (t1, _t2), (a, b) = await _runs(remote)
        q = {"min_seq": seq}
        # newest first by default; order=asc from the oldest
        newest = await body(await remote.client.get("/v1/runs", params={**q, "limit": 3}), 200)
        assert [r["run_id"] for r in newest["runs"]] == [r3, r2, r1] and newest["order"] == "desc"
        total = newest["total"]
        last = await body(await remote.client.get("/v1/runs", params={**q, "offset": total - 3, "order": "asc"}), 200)
        assert [r["run_id"] for r in last["runs"]] == [r1, r2, r3] and last["total"] == total
        cases = [
            ({"thread_id": t1}, [r3, r1]),
            ({"thread_id": t1, "order": "asc"}, [r1, r3]),
            ({"agent_id": a, "status": "done"}, [r1]),
            ({"agent_id": a, "status": "waiting"}, [r2]),
            ({"agent_id": a, "status": "failed"}, []),
            ({"agent_id": b, "status": "running"}, [r3]),
            ({"agent_id": b}, [r3]),
            ({"parent_run_id": r1}, [r3]),
            ({"agent_id": a}, [r2, r1]),
            ({"agent_id": a, "order": "asc"}, [r1, r2]),
            ({"agent_id": a, "limit": 1, "offset": 1}, [r1]),
            ({"agent_id": a, "limit": 1, "offset": 1, "order": "asc"}, [r2]),
            ({"agent_id": a, "limit": 0}, [r2]),
            ({"agent_id": a, "offset": 2}, []),
        ]
        for params, wanted in cases:
            got = await body(await remote.client.get("/v1/runs", params={**q, **params}), 200)
            assert [r["run_id"] for r in got["runs"]] == wanted, params
        for bad in ({"status": "sleeping"}, {"thread_id": "a.b"}, {"parent_run_id": "_"}, {"limit": "x"},
                    {"order": "newest"}):
            await error(await remote.client.get("/v1/runs", params=bad), 400, "invalid_input")


async def test_get_run(remote: Remote) -> None:
    async with asyncio.timeout(TIMEOUT):
        seq, (_r1, r2, _r3), (_t1, t2), _agents = await _runs(remote)
        run = await body(await remote.client.get(f"/v1/runs/{r2}", params={"min_seq": seq}), 200)
        assert run["thread_id"] == t2 and run["status"] == "waiting"
        assert run["calls"]["c1"]["status"] == "suspended"
        await error(await remote.client.get(f"/v1/runs/{uid('r')}"), 404, "run_not_found")
        await error(await remote.client.get("/v1/runs/a.b"), 400, "invalid_id")
        await error(await remote.client.get("/v1/runs/_"), 400, "invalid_id")
        await error(await remote.client.get(f"/v1/runs/{uid('r')}/events"), 404, "run_not_found")


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
