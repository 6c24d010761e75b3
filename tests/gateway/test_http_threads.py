"""Thread routes against what users run (`remote`: `agentlog serve`, and `agentlog gateway` +
`agentlog worker`, one shared deployment per topology, so every test uses its own ids); the one
check that needs the projections stopped runs in process."""

from __future__ import annotations

import asyncio

from agentlog.eventlog.ids import new_id

from tests.gateway.test_http_runs import follow_run
from tests.support.http_stack import (  # noqa: F401
    TIMEOUT,
    Remote,
    body,
    error,
    recorded_thread,
    remote,
    uid,
)


async def test_create_get_list_roundtrip(remote: Remote) -> None:
    async with asyncio.timeout(TIMEOUT):
        thread, resource = uid("t-"), f"acme/{uid()}"
        created = await body(await remote.client.post("/v1/threads", json={
            "thread_id": thread, "resource_id": resource, "metadata": {"title": "hello"}}), 201)
        assert created["thread"]["thread_id"] == thread
        assert created["thread"]["metadata"] == {"title": "hello"}
        assert created["thread"]["version"] == created["seq"]
        seq = created["seq"]
        got = await body(await remote.client.get(f"/v1/threads/{thread}", params={"min_seq": seq}), 200)
        assert got["resource_id"] == resource and got["version"] == seq
        listed = await body(await remote.client.get("/v1/threads", params={"min_seq": seq, "resource_id": resource}),
                            200)
        assert [t["thread_id"] for t in listed["threads"]] == [thread]
        assert listed["total"] == 1


async def test_generated_id_and_conflict(remote: Remote) -> None:
    async with asyncio.timeout(TIMEOUT):
        a = await body(await remote.client.post("/v1/threads", json={}), 201)
        assert len(a["thread"]["thread_id"]) == 32
        await error(await remote.client.post("/v1/threads", json={"thread_id": a["thread"]["thread_id"]}),
                    409, "thread_exists")


BAD_BODIES = [
    ({"thread_id": "a.b"}, "thread_id"),
    ({"thread_id": "a" * 129}, "thread_id"),
    ({"metadata": "not an object"}, "metadata"),
    ({"unknown": 1}, "unknown"),
    ({"parent_thread_id": "x y"}, "parent_thread_id"),
    ([1, 2], None),
]


async def test_create_bad_bodies_are_400_with_field(remote: Remote) -> None:
    async with asyncio.timeout(TIMEOUT):
        for payload, field in BAD_BODIES:
            data = await error(await remote.client.post("/v1/threads", json=payload), 400, "invalid_input")
            if field is not None:
                assert any(d["field"] == field for d in data["detail"]), data


async def test_create_not_json_and_too_large(remote: Remote) -> None:
    async with asyncio.timeout(TIMEOUT):
        await error(await remote.client.post("/v1/threads", data=b"{nope",
                                             headers={"Content-Type": "application/json"}), 400, "invalid_json")
        big = {"metadata": {"blob": "x" * (2 * 1024 * 1024)}}
        await error(await remote.client.post("/v1/threads", json=big), 413, "too_large")


async def test_parent_must_exist(remote: Remote) -> None:
    async with asyncio.timeout(TIMEOUT):
        parent, child = uid("p"), uid("c")
        await error(await remote.client.post("/v1/threads", json={"parent_thread_id": uid("p")}),
                    404, "thread_not_found")
        await body(await remote.client.post("/v1/threads", json={"thread_id": parent}), 201)
        created = await body(await remote.client.post("/v1/threads", json={
            "thread_id": child, "parent_thread_id": parent}), 201)
        listed = await body(await remote.client.get("/v1/threads", params={
            "parent_thread_id": parent, "min_seq": created["seq"]}), 200)
        assert [t["thread_id"] for t in listed["threads"]] == [child]


async def test_get_unknown_and_bad_ids(remote: Remote) -> None:
    async with asyncio.timeout(TIMEOUT):
        await error(await remote.client.get(f"/v1/threads/{uid('t')}"), 404, "thread_not_found")
        for path in ("/v1/threads/a.b", "/v1/threads/a.b/messages", "/v1/threads/a.b/state",
                     "/v1/threads/a.b/events"):
            await error(await remote.client.get(path), 400, "invalid_id")
        await error(await remote.client.patch("/v1/threads/a.b", json={"metadata": {}}), 400, "invalid_id")
        await error(await remote.client.delete("/v1/threads/a.b"), 400, "invalid_id")
        await error(await remote.client.get("/v1/nothing-here"), 404, "not_found")
        await error(await remote.client.put("/v1/threads"), 405, "method_not_allowed")


