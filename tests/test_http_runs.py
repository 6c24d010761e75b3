"""Run read routes: list with filters and pagination, get, 404s and bad ids."""

from __future__ import annotations

import asyncio

from agentlog.log.events import RunStarted

from test_http_support import TIMEOUT, Api, api, body, error, recorded_thread  # noqa: F401


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
