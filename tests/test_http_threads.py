"""Thread routes through a real aiohttp server on a real nats-server, with the runner running."""

from __future__ import annotations

import asyncio

import pytest

from test_http_runs import follow_run
from test_http_support import (  # noqa: F401
    TIMEOUT,
    Api,
    Remote,
    api,
    body,
    error,
    recorded_thread,
    remote,
    uid,
)


async def test_create_get_list_roundtrip(api: Api) -> None:
    async with asyncio.timeout(TIMEOUT):
        created = await body(await api.client.post("/v1/threads", json={
            "thread_id": "t-1", "resource_id": "acme/x", "metadata": {"title": "hello"}}), 201)
        assert created["thread"]["thread_id"] == "t-1"
        assert created["thread"]["metadata"] == {"title": "hello"}
        assert created["thread"]["version"] == created["seq"]
        seq = created["seq"]
        got = await body(await api.client.get("/v1/threads/t-1", params={"min_seq": seq}), 200)
        assert got["resource_id"] == "acme/x" and got["version"] == seq
        listed = await body(await api.client.get("/v1/threads", params={"min_seq": seq}), 200)
        assert [t["thread_id"] for t in listed["threads"]] == ["t-1"]
        assert listed["total"] == 1


async def test_generated_id_and_conflict(api: Api) -> None:
    async with asyncio.timeout(TIMEOUT):
        a = await body(await api.client.post("/v1/threads", json={}), 201)
        assert len(a["thread"]["thread_id"]) == 32
        await error(await api.client.post("/v1/threads", json={"thread_id": a["thread"]["thread_id"]}),
                    409, "thread_exists")


@pytest.mark.parametrize("payload,field", [
    ({"thread_id": "a.b"}, "thread_id"),
    ({"thread_id": "a" * 129}, "thread_id"),
    ({"metadata": "not an object"}, "metadata"),
    ({"unknown": 1}, "unknown"),
    ({"parent_thread_id": "x y"}, "parent_thread_id"),
    ([1, 2], None),
])
async def test_create_bad_bodies_are_400_with_field(api: Api, payload: object, field: str | None) -> None:
    async with asyncio.timeout(TIMEOUT):
        data = await error(await api.client.post("/v1/threads", json=payload), 400, "invalid_input")
        if field is not None:
            assert any(d["field"] == field for d in data["detail"]), data


async def test_create_not_json_and_too_large(api: Api) -> None:
    async with asyncio.timeout(TIMEOUT):
        await error(await api.client.post("/v1/threads", data=b"{nope",
                                          headers={"Content-Type": "application/json"}), 400, "invalid_json")
        big = {"metadata": {"blob": "x" * (2 * 1024 * 1024)}}
        await error(await api.client.post("/v1/threads", json=big), 413, "too_large")


async def test_parent_must_exist(api: Api) -> None:
    async with asyncio.timeout(TIMEOUT):
        await error(await api.client.post("/v1/threads", json={"parent_thread_id": "nope"}), 404, "thread_not_found")
        await body(await api.client.post("/v1/threads", json={"thread_id": "p"}), 201)
        child = await body(await api.client.post("/v1/threads", json={"thread_id": "c", "parent_thread_id": "p"}), 201)
        await api.synced(child["seq"])
        listed = await body(await api.client.get("/v1/threads", params={"parent_thread_id": "p"}), 200)
        assert [t["thread_id"] for t in listed["threads"]] == ["c"]


async def test_get_unknown_and_bad_ids(api: Api) -> None:
    async with asyncio.timeout(TIMEOUT):
        await error(await api.client.get("/v1/threads/nope"), 404, "thread_not_found")
        for path in ("/v1/threads/a.b", "/v1/threads/a.b/messages", "/v1/threads/a.b/state",
                     "/v1/threads/a.b/events"):
            await error(await api.client.get(path), 400, "invalid_id")
        await error(await api.client.patch("/v1/threads/a.b", json={"metadata": {}}), 400, "invalid_id")
        await error(await api.client.delete("/v1/threads/a.b"), 400, "invalid_id")
        await error(await api.client.get("/v1/nothing-here"), 404, "not_found")
        await error(await api.client.put("/v1/threads"), 405, "method_not_allowed")