async def test_list_pagination_clamps_and_filters(remote: Remote) -> None:
    """Five threads whose ids sort after every other of the shared log (generated ids are
    time-ordered): the unfiltered listing's first five (newest first), and its last five with
    `order=asc`."""
    async with asyncio.timeout(TIMEOUT):
        base, tag, seq = f"zz{new_id()}", uid(), 0
        ids = [f"{base}{i}" for i in range(5)]
        for i, thread in enumerate(ids):
            created = await body(await remote.client.post("/v1/threads", json={
                "thread_id": thread, "resource_id": f"{tag}/{'even' if i % 2 == 0 else 'odd'}"}), 201)
            seq = created["seq"]
        q = {"min_seq": seq}
        total = (await body(await remote.client.get("/v1/threads", params=q), 200))["total"]
        page = await body(await remote.client.get("/v1/threads", params={**q, "limit": 2, "offset": 1}), 200)
        assert [t["thread_id"] for t in page["threads"]] == ids[3:1:-1] and page["total"] == total
        asc = {**q, "order": "asc"}
        page = await body(await remote.client.get("/v1/threads", params={**asc, "limit": 2, "offset": total - 4}), 200)
        assert [t["thread_id"] for t in page["threads"]] == ids[1:3] and page["total"] == total
        zero = await body(await remote.client.get("/v1/threads", params={**q, "limit": 0}), 200)
        assert zero["limit"] == 1 and len(zero["threads"]) == 1
        huge = await body(await remote.client.get("/v1/threads", params={**asc, "limit": 100000,
                                                                          "offset": total - 5}), 200)
        assert huge["limit"] == 200 and [t["thread_id"] for t in huge["threads"]] == ids
        past = await body(await remote.client.get("/v1/threads", params={**q, "offset": total + 50}), 200)
        assert past["threads"] == [] and past["total"] == total
        even = await body(await remote.client.get("/v1/threads", params={**q, "resource_id": f"{tag}/even"}), 200)
        assert [t["thread_id"] for t in even["threads"]] == ids[4::-2]
        for bad in ({"limit": "ten"}, {"offset": -1}, {"min_seq": "x"}, {"bogus": "1"}, {"parent_thread_id": "a.b"},
                    {"order": "up"}):
            await error(await remote.client.get("/v1/threads", params=bad), 400, "invalid_input")


async def test_read_your_writes_with_min_seq(remote: Remote) -> None:
    """A write's seq passed as min_seq makes the next read see it, whatever the runner's pace."""
    async with asyncio.timeout(TIMEOUT):
        for i in range(10):
            thread, resource = uid("ryw"), uid("res")
            created = await body(await remote.client.post("/v1/threads", json={
                "thread_id": thread, "resource_id": resource}), 201)
            got = await body(await remote.client.get(f"/v1/threads/{thread}", params={"min_seq": created["seq"]}),
                             200)
            assert got["version"] >= created["seq"]
            patched = await body(await remote.client.patch(f"/v1/threads/{thread}", json={"metadata": {"n": i}}),
                                 200)
            listed = await body(await remote.client.get("/v1/threads", params={
                "min_seq": patched["seq"], "resource_id": resource}), 200)
            assert [t["metadata"] for t in listed["threads"]] == [{"n": i}]


async def test_min_seq_beyond_the_log_is_400(remote: Remote) -> None:
    """A seq the log does not have is the client's mistake (400, nothing to wait for)."""
    async with asyncio.timeout(TIMEOUT):
        data = await error(await remote.client.get("/v1/threads", params={"min_seq": 10**9}), 400, "min_seq_ahead")
        assert data["detail"]["min_seq"] == 10**9


async def test_a_lagging_view_is_503(nats_server) -> None:
    """A seq the log has but the views have not reached within `read_wait` is a 503 to retry.
    In process: it needs the projection runner stopped while the gateway answers."""
    from agentlog.eventlog.events import ThreadCreated
    from agentlog.gateway.http import Settings

    from tests.support.http_stack import open_api, stop_runner

    async with asyncio.timeout(TIMEOUT), open_api(nats_server, settings=Settings(read_wait=0.05)) as api:
        await stop_runner(api.runner)
        seq = await api.append("lagging", None, [ThreadCreated()])
        await error(await api.client.get("/v1/threads", params={"min_seq": seq}), 503, "projection_timeout")


