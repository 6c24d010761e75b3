"""Typed state as users reach it: one scenario per seed example of the state books (Tirea 1.5-1.7,
awaken 1.1-1.7), each run through `agentlog serve` (one shared deployment of
tests/apps/state_app.py) and proved by `agentlog replay --verify`; and what users read (thread
and run state, the profile API, its time travel, tenants, the client and the CLI) against both
topologies (`agentlog serve`, `agentlog gateway` + `agentlog worker`).

Synchronisation: `runs.wait` (the log); parallel calls finish in an order the app fixes (a gate
in the worker), never by timing. Each test uses threads of its own."""

from __future__ import annotations

import json
import uuid
from typing import Any

import aiohttp
import pytest
from typer.testing import CliRunner

from agentlog.cli.core import app as cli
from agentlog.client import ApiError, SyncClient, get_sync_client

from tests.conftest import SessionDeployments
from tests.support.topology import TOPOLOGIES, Deployment

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("keep_structlog_config")
APP = "tests.apps.state_app:app"
WAIT = 90
TOKENS = "admin, tq:tenantQ"


@pytest.fixture
def serve(session_deployments: SessionDeployments) -> Deployment:
    return session_deployments.get("state", "serve", app=APP, tokens=TOKENS)


@pytest.fixture(params=TOPOLOGIES)
def deployment(request: pytest.FixtureRequest, session_deployments: SessionDeployments) -> Deployment:
    return session_deployments.get("state", request.param, app=APP, tokens=TOKENS)


def client_of(d: Deployment, token: str = "admin") -> SyncClient:
    return get_sync_client(d.http_url, token=token)


def thread_id(name: str) -> str:
    return f"t-{name}-{uuid.uuid4().hex[:8]}"


def run(client: SyncClient, text: str, thread: str, resource_id: str | None = None) -> dict[str, Any]:
    started = client.runs.create("stateful", text, thread_id=thread, resource_id=resource_id)
    done = client.runs.wait(started["run_id"], timeout=WAIT)
    assert done["status"] == "done", done
    return done


def events(client: SyncClient, thread: str) -> list[Any]:
    return list(client.threads.stream(thread))


def of_type(evs: list[Any], kind: str) -> list[dict[str, Any]]:
    return [e.event for e in evs if e.type == kind]


def results(evs: list[Any]) -> dict[str, Any]:
    return {e["call_id"]: e.get("result") for e in of_type(evs, "ToolCallCompleted")}


def verify(d: Deployment, run_id: str) -> None:
    result = runner.invoke(cli, ["replay", run_id, "--verify", "--app", APP, "--nats", d.nats_url, "--timeout", "20"])
    assert result.exit_code == 0, result.output


# -- the seed examples, through `agentlog serve` ---------------------------------------------------


def test_state_key_counter_reducer_scenario(serve: Deployment) -> None:
    """Tirea 1.5: `Counter {value, label}` with actions Increment(n) / Rename(name)."""
    thread = thread_id("counter")
    with client_of(serve) as client:
        done = run(client, "counter", thread)
        evs = events(client, thread)
        written = [(e["key"], e["action"], e["ops"]) for e in of_type(evs, "StateWritten")]
        assert written == [
            ("counter", {"kind": "increment", "n": 2}, [{"op": "set", "path": "/counter", "value": {"value": 2, "label": ""}}]),
            ("counter", {"kind": "rename", "name": "clicks"}, [{"op": "set", "path": "/counter/label", "value": "clicks"}]),
        ]
        assert client.threads.state(thread)["state"] == {"counter": {"value": 2, "label": "clicks"}}
    verify(serve, done["run_id"])


def test_state_scope_thread_run_tool_call_scenario(serve: Deployment) -> None:
    """Tirea 1.6 and awaken 1.2: a run key starts empty in each run, a thread key persists,
    a tool_call key is each call's own; run and call cleanup are events in the log."""
    thread = thread_id("scopes")
    with client_of(serve) as client:
        first = run(client, "scopes", thread)
        second = run(client, "scopes", thread)
        evs = events(client, thread)
        seen = list(results(evs).values())
        # each run's two parallel visits read the snapshot of their round: run_visits 0 in both
        # runs, thread_visits 0 then 2
        assert [(r["run_visits"], r["thread_visits"]) for r in seen] == [(0, 0), (0, 0), (0, 2), (0, 2)]
        assert all(len(r["scratch"]) == 1 for r in seen), "a tool_call key is the call's own"
        cleared = [(e["scope"], e["keys"]) for e in of_type(evs, "StateCleared")]
        assert cleared.count(("run", ["run_visits"])) == 2 and cleared.count(("tool_call", ["scratch"])) == 4
        assert client.threads.state(thread)["state"] == {"thread_visits": 4}
        view = client.runs.get(second["run_id"])
        assert view["state"] == {} and all(c["state"] == {} for c in view["calls"].values())
    verify(serve, first["run_id"])
    verify(serve, second["run_id"])