async def test_list_pagination_clamps_and_filters(api: Api) -> None:
    async with asyncio.timeout(TIMEOUT):
        seq = 0
        for i in range(5):
            created = await body(await api.client.post("/v1/threads", json={
                "thread_id": f"t{i}", "resource_id": "even" if i % 2 == 0 else "odd"}), 201)
            seq = created["seq"]
        q = {"min_seq": seq}
        page = await body(await api.client.get("/v1/threads", params={**q, "limit": 2, "offset": 1}), 200)
        assert [t["thread_id"] for t in page["threads"]] == ["t1", "t2"] and page["total"] == 5
        zero = await body(await api.client.get("/v1/threads", params={**q, "limit": 0}), 200)
        assert zero["limit"] == 1 and len(zero["threads"]) == 1
        huge = await body(await api.client.get("/v1/threads", params={**q, "limit": 100000}), 200)
        assert huge["limit"] == 200 and len(huge["threads"]) == 5
        past = await body(await api.client.get("/v1/threads", params={**q, "offset": 50}), 200)
        assert past["threads"] == [] and past["total"] == 5
        even = await body(await api.client.get("/v1/threads", params={**q, "resource_id": "even"}), 200)
        assert [t["thread_id"] for t in even["threads"]] == ["t0", "t2", "t4"]
        for bad in ({"limit": "ten"}, {"offset": -1}, {"min_seq": "x"}, {"bogus": "1"}, {"parent_thread_id": "a.b"}):
            await error(await api.client.get("/v1/threads", params=bad), 400, "invalid_input")


async def test_read_your_writes_with_min_seq(api: Api) -> None:
    """A write's seq passed as min_seq makes the next read see it, whatever the runner's pace."""
    async with asyncio.timeout(TIMEOUT):
        for i in range(10):
            created = await body(await api.client.post("/v1/threads", json={"thread_id": f"ryw{i}"}), 201)
            got = await body(await api.client.get(f"/v1/threads/ryw{i}", params={"min_seq": created["seq"]}), 200)
            assert got["version"] >= created["seq"]
            patched = await body(await api.client.patch(f"/v1/threads/ryw{i}", json={"metadata": {"n": i}}), 200)
            listed = await body(await api.client.get("/v1/threads", params={"min_seq": patched["seq"], "limit": 200}), 200)
            assert {"n": i} in [t["metadata"] for t in listed["threads"] if t["thread_id"] == f"ryw{i}"]


async def test_min_seq_beyond_the_log_is_400_and_a_lagging_view_is_503(nats_server) -> None:
    """A seq the log does not have is the client's mistake (400, nothing to wait for); a seq the
    log has but the views have not reached within `read_wait` is a 503 to retry."""
    from agentlog.eventlog.events import ThreadCreated
    from agentlog.gateway.http import Settings

    from test_http_support import open_api, stop_runner

    async with asyncio.timeout(TIMEOUT), open_api(nats_server, settings=Settings(read_wait=0.05)) as api:
        data = await error(await api.client.get("/v1/threads", params={"min_seq": 10**9}), 400, "min_seq_ahead")
        assert data["detail"]["min_seq"] == 10**9
        await stop_runner(api.runner)
        seq = await api.append("lagging", None, [ThreadCreated()])
        await error(await api.client.get("/v1/threads", params={"min_seq": seq}), 503, "projection_timeout")


async def test_patch_merges_and_occ(api: Api) -> None:
    async with asyncio.timeout(TIMEOUT):
        created = await body(await api.client.post("/v1/threads", json={"thread_id": "m", "metadata": {"a": 1, "b": 2}}), 201)
        patched = await body(await api.client.patch("/v1/threads/m", json={"metadata": {"a": None, "c": 3}}), 200)
        assert patched["thread"]["metadata"] == {"b": 2, "c": 3}
        assert patched["seq"] > created["seq"]
        await error(await api.client.patch("/v1/threads/m", json={"metadata": {"x": 1},
                                                                   "expected_version": created["seq"]}),
                    409, "version_conflict")
        ok = await body(await api.client.patch("/v1/threads/m", json={"metadata": {"x": 1},
                                                                       "expected_version": patched["seq"]}), 200)
        assert ok["thread"]["metadata"] == {"b": 2, "c": 3, "x": 1}
        await error(await api.client.patch("/v1/threads/m", json={}), 400, "invalid_input")
        await error(await api.client.patch("/v1/threads/nope", json={"metadata": {}}), 404, "thread_not_found")


async def test_delete_tombstones(api: Api) -> None:
    async with asyncio.timeout(TIMEOUT):
        await body(await api.client.post("/v1/threads", json={"thread_id": "d"}), 201)
        deleted = await body(await api.client.delete("/v1/threads/d", params={"reason": "gdpr"}), 200)
        assert deleted == {"thread_id": "d", "deleted": True, "seq": deleted["seq"]}
        await error(await api.client.get("/v1/threads/d", params={"min_seq": deleted["seq"]}), 404, "thread_not_found")
        listed = await body(await api.client.get("/v1/threads", params={"min_seq": deleted["seq"]}), 200)
        assert listed["threads"] == []
        await error(await api.client.delete("/v1/threads/d"), 404, "thread_not_found")
        await error(await api.client.get("/v1/threads/d/messages"), 404, "thread_not_found")
        await error(await api.client.post("/v1/threads", json={"thread_id": "d"}), 409, "thread_exists")