async def test_patch_merges_and_occ(remote: Remote) -> None:
    async with asyncio.timeout(TIMEOUT):
        thread = uid("m")
        created = await body(await remote.client.post("/v1/threads", json={
            "thread_id": thread, "metadata": {"a": 1, "b": 2}}), 201)
        patched = await body(await remote.client.patch(f"/v1/threads/{thread}", json={
            "metadata": {"a": None, "c": 3}}), 200)
        assert patched["thread"]["metadata"] == {"b": 2, "c": 3}
        assert patched["seq"] > created["seq"]
        await error(await remote.client.patch(f"/v1/threads/{thread}", json={
            "metadata": {"x": 1}, "expected_version": created["seq"]}), 409, "version_conflict")
        ok = await body(await remote.client.patch(f"/v1/threads/{thread}", json={
            "metadata": {"x": 1}, "expected_version": patched["seq"]}), 200)
        assert ok["thread"]["metadata"] == {"b": 2, "c": 3, "x": 1}
        await error(await remote.client.patch(f"/v1/threads/{thread}", json={}), 400, "invalid_input")
        await error(await remote.client.patch(f"/v1/threads/{uid('t')}", json={"metadata": {}}),
                    404, "thread_not_found")


async def test_delete_tombstones(remote: Remote) -> None:
    async with asyncio.timeout(TIMEOUT):
        thread, resource = uid("d"), uid("res")
        await body(await remote.client.post("/v1/threads", json={"thread_id": thread, "resource_id": resource}), 201)
        deleted = await body(await remote.client.delete(f"/v1/threads/{thread}", params={"reason": "gdpr"}), 200)
        assert deleted == {"thread_id": thread, "deleted": True, "seq": deleted["seq"]}
        await error(await remote.client.get(f"/v1/threads/{thread}", params={"min_seq": deleted["seq"]}),
                    404, "thread_not_found")
        listed = await body(await remote.client.get("/v1/threads", params={
            "min_seq": deleted["seq"], "resource_id": resource}), 200)
        assert listed["threads"] == []
        await error(await remote.client.delete(f"/v1/threads/{thread}"), 404, "thread_not_found")
        await error(await remote.client.get(f"/v1/threads/{thread}/messages"), 404, "thread_not_found")
        await error(await remote.client.post("/v1/threads", json={"thread_id": thread}), 409, "thread_exists")


async def test_messages_from_the_log(remote: Remote) -> None:
    async with asyncio.timeout(TIMEOUT):
        thread, run, other_thread, other = uid("t"), uid("r"), uid("t"), uid("r")
        await recorded_thread(remote, thread, run)
        await recorded_thread(remote, other_thread, other)
        path = f"/v1/threads/{thread}/messages"
        data = await body(await remote.client.get(path), 200)
        assert [m["message"]["content"] for m in data["messages"]] == ["hi", "thinking", "done"]
        assert all(m["run_id"] == run for m in data["messages"]) and data["next_after"] is None
        first = await body(await remote.client.get(path, params={"limit": 1}), 200)
        assert [m["message"]["content"] for m in first["messages"]] == ["hi"]
        rest = await body(await remote.client.get(path, params={"after": first["next_after"]}), 200)
        assert [m["message"]["content"] for m in rest["messages"]] == ["thinking", "done"]
        public = await body(await remote.client.get(path, params={"visibility": "all"}), 200)
        assert [m["message"]["content"] for m in public["messages"]] == ["hi", "done"]
        none = await body(await remote.client.get(path, params={"run_id": other}), 200)
        assert none["messages"] == []
        await error(await remote.client.get(path, params={"after": "x:y"}), 400, "invalid_input")
        await error(await remote.client.get(path, params={"visibility": "secret"}), 400)
        await error(await remote.client.get(f"/v1/threads/{uid('t')}/messages"), 404, "thread_not_found")


async def test_state_time_travel(remote: Remote) -> None:
    async with asyncio.timeout(TIMEOUT):
        thread, seqs = uid("t"), []
        await recorded_thread(remote, thread, uid("r"), seqs=seqs)
        path = f"/v1/threads/{thread}/state"
        now = await body(await remote.client.get(path), 200)
        assert now["state"] == {"count": 2} and now["at"] is None
        # the third commit is [assistant message, add /count=1]: index 0 is before the patch.
        before = await body(await remote.client.get(path, params={"at": f"{seqs[2]}:0"}), 200)
        assert before["state"] == {}
        mid = await body(await remote.client.get(path, params={"at": f"{seqs[2]}:1"}), 200)
        assert mid["state"] == {"count": 1} and mid["at"] == f"{seqs[2]}:1"
        bare = await body(await remote.client.get(path, params={"at": str(seqs[3])}), 200)
        assert bare["state"] == {"count": 2}
        for bad in ("abc", "0:0", "1:-1", "1:2:3", ""):
            await error(await remote.client.get(path, params={"at": bad}), 400, "invalid_input")


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
