"""Write routes over HTTP (POST /v1/runs, /inputs, /cancel) against what users run (`agentlog
serve`, and `agentlog gateway` + `agentlog worker`: the shared `protocol_deployment` of
tests/apps/protocol_app.py, whose `sequential` agent asks before `echo` and `open` answers at once;
`tokens_deployment` for tenants; a deployment of its own for the restart, the run metrics and the
NATS outage): approval round trips, every documented error status, tenant isolation,
read-your-writes, SSE, restart while waiting. In process: a queue without a worker (the gateway's
10 s dispatch timeout is not a setting)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.support.http_stack import TIMEOUT, Remote, body, error, open_remote, remote, sse_events, uid  # noqa: F401
from tests.support.http_write import open_stack, suspended_call
from tests.support.topology import Deployment

pytestmark = pytest.mark.asyncio

ASKS, OPEN = "sequential", "open"


async def run_view(s: Remote, run_id: str, seq: int, headers: dict[str, str] | None = None) -> dict[str, Any]:
    return await body(await s.client.get(f"/v1/runs/{run_id}", params={"min_seq": str(seq)}, headers=headers), 200)


async def until_status(s: Remote, run_id: str, statuses: set[str], headers: dict[str, str] | None = None
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


async def test_approval_round_trip(remote: Remote) -> None:
    s = remote
    async with asyncio.timeout(TIMEOUT):
        c = s.client
        started = await body(await c.post("/v1/runs", json={"agent_id": ASKS, "messages": "approval: deploy it"}), 202)
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
        await error(await c.post(f"/v1/runs/{uid('unknown-run')}/inputs", json={"decisions": [approve(call)]}),
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
        cont = await body(await c.post(f"/v1/runs/{started['run_id']}/inputs",
                                       json={"messages": ["approval: again"]}), 202)
        assert cont["thread_id"] == started["thread_id"] and cont["run_id"] != started["run_id"]
        child = await until_status(s, cont["run_id"], {"waiting"})
        assert child["parent_run_id"] == started["run_id"]
        cancelled = await body(await c.post(f"/v1/runs/{cont['run_id']}/cancel", json={"reason": "enough"}), 202)
        view = await run_view(s, cont["run_id"], cancelled["seq"])
        assert view["cancel_requested"] or view["status"] == "done"
        assert (await until_status(s, cont["run_id"], {"done"}))["termination"]["type"] == "cancelled"


async def test_continuation_carrying_decisions(remote: Remote) -> None:
    s = remote
    async with asyncio.timeout(TIMEOUT):
        c = s.client
        a = await body(await c.post("/v1/runs", json={"agent_id": ASKS, "messages": "approval: go"}), 202)
        call = suspended_call(await until_status(s, a["run_id"], {"waiting"}))
        b = await body(await c.post("/v1/runs", json={
            "agent_id": OPEN, "parent_run_id": a["run_id"], "messages": [{"role": "user", "content": "text: next"}],
            "decisions": [approve(call, "dc")]}), 202)
        assert b["thread_id"] == a["thread_id"]
        parent = await until_status(s, a["run_id"], {"done"})
        assert parent["calls"][call]["decision"]["decision_id"] == "dc"
        assert (await until_status(s, b["run_id"], {"done"}))["parent_run_id"] == a["run_id"]


async def test_start_errors(remote: Remote) -> None:
    s = remote
    async with asyncio.timeout(TIMEOUT):
        c = s.client
        run, thread = uid("r-"), uid("t-")
        a = await body(await c.post("/v1/runs", json={"agent_id": OPEN, "messages": "text: hi", "run_id": run,
                                                      "thread_id": thread}), 202)
        await until_status(s, run, {"done"})
        before = await s.store.last_seq()
        bad = await error(await c.post("/v1/runs", json={"agent_id": "a.b"}), 400, "invalid_input")
        assert bad["detail"][0]["field"] == "agent_id"
        await error(await c.post("/v1/runs", json={}), 400, "invalid_input")
        await error(await c.post("/v1/runs", data=b"{not json"), 400, "invalid_json")
        await error(await c.post("/v1/runs", json={"agent_id": OPEN, "extra": 1}), 400, "invalid_input")
        await error(await c.post("/v1/runs", json={"agent_id": "nobody"}), 404, "agent_not_found")
        await error(await c.post("/v1/runs", json={"agent_id": OPEN, "parent_run_id": uid("nope")}), 404)
        await error(await c.post("/v1/runs", json={"agent_id": OPEN, "thread_id": thread, "run_id": run}),
                    409, "run_conflict")
        await error(await c.post("/v1/runs", data=b"x" * (1024 * 1024 + 1)), 413)  # the default max body: 1 MiB
        await error(await c.post("/v1/runs/a.b/cancel"), 400, "invalid_id")
        await error(await c.post(f"/v1/runs/{run}/inputs", json={}), 400, "invalid_input")
        await error(await c.post(f"/v1/runs/{uid('nope')}/cancel"), 404, "run_not_found")
        assert await s.store.last_seq() == before
        assert a["seq"] <= before


async def test_sse_start_streams_until_suspended(remote: Remote) -> None:
    async with asyncio.timeout(TIMEOUT):
        resp = await remote.client.post("/v1/runs", json={"agent_id": ASKS, "messages": "approval: go"},
                                        headers={"Accept": "text/event-stream"})
        assert resp.status == 200 and resp.headers["Content-Type"] == "text/event-stream"
        events = await sse_events(resp)
        kinds = [e.event for e in events]
        assert "RunStarted" in kinds[:2] and kinds[-1] == "RunSuspended", kinds
        assert all(e.data["run_id"] == events[0].data["run_id"] for e in events)


async def test_auth_and_tenant_isolation(tokens_deployment: Deployment) -> None:
    """Tenants C and D of `tokens_deployment` (conftest.py)."""
    async with asyncio.timeout(TIMEOUT), open_remote(tokens_deployment) as s:
        c = s.client

        def h(tok: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {tok}"}

        await error(await c.post("/v1/runs", json={"agent_id": OPEN}), 401, "unauthorized")
        await error(await c.post("/v1/runs", json={"agent_id": OPEN}, headers=h("bad")), 403, "forbidden")
        await error(await c.post("/v1/runs", json={"agent_id": OPEN}, headers=h("tc")), 403, "tenant_mismatch")
        await error(await c.post("/v1/runs", json={"agent_id": OPEN, "resource_id": "tenantD-x"},
                                 headers=h("tc")), 403, "tenant_mismatch")
        a = await body(await c.post("/v1/runs", json={"agent_id": ASKS, "resource_id": f"tenantC-{uid()}",
                                                      "messages": "approval: go"}, headers=h("tc")), 202)
        call = suspended_call(await until_status(s, a["run_id"], {"waiting"}, h("tc")))
        before = await s.store.last_seq()
        await error(await c.post(f"/v1/runs/{a['run_id']}/inputs", json={"decisions": [approve(call)]},
                                 headers=h("td")), 404, "run_not_found")
        await error(await c.post(f"/v1/runs/{a['run_id']}/cancel", headers=h("td")), 404, "run_not_found")
        await error(await c.post("/v1/runs", json={"agent_id": OPEN, "thread_id": a["thread_id"],
                                                   "resource_id": "tenantD-1"}, headers=h("td")), 404)
        await error(await c.post("/v1/runs", json={"agent_id": OPEN, "parent_run_id": a["run_id"]},
                                 headers=h("td")), 404)
        assert await s.store.last_seq() == before
        await body(await c.post(f"/v1/runs/{a['run_id']}/inputs", json={"decisions": [approve(call)]},
                                headers=h("tc")), 202)
        await until_status(s, a["run_id"], {"done"}, h("admin"))


@pytest.fixture
def deployment_options() -> dict[str, object]:
    """The protocol app; `--timeout 2`: a write waits that long for NATS to come back before its 503."""
    return {"app": "tests.apps.protocol_app:app", "args": ["--timeout", "2"]}


async def metric(s: Remote, line: str) -> None:
    """Wait (bounded by the caller) until /metrics shows `line`: the run metrics follow the log."""
    while True:
        text = await (await s.client.get("/metrics")).text()
        if line in text.splitlines():
            return
        await asyncio.sleep(0.05)


async def test_metrics_restart_while_waiting_and_nats_down(deployment: Deployment) -> None:
    """On a deployment of its own: the run metrics from the log (exact counts), a waiting run
    decided after the processes restarted (orderly stop, new processes on the same log), and
    writes refused with a 503 while NATS is down."""
    async with asyncio.timeout(TIMEOUT * 2), open_remote(deployment) as s:
        a = await body(await s.client.post("/v1/runs", json={"agent_id": OPEN, "messages": "text: hi"}), 202)
        await until_status(s, a["run_id"], {"done"})
        b = await body(await s.client.post("/v1/runs", json={"agent_id": ASKS, "messages": "approval: go"}), 202)
        call = suspended_call(await until_status(s, b["run_id"], {"waiting"}))
        for line in ("agentlog_runs_started_total 2.0", 'agentlog_runs_finished_total{status="done",termination="natural_end"} 1.0',
                     "agentlog_runs_active 1.0"):
            await metric(s, line)
        if deployment.kind == "serve":  # its worker's too: both starts acked (one run done, one waiting)
            for line in ("agentlog_worker_concurrency 64.0", 'agentlog_worker_commands_total{outcome="acked"} 2.0'):
                await metric(s, line)

        deployment.restart(kill=False)
        async with open_remote(deployment) as s2:  # the gateway's new address
            await body(await s2.client.post(f"/v1/runs/{b['run_id']}/inputs",
                                            json={"decisions": [approve(call)]}), 202)
            assert (await until_status(s2, b["run_id"], {"done"}))["termination"]["type"] == "natural_end"
            await s2.store.close()
            deployment.nats.stop()
            try:
                await error(await s2.client.post("/v1/runs", json={"agent_id": OPEN, "messages": "text: hi"}), 503)
                await error(await s2.client.post(f"/v1/runs/{uid('r')}/cancel"), 503)
            finally:
                deployment.nats.start()


async def test_queue_without_worker_times_out_with_503(nats_server: Any) -> None:
    async with asyncio.timeout(TIMEOUT), open_stack(nats_server, "queue", timeout=0.5) as s:
        assert s.worker is not None
        await s.worker.stop(timeout=1.0)
        await error(await s.client.post("/v1/runs", json={"agent_id": "quick", "messages": "hi"}),
                    503, "dispatch_timeout")


async def test_openapi_documents_write_routes(remote: Remote) -> None:
    async with asyncio.timeout(TIMEOUT):
        doc = await body(await remote.client.get("/openapi.json"), 200)
        assert "post" in doc["paths"]["/v1/runs"]
        assert "post" in doc["paths"]["/v1/runs/{id}/inputs"]
        assert "post" in doc["paths"]["/v1/runs/{id}/cancel"]
