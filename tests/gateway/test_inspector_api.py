"""The API behind the run inspector: `GET /v1/runs/{id}/timeline` (per-event state diffs, time
travel with `to`), `POST /v1/runs/{id}/verify` (verified replay: ok, and the first divergence when
the app changed), their typed errors, and the static pages `/ui`, `/docs`. Real nats-server, real
aiohttp app on 127.0.0.1."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentlog.cli.assembly import Server, ServerConfig
from agentlog.cli.demo import DEMO_AGENT, follow_run
from agentlog.gateway.operations.connection import ConnectionOptions
from agentlog.runtime import Runtime, ToolContext, tool

from tests.support.http_stack import TIMEOUT, body, error, open_api
from tests.support.http_write import suspended_call
from tests.support.inspector import AGENT, Stack, inspect_app, open_stack, until_status, waiting_run

pytestmark = pytest.mark.asyncio


def events(timeline: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for group in timeline["steps"] for e in group["events"]]


def diff_paths(timeline: dict[str, Any]) -> dict[str, str]:
    """Path of every per-event state op -> the event id that made it."""
    return {op["path"]: e["id"] for e in events(timeline) for op in e["state_diff"]}


async def approve(s: Stack, run: dict[str, Any]) -> dict[str, Any]:
    call = suspended_call(run)
    decision = {"target_id": call, "decision_id": "d1", "action": "resume", "result": {"approved": True}}
    await body(await s.client.post(f"/v1/runs/{run['run_id']}/inputs", json={"decisions": [decision]}), 202)
    return await until_status(s, run["run_id"], {"done"})


async def test_timeline_time_travel_and_verify(nats_server: Any) -> None:
    async with asyncio.timeout(TIMEOUT), open_stack(nats_server, make_app=inspect_app, agents=(AGENT,)) as s:
        c = s.client
        run = await waiting_run(s)
        rid = run["run_id"]
        tl = await body(await c.get(f"/v1/runs/{rid}/timeline"), 200)
        assert tl["status"] == "waiting" and tl["run_id"] == rid
        assert all("state_diff" in e for e in events(tl))
        paths = diff_paths(tl)
        assert set(paths) == {"/thread/note"}  # nothing deployed before the approval
        note_at = paths["/thread/note"]
        # an open recording (waiting) verifies up to where it ends
        waiting = await body(await c.post(f"/v1/runs/{rid}/verify"), 200)
        assert waiting["ok"] is True and waiting["commits_verified"] == waiting["commits_recorded"] > 0

        done = await approve(s, run)
        assert done["termination"]["type"] == "natural_end"
        tl = await body(await c.get(f"/v1/runs/{rid}/timeline"), 200)
        assert tl["status"] == "done"
        assert set(diff_paths(tl)) == {"/thread/note", "/thread/deployed"}
        assert [e for e in events(tl) if e["id"] == note_at][0]["state_diff"] == [
            {"op": "add", "path": "/thread/note", "value": "first"}]
        # time travel: as of the note, the run was running and nothing was deployed yet
        past = await body(await c.get(f"/v1/runs/{rid}/timeline", params={"to": note_at}), 200)
        assert past["status"] == "running" and past["state"]["thread"] == {"note": "first"}
        assert events(past)[-1]["id"] == note_at
        verified = await body(await c.post(f"/v1/runs/{rid}/verify"), 200)
        assert verified["ok"] is True and verified["status"] == "done"
        assert (verified["tools_executed"], verified["tools_from_log"]) == (0, 2) and "divergence" not in verified
        # re-executing tools (the approved deploy) is never an HTTP option
        await error(await c.post(f"/v1/runs/{rid}/verify", json={"tools_from_log": False}), 400,
                    "reexecution_refused")


@tool
async def note(text: str, ctx: ToolContext) -> str:
    """Write a note into the thread state."""
    # the changed `note` (same name, schema and description, so the model is asked the same): same
    # state edit, another result
    ctx.set("/note", text)
    return "noted twice"


def changed_tool_app(store: Any) -> Runtime:
    return inspect_app(store, note_tool=note)


def changed_prompt_app(store: Any) -> Runtime:
    return inspect_app(store, system_prompt="You are careful.")


async def test_verify_reports_the_first_divergence(nats_server: Any) -> None:
    async with asyncio.timeout(TIMEOUT):
        async with open_stack(nats_server, make_app=inspect_app, agents=(AGENT,)) as s:
            rid = (await waiting_run(s))["run_id"]
        async with open_stack(nats_server, make_app=changed_tool_app, agents=(AGENT,)) as s:
            # answered from the log, the changed tool is never run: still the recorded run
            assert (await body(await s.client.post(f"/v1/runs/{rid}/verify"), 200))["ok"] is True
        async with open_stack(nats_server, make_app=changed_prompt_app, agents=(AGENT,)) as s:
            # the model is asked something else than it was: the first inference diverges
            report = await body(await s.client.post(f"/v1/runs/{rid}/verify"), 200)
            assert report["ok"] is False and report["status"] == "diverged"
            d = report["divergence"]
            assert d["expected"]["type"] == "InferenceCompleted", d
            assert d["actual"] is None and "system prompt" in d["detail"], d


async def test_inspector_errors_are_typed(nats_server: Any) -> None:
    async with asyncio.timeout(TIMEOUT), open_stack(nats_server, make_app=inspect_app, agents=(AGENT,)) as s:
        c = s.client
        rid = (await waiting_run(s))["run_id"]
        before = await s.store.last_seq()
        await error(await c.get(f"/v1/runs/{rid}/timeline", params={"to": "x:y"}), 400, "invalid_input")
        await error(await c.get(f"/v1/runs/{rid}/timeline", params={"at": "1"}), 400, "invalid_input")
        await error(await c.get("/v1/runs/nope/timeline"), 404, "run_not_found")
        await error(await c.get("/v1/runs/a.b/timeline"), 400, "invalid_id")
        await error(await c.post("/v1/runs/nope/verify"), 404, "run_not_found")
        await error(await c.post(f"/v1/runs/{rid}/verify", json={"tools_from_log": "x"}), 400,
                    "invalid_input")
        await error(await c.post(f"/v1/runs/{rid}/verify", json={"tools_from_log": False}), 400,
                    "reexecution_refused")
        await error(await c.post(f"/v1/runs/{rid}/timeline", params={"to": "1:0"}), 405, "method_not_allowed")
        await error(await c.post(f"/v1/runs/{rid}/verify", data=b"{nope"), 400, "invalid_json")
        assert await s.store.last_seq() == before  # verifying never writes
    async with open_api(nats_server) as ro:  # a read-only gateway has no app to replay with
        await error(await ro.client.post(f"/v1/runs/{rid}/verify"), 409, "verify_unavailable")
        assert (await body(await ro.client.get(f"/v1/runs/{rid}/timeline"), 200))["run_id"] == rid


async def test_pages_are_served_from_the_package(nats_server: Any) -> None:
    async with asyncio.timeout(TIMEOUT), open_api(nats_server, tokens="secret") as api:
        c = api.client
        for path, kind in (("/ui", "text/html"), ("/docs", "text/html"),
                           ("/ui/app.js", "text/javascript"), ("/ui/docs.js", "text/javascript"),
                           ("/ui/common.js", "text/javascript"),
                           ("/ui/style.css", "text/css")):
            resp = await c.get(path)  # no token: the pages hold no data, the API asks for it
            assert resp.status == 200 and resp.content_type == kind, path
            assert "default-src 'self'" in resp.headers["Content-Security-Policy"]
        assert "/ui/app.js" in await (await c.get("/ui")).text()
        for path in ("/ui/nope.js", "/ui/..%2Fpyproject.toml", "/ui/__init__.py", "/ui/../pyproject.toml"):
            assert (await c.get(path)).status == 404, path
        await error(await c.get("/v1/runs/x/timeline"), 401)
        spec = await body(await c.get("/openapi.json"), 200)
        assert {"get"} == set(spec["paths"]["/v1/runs/{id}/timeline"])
        assert {"post"} == set(spec["paths"]["/v1/runs/{id}/verify"])


async def test_other_tenants_runs_look_unknown(nats_server: Any) -> None:
    """Timeline and verify are run reads: another tenant's run is the 404 of an unknown run."""
    def h(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    async with asyncio.timeout(TIMEOUT), open_stack(nats_server, tokens="ta:tenantA,tb:tenantB",
                                                    make_app=inspect_app, agents=(AGENT,)) as s:
        c = s.client
        started = await body(await c.post("/v1/runs", json={"agent_id": AGENT, "messages": "go",
                                                            "resource_id": "tenantA-1"}, headers=h("ta")), 202)
        rid = started["run_id"]
        assert (await body(await c.get(f"/v1/runs/{rid}/timeline", headers=h("ta")), 200))["run_id"] == rid
        unknown = await error(await c.get("/v1/runs/nope/timeline", headers=h("tb")), 404)
        assert await error(await c.get(f"/v1/runs/{rid}/timeline", headers=h("tb")), 404) == {
            **unknown, "error": unknown["error"].replace("nope", rid), "run_id": rid}
        await error(await c.post(f"/v1/runs/{rid}/verify", headers=h("tb")), 404, "run_not_found")
        await error(await c.post(f"/v1/runs/{rid}/verify"), 401)


async def test_serve_verifies_with_its_own_app(tmp_path: Path) -> None:
    """`agentlog serve` dispatches through its queue (no runtime behind the HTTP app's dispatcher):
    verify still replays with the worker's app. `/ui` is served by the real server."""
    config = ServerConfig(port=0, tokens="", connection=ConnectionOptions(data_dir=tmp_path / "d"))
    server = await Server(config).start()
    try:
        async with asyncio.timeout(TIMEOUT), aiohttp.ClientSession(server.http_url) as http:
            async with http.post("/v1/runs", json={"agent_id": DEMO_AGENT, "messages": "ship it"}) as r:
                started = await r.json()
            await follow_run(server.store, started["thread_id"], started["run_id"], 0, lambda _c: None)
            async with http.post(f"/v1/runs/{started['run_id']}/verify") as r:
                report = await r.json()
                assert r.status == 200 and report["ok"] is True and report["commits_verified"] > 0, report
            async with http.get("/ui") as r:
                assert r.status == 200 and r.content_type == "text/html"
    finally:
        await server.stop()