def test_lattice_merge_scenario(serve: Deployment) -> None:
    """Tirea 1.7: `permission_policy.allowed_tools` merged by lattice join from parallel calls
    (a grow-only set, a G-counter of grants, a max register): no conflict, every write lands."""
    thread = thread_id("lattice")
    with client_of(serve) as client:
        done = run(client, "lattice", thread)
        evs = events(client, thread)
        assert of_type(evs, "StateConflicted") == []
        policy = client.threads.state(thread)["state"]["permission_policy"]
        assert policy["allowed_tools"] == ["read", "search"] and policy["longest"] == 6
        assert sorted(policy["grants"].values()) == [1, 1, 1] and len(policy["grants"]) == 3
        ops_ = [op for e in of_type(evs, "StateWritten") for op in e["ops"]]
        assert {op["op"] for op in ops_} == {"lattice"} and {op["kind"] for op in ops_} == {"g_set", "g_counter", "max"}
    verify(serve, done["run_id"])


def test_state_key_counter_and_audit_log_scenario(serve: Deployment) -> None:
    """awaken 1.1: a commutative counter (`value += update`) and an exclusive audit log
    (`value = update`, replacing the whole value)."""
    thread = thread_id("greet")
    with client_of(serve) as client:
        done = run(client, "greet", thread)
        evs = events(client, thread)
        assert list(results(evs).values())[-1] == {"greet_count": 2, "audit_log": ["greeted ann", "greeted bob"]}
        merges = {e["key"]: e.get("merge", "exclusive") for e in of_type(evs, "StateWritten")}  # defaults are omitted
        assert merges == {"greet_count": "commutative", "audit_log": "exclusive"}
        counts = [e["ops"] for e in of_type(evs, "StateWritten") if e["key"] == "greet_count"]
        assert counts == [[{"op": "increment", "path": "/greet_count", "value": 1}]] * 2
    verify(serve, done["run_id"])


def test_merge_strategy_exclusive_vs_commutative_scenario(serve: Deployment) -> None:
    """awaken 1.3: parallel calls; two touching the exclusive `notes` conflict (the later one
    fails, recorded, its writes dropped), the commutative count of the others concatenates."""
    thread = thread_id("exclusive")
    with client_of(serve) as client:
        done = run(client, "exclusive", thread)
        evs = events(client, thread)
        conflicts = of_type(evs, "StateConflicted")
        assert [(c["key"], c["resolution"]) for c in conflicts] == [("notes", "failed")]
        outcome = {e["call_id"]: e["outcome"] for e in of_type(evs, "ToolCallCompleted")}
        assert sorted(outcome.values()) == ["failed", "succeeded", "succeeded"]
        assert outcome[conflicts[0]["call_id"]] == "failed"
        assert client.threads.state(thread)["state"] == {"notes": ["a"], "greet_count": 2}
    verify(serve, done["run_id"])


def test_state_key_snapshot_reads_scenario(serve: Deployment) -> None:
    """awaken 1.4: a call reads the snapshot its round started with (not a parallel call's
    write); the next round's snapshot has it."""
    thread = thread_id("snapshot")
    with client_of(serve) as client:
        done = run(client, "snapshot", thread)
        peeks = [r for r in results(events(client, thread)).values() if isinstance(r, dict)]
        assert [p["notes"] for p in peeks] == [[], ["x"]]
    verify(serve, done["run_id"])


def test_state_key_options_persistent_scenario(serve: Deployment) -> None:
    """awaken 1.5 `StateKeyOptions.persistent`: a non-persistent key lives for the run that
    wrote it (`StateCleared` at its end); the next run reads its default."""
    thread = thread_id("draft")
    with client_of(serve) as client:
        first = run(client, "draft", thread)
        second = run(client, "peek", thread)
        evs = events(client, thread)
        peeks = [r for r in results(evs).values() if isinstance(r, dict)]
        assert [p["draft"] for p in peeks] == ["d1", ""]
        assert ("thread", ["draft"]) in [(e["scope"], e["keys"]) for e in of_type(evs, "StateCleared")]
        assert of_type(evs, "StateWritten")[0]["transient"] is True
        assert "draft" not in client.threads.state(thread)["state"]
    verify(serve, first["run_id"])
    verify(serve, second["run_id"])


