"""The `agentlog` NATS micro service: discovery ($SRV.PING/INFO/STATS), an approval round trip
over request/reply with both dispatchers (and across a restart while waiting), HTTP's error codes
in micro error headers, and hypothesis-generated bad requests that never crash nor write."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentlog.gateway.nats.service import endpoint_subjects, start_nats_service

from tests.support.http_stack import TIMEOUT
from tests.support.http_write import Stack, open_stack

pytestmark = pytest.mark.asyncio


@contextlib.asynccontextmanager
async def nats_stack(server: Any, mode: str = "inprocess", tokens: str = "") -> AsyncIterator[Stack]:
    async with open_stack(server, mode) as s:
        service = await start_nats_service(s.store, s.views, s.runner, s.dispatcher, auth_tokens=tokens)
        try:
            yield s
        finally:
            await service.stop()


async def call(s: Stack, op: str, payload: Any = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """Request `agentlog.api.<op>`: (status, body); status 200 for success answers."""
    data = payload if isinstance(payload, bytes) else json.dumps(payload or {}).encode()
    msg = await s.store.nc.request(f"agentlog.api.{op}", data, timeout=10, headers=headers)
    body = json.loads(msg.data) if msg.data else None
    code = (msg.headers or {}).get("Nats-Service-Error-Code")
    if code is not None:
        assert body["code"] and body["error"] and msg.headers["Nats-Service-Error"]
        return int(code), body
    return 200, body


async def until(s: Stack, run_id: str, statuses: set[str]) -> dict[str, Any]:
    from agentlog.projections.fold import fold_commits

    thread_id = [sc async for sc in s.store.read_run(run_id)][0].commit.thread_id
    commits: list[Any] = []
    async for sc in s.store.follow(thread_id):
        commits.append(sc)
        run = fold_commits(commits).runs.get(run_id)
        if run is not None and run.status in statuses:
            status, view = await call(s, "runs.get", {"run_id": run_id, "min_seq": sc.seq})
            assert status == 200, view
            return view
    raise AssertionError("follow ended")


def waiting_call(run: dict[str, Any]) -> str:
    return next(cid for cid, c in run["calls"].items() if c["status"] == "suspended")


async def test_discoverable(nats_server: Any) -> None:
    async with asyncio.timeout(TIMEOUT), nats_stack(nats_server) as s:
        nc = s.store.nc
        ping = json.loads((await nc.request("$SRV.PING.agentlog", b"", timeout=5)).data)
        assert ping["name"] == "agentlog"
        info = json.loads((await nc.request("$SRV.INFO.agentlog", b"", timeout=5)).data)
        assert sorted(e["subject"] for e in info["endpoints"]) == sorted(endpoint_subjects())
        assert len(endpoint_subjects()) == 15  # with threads.fork, threads.diff, threads.revoke, runs.counterfactual, profiles.get
        await call(s, "threads.list")
        await call(s, "threads.list")
        stats = json.loads((await nc.request("$SRV.STATS.agentlog", b"", timeout=5)).data)
        counts = {e["subject"]: e["num_requests"] for e in stats["endpoints"]}
        assert counts["agentlog.api.threads.list"] == 2


@pytest.mark.parametrize("mode", ["inprocess", "queue"])
async def test_approval_round_trip(nats_server: Any, mode: str) -> None:
    async with asyncio.timeout(TIMEOUT), nats_stack(nats_server, mode) as s:
        status, created = await call(s, "threads.create", {"thread_id": "t-n", "resource_id": "x"})
        assert status == 200 and created["seq"] > 0
        status, a = await call(s, "runs.start", {"agent_id": "approver", "thread_id": "t-n", "messages": "go"})
        assert status == 200 and a["thread_id"] == "t-n", a
        cid = waiting_call(await until(s, a["run_id"], {"waiting"}))
        status, err = await call(s, "runs.inputs", {"run_id": a["run_id"], "decisions": [
            {"target_id": "zz", "decision_id": "d", "action": "resume"}]})
        assert (status, err["code"]) == (400, "unknown_call")
        dec = {"target_id": cid, "decision_id": "d1", "action": "resume", "result": {"approved": True}}
        status, d = await call(s, "runs.inputs", {"run_id": a["run_id"], "decisions": [dec]})
        assert status == 200 and d["seq"] > a["seq"]
        assert (await until(s, a["run_id"], {"done"}))["termination"]["type"] == "natural_end"
        status, err = await call(s, "runs.cancel", {"run_id": a["run_id"]})
        assert (status, err["code"]) == (409, "run_finished")
        status, listed = await call(s, "runs.list", {"thread_id": "t-n", "min_seq": d["seq"]})
        assert status == 200 and [r["run_id"] for r in listed["runs"]] == [a["run_id"]]
        status, thread = await call(s, "threads.get", {"thread_id": "t-n"})
        assert status == 200 and thread["thread_id"] == "t-n"
        status, msgs = await call(s, "threads.messages", {"thread_id": "t-n"})
        assert status == 200 and msgs["messages"][0]["message"]["content"] == "go"
        status, err = await call(s, "runs.get", {"run_id": "nope"})
        assert (status, err["code"]) == (404, "run_not_found")


async def test_restart_while_waiting(nats_server: Any) -> None:
    async with asyncio.timeout(TIMEOUT):
        async with nats_stack(nats_server, "queue") as s:
            status, a = await call(s, "runs.start", {"agent_id": "approver", "messages": "go"})
            cid = waiting_call(await until(s, a["run_id"], {"waiting"}))
        async with nats_stack(nats_server, "queue") as s2:
            dec = {"target_id": cid, "decision_id": "d1", "action": "resume", "result": {"approved": True}}
            status, _ = await call(s2, "runs.inputs", {"run_id": a["run_id"], "decisions": [dec]})
            assert status == 200
            assert (await until(s2, a["run_id"], {"done"}))["status"] == "done"


async def test_auth_over_nats(nats_server: Any) -> None:
    async with asyncio.timeout(TIMEOUT), nats_stack(nats_server, tokens="ta:tenantA") as s:
        status, err = await call(s, "threads.list")
        assert (status, err["code"]) == (401, "unauthorized")
        status, err = await call(s, "runs.start", {"agent_id": "quick"}, {"Authorization": "Bearer ta"})
        assert (status, err["code"]) == (403, "tenant_mismatch")


_ids = st.one_of(st.text(max_size=12), st.integers(), st.none(), st.just("a.b"), st.just("ok-id"))
_json = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8)),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                     max_leaves=8)
_decision = st.fixed_dictionaries({}, optional={
    "target_id": _ids, "decision_id": _ids, "action": st.sampled_from(["resume", "cancel", "x"]), "result": _json})
_bodies = st.one_of(
    _json,
    st.fixed_dictionaries({}, optional={
        "agent_id": st.one_of(_ids, st.just("nobody")), "run_id": _ids, "thread_id": _ids,
        "parent_run_id": _ids, "messages": st.one_of(_json, st.lists(st.text(max_size=5), max_size=2)),
        "decisions": st.lists(_decision, max_size=2), "reason": _json, "resource_id": _ids, "limit": _json,
        "min_seq": st.one_of(st.integers(-2, 0), st.text(max_size=3))}),
)
_OPS = [s.removeprefix("agentlog.api.") for s in endpoint_subjects()]


def neutralise(op: str, payload: Any) -> Any:
    """Keep a generated request invalid: it may be anything except a request that should write."""
    if not isinstance(payload, dict):
        return payload
    if op == "runs.start":
        return {**payload, "agent_id": "nobody"}
    if op == "threads.create":
        return {**payload, "thread_id": "a.b"}
    if op == "runs.cancel" and payload.get("run_id") == "ok-id":
        return {**payload, "run_id": "unknown-run"}
    if op == "runs.inputs":
        return {k: v for k, v in payload.items() if k != "messages"}  # no continuation
    return payload


def examples(ops: list[str], count: int) -> list[tuple[str, Any, bytes | None]]:
    """Hypothesis-generated (op, body, raw bytes) triples. Generated up front and sent from the
    test's event loop (hypothesis drives sync functions); a failure names the example."""
    out: list[tuple[str, Any, bytes | None]] = []

    @settings(max_examples=count, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(op=st.sampled_from(ops), payload=_bodies, raw=st.one_of(st.none(), st.binary(max_size=20)))
    def collect(op: str, payload: Any, raw: bytes | None) -> None:
        if op == "threads.create" and raw is not None and raw.strip() in (b"", b"{}", b"null"):
            raw = b"\xff" + raw  # an empty body is a valid create (every field is optional)
        out.append((op, neutralise(op, payload), raw))

    collect()
    return out


async def test_bad_requests_never_crash_nor_write(nats_server: Any) -> None:
    """Seeded by a waiting run, so decisions and cancels have a real target to be wrong about."""
    async with asyncio.timeout(TIMEOUT * 3), nats_stack(nats_server, "inprocess") as s:
        await call(s, "runs.start", {"agent_id": "approver", "run_id": "ok-id", "messages": "go"})
        await until(s, "ok-id", {"waiting"})
        before = await s.store.last_seq()
        for op, payload, raw in examples(_OPS, 50):
            data = raw if raw is not None else json.dumps(payload).encode()
            status, body = await call(s, op, data)
            assert status < 500, (op, data, body)
        assert await s.store.last_seq() == before, "a bad request wrote to the log"
