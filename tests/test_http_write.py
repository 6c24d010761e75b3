"""Write routes over HTTP (POST /v1/runs, /inputs, /cancel) with both dispatchers: approval round
trips, every documented error status, tenant isolation, read-your-writes, SSE, restart while waiting."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentlog.gateway.http.requests import SERVICES

from test_http_support import TIMEOUT, body, error, sse_events
from test_http_write_support import Stack, open_stack, suspended_call

pytestmark = pytest.mark.asyncio

MODES = ["inprocess", "queue"]


async def run_view(s: Stack, run_id: str, seq: int, headers: dict[str, str] | None = None) -> dict[str, Any]:
    return await body(await s.client.get(f"/v1/runs/{run_id}", params={"min_seq": str(seq)}, headers=headers), 200)


async def until_status(s: Stack, run_id: str, statuses: set[str], headers: dict[str, str] | None = None
                       ) -> dict[str, Any]:
    """Follow the run's thread in the log until the run's status is one of `statuses`."""
    from agentlog.projections.fold import fold_commits

    first = [sc async for sc in s.store.read_run(run_id)]
    thread_id = first[0].commit.thread_id
    commits: list[Any] = []
    async for sc in s.store.follow(thread_id):
        commits.append(sc)
        run = fold_commits(commits).runs.get(run_id)
        if run is not None and run.status in statuses:
            return await run_view(s, run_id, sc.seq, headers)
    raise AssertionError("follow ended")


def approve(call_id: str, decision_id: str = "d1", approved: bool = True) -> dict[str, Any]:
    return {"target_id": call_id, "decision_id": decision_id, "action": "resume", "result": {"approved": approved}}


@pytest.mark.parametrize("mode", MODES)
async def test_approval_round_trip(nats_server: Any, mode: str) -> None:
    async with asyncio.timeout(TIMEOUT), open_stack(nats_server, mode) as s:
        c = s.client
        started = await body(await c.post("/v1/runs", json={"agent_id": "approver", "messages": "deploy it"}), 202)
        assert set(started) == {"thread_id", "run_id", "seq"}
        # read-your-writes: the returned seq makes the run visible in the views
        assert (await run_view(s, started["run_id"], started["seq"]))["run_id"] == started["run_id"]
        run = await until_status(s, started["run_id"], {"waiting"})
        call = suspended_call(run)
        before = await s.store.last_seq()
        # errors first: none of them writes
        await error(await c.post(f"/v1/runs/{started['run_id']}/inputs",
                                 json={"decisions": [approve("nope")]}), 400, "unknown_call")
        await error(await c.post(f"/v1/runs/{started['run_id']}/inputs",
                                 json={"decisions": [{"target_id": call}]}), 400, "invalid_input")
        await error(await c.post("/v1/runs/unknown-run/inputs", json={"decisions": [approve(call)]}),
                    404, "run_not_found")
        assert await s.store.last_seq() == before
        decided = await body(await c.post(f"/v1/runs/{started['run_id']}/inputs",
                                          json={"decisions": [approve(call)]}), 202)
        assert decided["seq"] > before and decided["run_id"] == started["run_id"]
        dup = await body(await c.post(f"/v1/runs/{started['run_id']}/inputs",
                                      json={"decisions": [approve(call)]}), 200)
        assert dup == {**decided, "duplicate": True}
        done = await until_status(s, started["run_id"], {"done"})
        assert done["termination"]["type"] == "natural_end"
        # a finished run: no decisions (409), no cancel (409); messages continue it
        last = await s.store.last_seq()
        await error(await c.post(f"/v1/runs/{started['run_id']}/inputs",
                                 json={"decisions": [approve(call, "d2")]}), 409)
        await error(await c.post(f"/v1/runs/{started['run_id']}/cancel"), 409, "run_finished")
        assert await s.store.last_seq() == last
        cont = await body(await c.post(f"/v1/runs/{started['run_id']}/inputs", json={"messages": ["again"]}), 202)
        assert cont["thread_id"] == started["thread_id"] and cont["run_id"] != started["run_id"]
        child = await until_status(s, cont["run_id"], {"waiting"})
        assert child["parent_run_id"] == started["run_id"]
        cancelled = await body(await c.post(f"/v1/runs/{cont['run_id']}/cancel", json={"reason": "enough"}), 202)
        view = await run_view(s, cont["run_id"], cancelled["seq"])
        assert view["cancel_requested"] or view["status"] == "done"
        assert (await until_status(s, cont["run_id"], {"done"}))["termination"]["type"] == "cancelled"


@pytest.mark.parametrize("mode", MODES)
async def test_continuation_carrying_decisions(nats_server: Any, mode: str) -> None:
    async with asyncio.timeout(TIMEOUT), open_stack(nats_server, mode) as s:
        c = s.client
        a = await body(await c.post("/v1/runs", json={"agent_id": "approver", "messages": "go"}), 202)
        call = suspended_call(await until_status(s, a["run_id"], {"waiting"}))
        b = await body(await c.post("/v1/runs", json={
            "agent_id": "quick", "parent_run_id": a["run_id"], "messages": [{"role": "user", "content": "next"}],
            "decisions": [approve(call, "dc")]}), 202)
        assert b["thread_id"] == a["thread_id"]
        parent = await until_status(s, a["run_id"], {"done"})
        assert parent["calls"][call]["decision"]["decision_id"] == "dc"
        assert (await until_status(s, b["run_id"], {"done"}))["parent_run_id"] == a["run_id"]


async def test_start_errors(nats_server: Any) -> None:
    async with asyncio.timeout(TIMEOUT), open_stack(nats_server, "inprocess") as s:
        c = s.client
        a = await body(await c.post("/v1/runs", json={"agent_id": "quick", "messages": "hi", "run_id": "r-1",
                                                      "thread_id": "t-1"}), 202)
        await until_status(s, "r-1", {"done"})
        before = await s.store.last_seq()
        bad = await error(await c.post("/v1/runs", json={"agent_id": "a.b"}), 400, "invalid_input")
        assert bad["detail"][0]["field"] == "agent_id"
        await error(await c.post("/v1/runs", json={}), 400, "invalid_input")
        await error(await c.post("/v1/runs", data=b"{not json"), 400, "invalid_json")
        await error(await c.post("/v1/runs", json={"agent_id": "quick", "extra": 1}), 400, "invalid_input")
        await error(await c.post("/v1/runs", json={"agent_id": "nobody"}), 404, "agent_not_found")
        await error(await c.post("/v1/runs", json={"agent_id": "quick", "parent_run_id": "nope"}), 404)
        await error(await c.post("/v1/runs", json={"agent_id": "quick", "thread_id": "t-1", "run_id": "r-1"}),
                    409, "run_conflict")
        await error(await c.post("/v1/runs", data=b"x" * (70 * 1024)), 413)
        await error(await c.post("/v1/runs/a.b/cancel"), 400, "invalid_id")
        await error(await c.post("/v1/runs/r-1/inputs", json={}), 400, "invalid_input")
        await error(await c.post("/v1/runs/nope/cancel"), 404, "run_not_found")
        assert await s.store.last_seq() == before
        assert a["seq"] <= before


async def test_sse_start_streams_until_suspended(nats_server: Any) -> None:
    async with asyncio.timeout(TIMEOUT), open_stack(nats_server, "queue") as s:
        resp = await s.client.post("/v1/runs", json={"agent_id": "approver", "messages": "go"},
                                   headers={"Accept": "text/event-stream"})
        assert resp.status == 200 and resp.headers["Content-Type"] == "text/event-stream"
        events = await sse_events(resp)
        kinds = [e.event for e in events]
        assert "RunStarted" in kinds[:2] and kinds[-1] == "RunSuspended", kinds
        assert all(e.data["run_id"] == events[0].data["run_id"] for e in events)


async def test_auth_and_tenant_isolation(nats_server: Any) -> None:
    async with asyncio.timeout(TIMEOUT), open_stack(nats_server, "inprocess", tokens="root,ta:tenantA,tb:tenantB") as s:
        c = s.client

        def h(tok: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {tok}"}

        await error(await c.post("/v1/runs", json={"agent_id": "quick"}), 401, "unauthorized")
        await error(await c.post("/v1/runs", json={"agent_id": "quick"}, headers=h("bad")), 403, "forbidden")
        await error(await c.post("/v1/runs", json={"agent_id": "quick"}, headers=h("ta")), 403, "tenant_mismatch")
        await error(await c.post("/v1/runs", json={"agent_id": "quick", "resource_id": "tenantB-x"},
                                 headers=h("ta")), 403, "tenant_mismatch")
        a = await body(await c.post("/v1/runs", json={"agent_id": "approver", "resource_id": "tenantA-1",
                                                      "messages": "go"}, headers=h("ta")), 202)
        call = suspended_call(await until_status(s, a["run_id"], {"waiting"}, h("ta")))
        before = await s.store.last_seq()
        await error(await c.post(f"/v1/runs/{a['run_id']}/inputs", json={"decisions": [approve(call)]},
                                 headers=h("tb")), 404, "run_not_found")
        await error(await c.post(f"/v1/runs/{a['run_id']}/cancel", headers=h("tb")), 404, "run_not_found")
        await error(await c.post("/v1/runs", json={"agent_id": "quick", "thread_id": a["thread_id"],
                                                   "resource_id": "tenantB-1"}, headers=h("tb")), 404)
        await error(await c.post("/v1/runs", json={"agent_id": "quick", "parent_run_id": a["run_id"]},
                                 headers=h("tb")), 404)
        assert await s.store.last_seq() == before
        await body(await c.post(f"/v1/runs/{a['run_id']}/inputs", json={"decisions": [approve(call)]},
                                headers=h("ta")), 202)
        await until_status(s, a["run_id"], {"done"}, h("root"))


@pytest.mark.parametrize("mode", MODES)
async def test_restart_while_waiting(nats_server: Any, mode: str) -> None:
    async with asyncio.timeout(TIMEOUT):
        async with open_stack(nats_server, mode) as s:
            a = await body(await s.client.post("/v1/runs", json={"agent_id": "approver", "messages": "go"}), 202)
            call = suspended_call(await until_status(s, a["run_id"], {"waiting"}))
        async with open_stack(nats_server, mode) as s2:  # new connection, runtime, worker, app
            await body(await s2.client.post(f"/v1/runs/{a['run_id']}/inputs",
                                            json={"decisions": [approve(call)]}), 202)
            assert (await until_status(s2, a["run_id"], {"done"}))["termination"]["type"] == "natural_end"


async def test_503_when_nats_is_down(nats_server: Any) -> None:
    async with asyncio.timeout(TIMEOUT), open_stack(nats_server, "inprocess") as s:
        await nats_server.astop()
        try:
            resp = await s.client.post("/v1/runs", json={"agent_id": "quick", "messages": "hi"})
            await error(resp, 503)
            await error(await s.client.post("/v1/runs/r1/cancel"), 503)
        finally:
            await nats_server.astart()


async def test_queue_without_worker_times_out_with_503(nats_server: Any) -> None:
    async with asyncio.timeout(TIMEOUT), open_stack(nats_server, "queue", timeout=0.5) as s:
        assert s.worker is not None
        await s.worker.stop(timeout=1.0)
        await error(await s.client.post("/v1/runs", json={"agent_id": "quick", "messages": "hi"}),
                    503, "dispatch_timeout")


async def test_openapi_documents_write_routes(nats_server: Any) -> None:
    async with asyncio.timeout(TIMEOUT), open_stack(nats_server, "inprocess") as s:
        doc = await body(await s.client.get("/openapi.json"), 200)
        assert "post" in doc["paths"]["/v1/runs"]
        assert "post" in doc["paths"]["/v1/runs/{id}/inputs"]
        assert "post" in doc["paths"]["/v1/runs/{id}/cancel"]


async def test_run_metrics_from_the_log(nats_server: Any) -> None:
    async with asyncio.timeout(TIMEOUT), open_stack(nats_server, "queue") as s:
        a = await body(await s.client.post("/v1/runs", json={"agent_id": "quick", "messages": "hi"}), 202)
        await until_status(s, a["run_id"], {"done"})
        b = await body(await s.client.post("/v1/runs", json={"agent_id": "approver", "messages": "go"}), 202)
        await until_status(s, b["run_id"], {"waiting"})
        runs = s.client.app[SERVICES].metrics.runs  # type: ignore[union-attr]
        # the watcher follows the same log: wait until it has seen both (bounded by the test timeout)
        await runs.wait_until(lambda: runs.started._value.get() >= 2
                              and runs.finished.labels("natural_end")._value.get() >= 1)
        text = await (await s.client.get("/metrics")).text()
        assert "agentlog_runs_started_total 2.0" in text
        assert 'agentlog_runs_finished_total{termination="natural_end"} 1.0' in text
        assert "agentlog_runs_active 1.0" in text