def test_merge_strategy_mutation_batch_lifecycle_scenario(serve: Deployment) -> None:
    """awaken 1.6 / 1.7: the hooks of a phase read one snapshot and return MutationBatches;
    an exclusive overlap falls back to sequential (the later hook runs again on the state the
    earlier made), commutative writes concatenate, the merged batch commits at once."""
    thread = thread_id("hooks")
    with client_of(serve) as client:
        done = run(client, "hooks", thread)
        evs = events(client, thread)
        conflict = of_type(evs, "StateConflicted")
        assert [(c["writer"], c["with_writer"], c["resolution"]) for c in conflict] == [
            ("plugin:title_b", "plugin:title_a", "sequential")]
        assert client.threads.state(thread)["state"] == {"hook_title": "AB", "hook_hits": 12}
        # the merged batch (title_a and hit_counter) and the re-run commit together with the inference
        commits = {e.seq for e in evs if e.type in ("StateWritten", "StateConflicted", "InferenceCompleted")}
        assert len(commits) == 1
    verify(serve, done["run_id"])


# -- what users read: both topologies ------------------------------------------------------------


def test_profile_state_shared_across_threads_with_time_travel(deployment: Deployment) -> None:
    resource = f"tenantQ-user/{uuid.uuid4().hex[:6]}"  # any string: the API path takes it encoded
    with client_of(deployment) as client:
        first = run(client, "remember drink tea with lemon", thread_id("mem1"), resource)
        run(client, "remember food pasta", thread_id("mem2"), resource)
        third = run(client, "recall drink", thread_id("mem3"), resource)
        recalled = results(events(client, third["thread_id"]))
        assert list(recalled.values()) == [{"facts": {"drink": "tea with lemon"}, "count": 1}]
        now = client.profiles.state(resource, history=True)
        assert set(now["state"]["memory"]["facts"]) == {"drink", "food"} and now["writes"] == 2
        first_seq = now["history"][0]["seq"]
        assert now["history"][0]["thread_id"] == first["thread_id"]
        then = client.profiles.state(resource, at=first_seq)
        assert set(then["state"]["memory"]["facts"]) == {"drink"} and then["version"] == first_seq
        # a tenant sees its own profiles only; others are 404, as threads are
        with client_of(deployment, "tq") as tenant:
            assert tenant.profiles.state(resource)["version"] == now["version"]
            with pytest.raises(ApiError) as err:
                tenant.profiles.state("someone-else")
        assert err.value.status == 404 and err.value.code == "profile_not_found"
        with pytest.raises(ApiError) as bad:
            client.profiles.state(resource, at=0)
        assert bad.value.status == 400
    verify(deployment, first["run_id"])
    # the CLI reads the same profile from its stream
    out = runner.invoke(cli, ["profile", "show", resource, "--json", "--nats", deployment.nats_url])
    assert out.exit_code == 0, out.output
    assert set(json.loads(out.output)["state"]["memory"]["facts"]) == {"drink", "food"}


async def test_profile_state_over_nats_request_reply(deployment: Deployment) -> None:
    import nats

    resource = f"user-{uuid.uuid4().hex[:6]}"
    with client_of(deployment) as client:
        run(client, "remember color blue", thread_id("memnats"), resource)
    nc = await nats.connect(deployment.nats_url)
    try:
        reply = await nc.request("agentlog.api.profiles.get", json.dumps({"profile_id": resource}).encode(),
                                 timeout=10, headers={"Authorization": "Bearer admin"})
        body = json.loads(reply.data)
        assert body["state"]["memory"]["facts"]["color"]["text"] == "blue"
    finally:
        await nc.close()


async def test_state_scope_run_state_readable_while_the_run_goes(deployment: Deployment) -> None:
    """The run view carries its run-scope state while the run goes (time travel shows it), and
    is empty once it ended; thread state over HTTP is the typed keys' JSON."""
    thread = thread_id("runstate")
    with client_of(deployment) as client:
        done = run(client, "scopes", thread)
        evs = events(client, thread)
        cleared = next(e for e in evs if e.type == "StateCleared" and e.event["scope"] == "run")
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer admin"}) as http:
            async with http.get(f"{deployment.http_url}/v1/threads/{thread}/state",
                                params={"at": f"{cleared.seq}:{int(cleared.id.split(':')[1]) - 1}"}) as r:
                assert r.status == 200
                assert (await r.json())["state"] == {"thread_visits": 2}
        assert client.runs.get(done["run_id"])["state"] == {}