async def test_messages_from_the_log(api: Api) -> None:
    async with asyncio.timeout(TIMEOUT):
        await recorded_thread(api, "t1", "r1")
        await recorded_thread(api, "t1b", "r2")
        data = await body(await api.client.get("/v1/threads/t1/messages"), 200)
        assert [m["message"]["content"] for m in data["messages"]] == ["hi", "thinking", "done"]
        assert all(m["run_id"] == "r1" for m in data["messages"]) and data["next_after"] is None
        first = await body(await api.client.get("/v1/threads/t1/messages", params={"limit": 1}), 200)
        assert [m["message"]["content"] for m in first["messages"]] == ["hi"]
        rest = await body(await api.client.get("/v1/threads/t1/messages", params={"after": first["next_after"]}), 200)
        assert [m["message"]["content"] for m in rest["messages"]] == ["thinking", "done"]
        public = await body(await api.client.get("/v1/threads/t1/messages", params={"visibility": "all"}), 200)
        assert [m["message"]["content"] for m in public["messages"]] == ["hi", "done"]
        other = await body(await api.client.get("/v1/threads/t1/messages", params={"run_id": "r2"}), 200)
        assert other["messages"] == []
        await error(await api.client.get("/v1/threads/t1/messages", params={"after": "x:y"}), 400, "invalid_input")
        await error(await api.client.get("/v1/threads/t1/messages", params={"visibility": "secret"}), 400)
        await error(await api.client.get("/v1/threads/zz/messages"), 404, "thread_not_found")


async def test_state_time_travel(api: Api) -> None:
    async with asyncio.timeout(TIMEOUT):
        await recorded_thread(api, "t1", "r1")
        now = await body(await api.client.get("/v1/threads/t1/state"), 200)
        assert now["state"] == {"count": 2} and now["at"] is None
        # seq 3 is the commit [assistant message, add /count=1]: index 0 is before the patch.
        before = await body(await api.client.get("/v1/threads/t1/state", params={"at": "3:0"}), 200)
        assert before["state"] == {}
        mid = await body(await api.client.get("/v1/threads/t1/state", params={"at": "3:1"}), 200)
        assert mid["state"] == {"count": 1} and mid["at"] == "3:1"
        bare = await body(await api.client.get("/v1/threads/t1/state", params={"at": "4"}), 200)
        assert bare["state"] == {"count": 2}
        for bad in ("abc", "0:0", "1:-1", "1:2:3", ""):
            await error(await api.client.get("/v1/threads/t1/state", params={"at": bad}), 400, "invalid_input")


# -- what users run: serve, gateway + worker ------------------------------------------------------


async def test_deployed_thread_lifecycle(remote: Remote) -> None:
    """Create, read (no min_seq: at least the caller's write), patch, run on it, read its
    messages / state / view, delete: every read right after its write shows it."""
    async with asyncio.timeout(TIMEOUT):
        thread = uid("t")
        created = await body(await remote.client.post("/v1/threads", json={
            "thread_id": thread, "resource_id": "acme/x", "metadata": {"title": "hello"}}), 201)
        got = await body(await remote.client.get(f"/v1/threads/{thread}"), 200)
        assert got["version"] == created["seq"] and got["metadata"] == {"title": "hello"}
        patched = await body(await remote.client.patch(f"/v1/threads/{thread}", json={"metadata": {"n": 1}}), 200)
        got = await body(await remote.client.get(f"/v1/threads/{thread}"), 200)
        assert got["version"] == patched["seq"] and got["metadata"] == {"title": "hello", "n": 1}
        started = await body(await remote.client.post("/v1/runs", json={
            "agent_id": "open", "thread_id": thread, "messages": "state: add"}), 202)
        events = await follow_run(remote, started["run_id"])
        assert events[-1].event == "RunFinished"
        end = int(events[-1].id.split(":")[0])
        got = await body(await remote.client.get(f"/v1/threads/{thread}"), 200)
        assert got["version"] == end and got["state"] == {"last_sum": 3} and got["run_ids"] == [started["run_id"]]
        state = await body(await remote.client.get(f"/v1/threads/{thread}/state"), 200)
        assert state["state"] == {"last_sum": 3}
        messages = await body(await remote.client.get(f"/v1/threads/{thread}/messages"), 200)
        roles = [m["message"]["role"] for m in messages["messages"]]
        assert roles[0] == "user" and roles[-1] == "assistant" and "tool" in roles
        await body(await remote.client.delete(f"/v1/threads/{thread}"), 200)
        await error(await remote.client.get(f"/v1/threads/{thread}"), 404, "thread_not_found")
        await error(await remote.client.get(f"/v1/threads/{uid('t')}"), 404, "thread_not_found")
        await error(await remote.client.get("/v1/threads/a.b"), 400, "invalid_id")
