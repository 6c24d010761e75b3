"""Plugins, tools and policies as users reach them: one app (tests/apps/plugins_app.py, built from a
configuration) under `agentlog serve` and under `agentlog gateway` + `agentlog worker`, driven
over HTTP, each run then verified with `agentlog replay RUN --verify`: a run's tool policy in
the start request (and its refusal), deferred tools found by tool_search, an OpenAPI tool behind a
model whose circuit breaker opens, a plugin's tool, config section and input filter with a
reminder, the configuration's default max_rounds, and the gateway's concurrent-request limit
(503 `overloaded` with Retry-After, never for health and metrics)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from typer.testing import CliRunner

from agentlog.cli.core import app as cli_app
from agentlog.cli.demo import follow_run
from agentlog.eventlog.jetstream.store import JetStreamEventStore

from tests.conftest import SessionDeployments
from tests.fakes.fake_openapi import FakePetStore
from tests.support.topology import TOPOLOGIES, Deployment

LIMIT = 60
#: The gateway's limit on concurrent HTTP requests in these deployments.
MAX_REQUESTS = 4

pytestmark = pytest.mark.usefixtures("keep_structlog_config")


@pytest.fixture(scope="session")
def pet_store() -> Iterator[FakePetStore]:
    with FakePetStore().in_thread() as api:
        yield api


@pytest.fixture(params=TOPOLOGIES)
def deployment(request: pytest.FixtureRequest, session_deployments: SessionDeployments,
               pet_store: FakePetStore) -> Deployment:
    return session_deployments.get("plugins", request.param, app="tests.apps.plugins_app:app", env={
        "PLUGINS_APP_OPENAPI_URL": pet_store.spec_url, "AGENTLOG_MAX_CONCURRENT_REQUESTS": str(MAX_REQUESTS),
        "AGENTLOG_SSE_HEARTBEAT": "1"})


@contextlib.asynccontextmanager
async def client(deployment: Deployment) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(deployment.http_url) as http:
        yield http


async def start(http: aiohttp.ClientSession, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post("/v1/runs", json=body) as r:
        assert r.status == 202, await r.text()
        return dict(await r.json())


async def finished(deployment: Deployment, started: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """Wait (on the log) for the run to end; its view (read at least that far) and its events."""
    store = await JetStreamEventStore.connect(deployment.nats_url)
    try:
        async with asyncio.timeout(LIMIT):
            seq, _ = await follow_run(store, started["thread_id"], started["run_id"], 0, lambda _c: None)
        events = [e async for sc in store.read_run(started["run_id"]) for e in sc.commit.events]
    finally:
        await store.close()
    async with client(deployment) as http, asyncio.timeout(LIMIT):
        while True:
            async with http.get(f"/v1/runs/{started['run_id']}", params={"min_seq": str(seq)}) as r:
                if r.status == 503:  # the views catching up on a loaded machine: ask again
                    continue
                assert r.status == 200, await r.text()
                return dict(await r.json()), events


async def verify(deployment: Deployment, run_id: str, monkeypatch: pytest.MonkeyPatch, pet_store: FakePetStore) -> None:
    """`agentlog replay RUN --verify` with the deployment's app, as a user runs it."""
    monkeypatch.setenv("PLUGINS_APP_OPENAPI_URL", pet_store.spec_url)
    result = await asyncio.to_thread(CliRunner().invoke, cli_app, [
        "replay", run_id, "--verify", "--app", "tests.apps.plugins_app:app", "--nats", deployment.nats_url,
        "--timeout", "10"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1].startswith(f"verified run {run_id}: "), result.output


def types(events: list[Any]) -> list[str]:
    return [type(e).__name__ for e in events]


async def test_tool_policy_in_the_start_request_narrows_the_runs_tools(
        deployment: Deployment, monkeypatch: pytest.MonkeyPatch, pet_store: FakePetStore) -> None:
    async with client(deployment) as http:
        started = await start(http, {"agent_id": "files", "messages": "read a.txt",
                                     "overrides": {"excluded_tools": ["delete_*"]}})
    view, events = await finished(deployment, started)
    assert view["termination"]["type"] == "natural_end", deployment.outputs()
    calls = sorted((c["status"], c["result"]) for c in view["calls"].values())
    assert calls == [("failed", {"error": "tool 'delete_file' is not allowed in this run"}),
                     ("succeeded", "hello world")]
    (read,) = [c for c in view["calls"].values() if c["name"] == "read_file"]
    assert read["details"] == {"bytes": 11, "path": "a.txt"}  # kept from the model, shown to clients
    follow = [e.message.content for e in events if type(e).__name__ == "MessageAppended" and e.message.role == "user"]
    assert follow[-1] == "(The user attached a.txt.)"
    await verify(deployment, started["run_id"], monkeypatch, pet_store)


@pytest.mark.parametrize("overrides, field", [
    ({"allowed_tools": ["read_fil"]}, "allowed_tools"),  # names none of the agent's tools
    ({"excluded_tools": ["x"], "model": "looping-model"}, "model"),
])
async def test_tool_policy_outside_the_agents_policy_is_a_400(deployment: Deployment, overrides: dict[str, Any],
                                                              field: str) -> None:
    async with client(deployment) as http:
        async with http.post("/v1/runs", json={"agent_id": "files", "messages": "hi", "overrides": overrides}) as r:
            assert r.status == 400, await r.text()
            body = await r.json()
        assert body["code"] == "override_not_allowed" and field in body["error"]
        async with http.post("/v1/runs", json={"agent_id": "catalog", "messages": "hi",  # the agent allows none
                                               "overrides": {"excluded_tools": ["gh_issue_1"]}}) as r:
            assert r.status == 400 and (await r.json())["code"] == "override_not_allowed"


async def test_deferred_tools_found_with_tool_search(deployment: Deployment, monkeypatch: pytest.MonkeyPatch,
                                                     pet_store: FakePetStore) -> None:
    async with client(deployment) as http:
        async with http.get("/v1/agents") as r:
            agents = {a["id"]: a for a in (await r.json())["agents"]}
        names = [t["name"] for t in agents["catalog"]["tools"]]
        assert names[-1] == "tool_search" and len(names) == 13
        started = await start(http, {"agent_id": "catalog", "messages": "bug 7?"})
    view, events = await finished(deployment, started)
    assert view["termination"]["type"] == "natural_end", deployment.outputs()
    results = {c["name"]: c for c in view["calls"].values()}
    assert [t["name"] for t in results["tool_search"]["result"]["tools"]] == ["gh_issue_7"]
    assert results["gh_issue_7"]["result"] == "ticket 7: bug"
    patched = [e for e in events if type(e).__name__ == "StatePatched"]
    assert [p.ops for p in patched] == [[{"op": "add", "path": "/agentlog.deferred_tools", "value": ["gh_issue_7"]}]]
    await verify(deployment, started["run_id"], monkeypatch, pet_store)


async def test_openapi_tool_behind_a_model_whose_circuit_breaker_opens(
        deployment: Deployment, monkeypatch: pytest.MonkeyPatch, pet_store: FakePetStore) -> None:
    async with client(deployment) as http:
        async with http.get("/v1/agents") as r:
            pets = next(a for a in (await r.json())["agents"] if a["id"] == "pets")
        (list_pets, get_pet) = pets["tools"]
        assert (get_pet["name"], get_pet["category"]) == ("pets__getPet", "openapi:pets")
        assert get_pet["parameters"]["required"] == ["petId"] and list_pets["name"] == "pets__listPets"
        first = await start(http, {"agent_id": "pets", "messages": "who is pet 2?"})
        view, events = await finished(deployment, first)
        second = await start(http, {"agent_id": "pets", "messages": "and now?"})
        view2, events2 = await finished(deployment, second)
    assert view["termination"]["type"] == view2["termination"]["type"] == "natural_end", deployment.outputs()
    (call,) = view["calls"].values()
    assert call["result"] == {"id": 2, "name": "Tom", "tag": "cat"} and call["details"]["status"] == 200
    opened = [(e.model, e.state, e.failures) for e in events if type(e).__name__ == "CircuitBreakerChanged"]
    assert opened == [("flaky", "open", 2)]  # two failures, then the fallback answered
    assert "CircuitBreakerChanged" not in types(events2)  # skipped at once: no change to record
    inferences = [e.model for e in events2 if type(e).__name__ == "InferenceCompleted"]
    assert inferences and set(inferences) == {"pets-model"}
    for run in (first, second):
        await verify(deployment, run["run_id"], monkeypatch, pet_store)


async def test_plugin_tool_config_input_filter_and_reminder(deployment: Deployment, monkeypatch: pytest.MonkeyPatch,
                                                            pet_store: FakePetStore) -> None:
    async with client(deployment) as http:
        async with http.get("/v1/agents") as r:
            plugged = next(a for a in (await r.json())["agents"] if a["id"] == "plugged")
        assert [(t["name"], t.get("label")) for t in plugged["tools"]] == [("stamp", "Stamp a text")]
        started = await start(http, {"agent_id": "plugged", "messages": "stamp it"})
        refused = await start(http, {"agent_id": "plugged", "messages": "my secret is 42"})
    view, events = await finished(deployment, started)
    assert view["termination"]["type"] == "natural_end", deployment.outputs()
    (call,) = view["calls"].values()
    assert call["result"] == "[approved] ok"  # the prefix from the agent's `stamp` section
    reminders = [(e.key, e.text) for e in events if type(e).__name__ == "ContextMessageSet"]
    assert reminders == [("reminder:stamped", "Stamped texts are final.")]
    blocked, blocked_events = await finished(deployment, refused)
    assert (blocked["termination"]["type"], blocked["termination"]["code"]) == ("blocked", "input_rejected")
    assert "InferenceCompleted" not in types(blocked_events) and "InputFiltered" in types(blocked_events)
    for run in (started, refused):
        await verify(deployment, run["run_id"], monkeypatch, pet_store)


async def test_max_rounds_default_of_the_configuration_stops_a_looping_model(
        deployment: Deployment, monkeypatch: pytest.MonkeyPatch, pet_store: FakePetStore) -> None:
    async with client(deployment) as http:
        started = await start(http, {"agent_id": "looping", "messages": "go"})
    view, _ = await finished(deployment, started)
    assert (view["termination"]["type"], view["termination"]["code"], view["steps"]) == ("stopped", "max_rounds", 3)
    await verify(deployment, started["run_id"], monkeypatch, pet_store)


async def test_concurrency_limit_answers_503_overloaded_never_for_health_and_metrics(deployment: Deployment) -> None:
    async with client(deployment) as http:
        async with http.post("/v1/threads", json={}) as r:
            assert r.status == 201, await r.text()
            thread_id = (await r.json())["thread"]["thread_id"]
        streams = []
        try:
            for _ in range(MAX_REQUESTS):  # each open stream holds a place until it is closed
                resp = await http.get(f"/v1/threads/{thread_id}/events", params={"follow": "true"})
                assert resp.status == 200, await resp.text()
                streams.append(resp)
            async with http.get("/v1/runs") as r:
                assert r.status == 503 and r.headers["Retry-After"] == "1"
                body = await r.json()
            assert body["code"] == "overloaded" and str(MAX_REQUESTS) in body["error"]
            for path in ("/health", "/health/live", "/metrics"):
                async with http.get(path) as r:
                    assert r.status == 200, (path, await r.text())
        finally:
            for resp in streams:
                resp.close()
        # the server notices the closed streams (at its next heartbeat): a client retries after Retry-After
        async with asyncio.timeout(LIMIT):
            while True:
                async with http.get("/v1/runs") as r:
                    if r.status != 503:
                        assert r.status == 200, await r.text()
                        break
                    await asyncio.sleep(float(r.headers["Retry-After"]))  # the client's backoff, as told
