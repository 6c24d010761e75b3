"""Counterfactual branches of a run (`POST /v1/runs/{id}/counterfactual`, NATS
`agentlog.api.runs.counterfactual`, `client.runs.counterfactual`) and the diff of two branches
(`GET /v1/threads/{a}/diff/{b}`, NATS `threads.diff`, `agentlog thread diff`), against what users
run: `agentlog serve`, and `agentlog gateway` + `agentlog worker` (the shared `protocol_deployment`
of tests/apps/protocol_app.py: agent `sequential` asks a human before `echo`, with the permission
ticket's approval schema).

Synchronisation: `runs.wait` follows the log; no test waits on time.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import nats
import pytest
from typer.testing import CliRunner

from agentlog.cli.core import app
from agentlog.client import ApiError, SyncClient, get_sync_client

from tests.gateway.test_inspector_browser import CHROMIUM, chromium_page
from tests.support.http_stack import uid
from tests.support.topology import Deployment

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("keep_structlog_config")
WAIT = 90


@pytest.fixture
def client(protocol_deployment: Deployment) -> Iterator[SyncClient]:
    with get_sync_client(protocol_deployment.http_url) as value:
        yield value


def decided_run(client: SyncClient, approved: bool = True) -> tuple[str, str, str]:
    """A finished run of `sequential` whose `echo` call a human approved (or denied): (thread, run, call)."""
    run = client.runs.create("sequential", "approval: deploy it")
    waiting = client.runs.wait(run["run_id"], timeout=WAIT)
    assert waiting["status"] == "waiting"
    call = next(iter(waiting["calls"]))
    client.runs.inputs(run["run_id"], decisions=[{"target_id": call, "decision_id": uid("d"), "action": "resume",
                                                  "result": {"approved": approved}}])
    assert client.runs.wait(run["run_id"], timeout=WAIT)["status"] == "done"
    return run["thread_id"], run["run_id"], call


def tool_results(client: SyncClient, thread: str) -> list[str]:
    return [m["message"]["content"] for m in client.threads.messages(thread)["messages"] if m["message"]["role"] == "tool"]


def verify(d: Deployment, run_id: str) -> Any:
    return runner.invoke(app, ["replay", run_id, "--verify", "--app", "tests.apps.protocol_app:app", "--nats",
                               d.nats_url, "--timeout", "10"])


def test_counterfactual_denied_instead_of_approved_runs_on_a_new_thread(client: SyncClient) -> None:
    """The approved run, branched at its decision with a denial: a new thread and run that took
    the denial and went on (the tool never ran there), the source untouched."""
    thread, run_id, call = decided_run(client)
    before = client.threads.messages(thread)["messages"]
    branch = client.runs.counterfactual(run_id, call, result={"approved": False}, reason="what if denied")
    assert branch["forked_from"]["thread_id"] == thread and branch["forked_from"]["run_id"] == run_id
    assert branch["forked_from"]["call_id"] == call and branch["run_id"] != run_id
    done = client.runs.wait(branch["run_id"], timeout=WAIT)
    assert done["status"] == "done" and done["thread_id"] == branch["thread_id"]
    assert done["calls"][call]["status"] != client.runs.get(run_id)["calls"][call]["status"]
    assert tool_results(client, thread) == ["deploy"]
    assert tool_results(client, branch["thread_id"]) != ["deploy"]
    assert client.threads.messages(thread)["messages"] == before


def test_counterfactual_branch_replays_verified(client: SyncClient, protocol_deployment: Deployment) -> None:
    """`replay --verify` of the branch's run passes from the branch's log alone: its start, the
    commits it shares with the source run, then the new decision and what followed."""
    _thread, run_id, call = decided_run(client)
    branch = client.runs.counterfactual(run_id, call, result={"approved": False})
    assert client.runs.wait(branch["run_id"], timeout=WAIT)["status"] == "done"
    result = verify(protocol_deployment, branch["run_id"])
    assert result.exit_code == 0, result.output
    assert f"verified run {branch['run_id']}" in result.stdout


def test_counterfactual_lineage_links_both_branches(client: SyncClient) -> None:
    """The branch names its source thread, run and call (`forked_from`) and its parent thread;
    the source names the branch among its `children`."""
    thread, run_id, call = decided_run(client)
    branch = client.runs.counterfactual(run_id, call, result={"approved": False}, new_thread_id=uid("cf"))
    view = client.threads.get(branch["thread_id"], min_seq=branch["seq"])
    assert view["forked_from"] == branch["forked_from"]
    assert view["forked_from"]["run_id"] == run_id and view["forked_from"]["call_id"] == call
    assert view["parent_thread_id"] == thread and view["run_ids"] == [branch["run_id"]]
    source = client.threads.get(thread, min_seq=branch["seq"])
    assert branch["thread_id"] in source["children"] and source.get("forked_from") is None
    assert view["children"] == []


def test_the_same_branch_request_again_answers_the_same_branch(client: SyncClient) -> None:
    """The request sent again with its `new_thread_id` (a client that lost the answer): the same
    branch and run, nothing written twice, and the branch's run goes on once."""
    _thread, run_id, call = decided_run(client)
    body = {"at": {"decision": call}, "decision": {"action": "resume", "result": {"approved": False}},
            "new_thread_id": uid("again")}
    first = _post(client, run_id, body)
    assert client.runs.wait(first["run_id"], timeout=WAIT)["status"] == "done"
    before = client.threads.messages(first["thread_id"])["messages"]
    assert _post(client, run_id, body) == first
    assert client.runs.wait(first["run_id"], timeout=WAIT)["status"] == "done"
    assert client.threads.get(first["thread_id"])["run_ids"] == [first["run_id"]]
    assert client.threads.messages(first["thread_id"])["messages"] == before


def _post(client: SyncClient, run_id: str, body: dict[str, Any]) -> Any:
    return client.call(client.aio.request("POST", f"/v1/runs/{run_id}/counterfactual", json_body=body))


def test_counterfactual_bad_input_is_a_typed_4xx_and_writes_nothing(client: SyncClient) -> None:
    """An unknown run or call, a call that never waited, a decision the ticket's response schema
    refuses, a malformed body, the thread id of another branch: each a typed 4xx, and no thread
    is written."""
    _thread, run_id, call = decided_run(client)
    plain = client.runs.create("sequential", "state: add")
    done = client.runs.wait(plain["run_id"], timeout=WAIT)
    ran = next(iter(done["calls"]))
    taken = client.runs.counterfactual(run_id, call, result={"approved": False})
    deny = {"action": "resume", "result": {"approved": False}}
    cases: list[tuple[str, dict[str, Any], int, str]] = [
        (uid("r"), {"at": {"decision": call}, "decision": deny}, 404, "run_not_found"),
        (run_id, {"at": {"decision": "no-such-call"}, "decision": deny}, 404, "unknown_call"),
        (plain["run_id"], {"at": {"decision": ran}, "decision": deny}, 409, "call_not_suspended"),
        (run_id, {"at": {"decision": call}, "decision": {"action": "resume", "result": {"approved": "yes"}}},
         400, "invalid_decision"),
        (run_id, {"at": {"decision": call}, "decision": {"action": "resume"}}, 400, "invalid_decision"),
        (run_id, {"at": {"decision": call}, "decision": {"action": "maybe"}}, 400, "invalid_input"),
        (run_id, {"at": {"step": 1}, "decision": deny}, 400, "invalid_input"),
        (run_id, {"at": {"decision": call}, "decision": {**deny, "reason": "another branch"},
                  "new_thread_id": taken["thread_id"]}, 409, "thread_exists"),
    ]
    for target, body, status, code in cases:
        new_thread = body.setdefault("new_thread_id", uid("never"))
        with pytest.raises(ApiError) as raised:
            _post(client, target, body)
        assert (raised.value.status, raised.value.code) == (status, code), (body, raised.value)
        if new_thread != taken["thread_id"]:
            with pytest.raises(ApiError) as missing:
                client.threads.get(new_thread)
            assert missing.value.status == 404


def test_counterfactual_diff_shows_the_shared_prefix_then_the_decision(client: SyncClient) -> None:
    """`GET /v1/threads/{a}/diff/{b}`: the run's events up to the decision are the common prefix;
    the first aligned row after it is the two decisions, side by side; either order works."""
    thread, run_id, call = decided_run(client)
    branch = client.runs.counterfactual(run_id, call, result={"approved": False})
    client.runs.wait(branch["run_id"], timeout=WAIT)
    got = client.threads.diff(thread, branch["thread_id"])
    assert got["a"] == thread and got["b"] == branch["thread_id"]
    assert got["common"] > 3 and got["rows"]
    first = got["rows"][0]
    assert first["kind"] == "changed" and first["a"]["type"] == first["b"]["type"] == "ToolCallDecided"
    assert first["a"]["event"]["decision"]["result"] == {"approved": True}
    assert first["b"]["event"]["decision"]["result"] == {"approved": False}
    assert first["a"]["summary"] and first["b"]["id"].count(":") == 1
    mirrored = client.threads.diff(branch["thread_id"], thread)
    assert mirrored["common"] == got["common"] and mirrored["rows"][0]["a"]["event"] == first["b"]["event"]
    same = client.threads.diff(thread, thread)
    assert same["rows"] == [] and same["common"] == same["a_events"]


async def test_counterfactual_over_nats(protocol_deployment: Deployment) -> None:
    """The NATS doors: `runs.counterfactual` and `threads.diff`, with the HTTP bodies and codes."""
    d = protocol_deployment
    with get_sync_client(d.http_url) as sync:
        thread, run_id, call = await asyncio.to_thread(decided_run, sync)
    nc = await nats.connect(d.nats_url)
    try:
        body = {"run_id": run_id, "at": {"decision": call}, "decision": {"action": "cancel", "reason": "no"}}
        reply = await nc.request("agentlog.api.runs.counterfactual", json.dumps(body).encode(), timeout=30)
        assert not (reply.headers or {}).get("Nats-Service-Error-Code"), reply.data
        branch = json.loads(reply.data)
        assert branch["forked_from"]["run_id"] == run_id
        diff = await nc.request("agentlog.api.threads.diff", json.dumps(
            {"thread_id": thread, "other_thread_id": branch["thread_id"]}).encode(), timeout=30)
        assert json.loads(diff.data)["common"] > 0
        bad = await nc.request("agentlog.api.runs.counterfactual", json.dumps(
            {**body, "at": {"decision": "nope"}}).encode(), timeout=30)
        assert (bad.headers or {}).get("Nats-Service-Error-Code") == "404"
        assert json.loads(bad.data)["code"] == "unknown_call"
    finally:
        await nc.close()


def test_counterfactual_and_thread_diff_from_the_cli(client: SyncClient, protocol_deployment: Deployment) -> None:
    """`agentlog run counterfactual RUN --call C --deny` branches; `agentlog thread diff A B`
    prints how much they share and a table of the rest (~ for the changed decision)."""
    d = protocol_deployment
    thread, run_id, call = decided_run(client)
    for target in (["--nats", d.nats_url], ["--url", d.http_url]):
        made = runner.invoke(app, ["run", "counterfactual", run_id, "--call", call, "--deny", "--json", *target,
                                   "--timeout", "10"])
        assert made.exit_code == 0, made.output
        branch = json.loads(made.stdout)
        client.runs.wait(branch["run_id"], timeout=WAIT)
        shown = runner.invoke(app, ["thread", "diff", thread, branch["thread_id"], *target, "--timeout", "10"])
        assert shown.exit_code == 0, shown.output
        assert "event(s) in common" in shown.stdout and "~" in shown.stdout and "ToolCallDecided" in shown.stdout
    refused = runner.invoke(app, ["run", "counterfactual", run_id, "--call", "nope", "--deny", "--url", d.http_url])
    assert refused.exit_code != 0 and "unknown_call" in refused.output
    replaced = runner.invoke(app, ["run", "counterfactual", run_id, "--inference", "1", "--answer", "No need to ask.",
                                   "--json", "--url", d.http_url])
    assert replaced.exit_code == 0, replaced.output
    done = client.runs.wait(json.loads(replaced.stdout)["run_id"], timeout=WAIT)
    assert done["status"] == "done" and done["steps"] == 1


def test_counterfactual_answer_replaced_goes_on_from_there_and_replays_verified(
        client: SyncClient, protocol_deployment: Deployment) -> None:
    """A finished run branched at its model's first answer (`add`), with a call of `echo` instead:
    the branch's run resumes on a worker, takes that answer without asking its model, runs
    `echo` and goes on; `replay --verify` of it passes; the diff starts at the replaced answer."""
    run = client.runs.create("open", "add: go")
    assert client.runs.wait(run["run_id"], timeout=WAIT)["status"] == "done"
    branch = client.runs.replace_answer(run["run_id"], 1, content="echo instead",
                                        tool_calls=[{"name": "echo", "arguments": {"text": "hi"}}])
    assert branch["forked_from"]["run_id"] == run["run_id"] and branch["forked_from"]["message_id"]
    done = client.runs.wait(branch["run_id"], timeout=WAIT)
    assert done["status"] == "done"
    said = [(m["message"]["role"], m["message"]["content"]) for m in client.threads.messages(branch["thread_id"])["messages"]]
    assert said == [("user", "add: go"), ("assistant", "echo instead"), ("tool", "hi"),
                    ("assistant", "The sum is three.")]
    result = verify(protocol_deployment, branch["run_id"])
    assert result.exit_code == 0, result.output
    got = client.threads.diff(run["thread_id"], branch["thread_id"])
    kinds = {got["rows"][0]["a"]["type"], got["rows"][0]["b"]["type"]}
    assert got["common"] == 3 and "MessageAppended" in kinds  # start commit + StepStarted shared
    replaced = [r for r in got["rows"] if r["b"] is not None and r["b"]["type"] == "InferenceReplaced"]
    assert replaced and "answer replaced" in replaced[0]["b"]["summary"]


def test_counterfactual_answer_bad_input_is_a_typed_4xx_and_writes_nothing(client: SyncClient) -> None:
    run = client.runs.create("open", "text: hi")
    assert client.runs.wait(run["run_id"], timeout=WAIT)["status"] == "done"
    answer = {"content": "other"}
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"at": {"inference": 2}, "answer": answer}, 404, "inference_not_found"),
        ({"at": {"inference": "no-such-message"}, "answer": answer}, 404, "inference_not_found"),
        ({"at": {"inference": 0}, "answer": answer}, 400, "invalid_input"),
        ({"at": {"inference": 1}, "answer": {"content": ""}}, 400, "invalid_input"),
        ({"at": {"inference": 1}, "decision": {"action": "cancel"}}, 400, "invalid_input"),
        ({"at": {"inference": 1, "decision": "c"}, "answer": answer}, 400, "invalid_input"),
        ({"at": {"inference": 1}, "answer": {"tool_calls": [{"name": "echo", "id": "a.b"}]}}, 400, "invalid_input"),
    ]
    for body, status, code in cases:
        new_thread = body.setdefault("new_thread_id", uid("never"))
        with pytest.raises(ApiError) as raised:
            _post(client, run["run_id"], body)
        assert (raised.value.status, raised.value.code) == (status, code), (body, raised.value)
        with pytest.raises(ApiError) as missing:
            client.threads.get(new_thread)
        assert missing.value.status == 404


def test_counterfactual_diff_of_a_plain_fork_starts_at_its_position(client: SyncClient) -> None:
    """A thread fork (`POST /v1/threads/{id}/fork`) and a run on it, diffed with the source: the
    source's side is what followed the fork position, the fork's what its own run did."""
    run = client.runs.create("open", "add: go")
    client.runs.wait(run["run_id"], timeout=WAIT)
    thread = run["thread_id"]
    first = client.threads.messages(thread)["messages"][0]["event_id"]
    fork = client.threads.fork(thread, first)["thread_id"]
    assert client.threads.diff(thread, fork)["b_events"] == 0
    again = client.runs.create("open", [], thread_id=fork)
    client.runs.wait(again["run_id"], timeout=WAIT)
    got = client.threads.diff(thread, fork)
    source_events = sum(1 for _ in client.threads.stream(thread)) - 3  # after the user message
    assert got["a_events"] == source_events and got["b_events"] > 0
    assert {r["kind"] for r in got["rows"]} <= {"same", "changed", "only_a", "only_b"}
    assert got["common"] == 0 and got["rows"][0]["b"]["type"] == "RunStarted"  # the fork's own run


def test_counterfactual_and_diff_are_the_tenant_s_own(tokens_deployment: Deployment) -> None:
    """On the shared deployment with tokens (`tokens_deployment`): tenant G branches its run (the
    branch is G's too); tenant H (who must stay without threads: tests/gateway/test_fork.py counts
    them) gets 404 for G's run and G's threads, and writes nothing."""
    url = tokens_deployment.http_url
    with get_sync_client(url, token="tg") as a, get_sync_client(url, token="th") as b:
        run = a.runs.create("sequential", "approval: deploy it", resource_id="tenantG-cf")
        waiting = a.runs.wait(run["run_id"], timeout=WAIT)
        call = next(iter(waiting["calls"]))
        with pytest.raises(ApiError) as raised:
            b.runs.counterfactual(run["run_id"], call, result={"approved": False})
        assert (raised.value.status, raised.value.code) == (404, "run_not_found")
        branch = a.runs.counterfactual(run["run_id"], call, result={"approved": False})
        assert a.threads.get(branch["thread_id"], min_seq=branch["seq"])["resource_id"] == "tenantG-cf"
        for left, right in ((run["thread_id"], branch["thread_id"]), (branch["thread_id"], run["thread_id"])):
            with pytest.raises(ApiError) as raised:
                b.threads.diff(left, right)
            assert raised.value.status == 404
        assert a.threads.diff(run["thread_id"], branch["thread_id"])["common"] > 0
        marker = a.threads.create(resource_id="tenantG-cf")
        assert b.threads.list(min_seq=marker["seq"])["total"] == 0


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium not installed (/usr/bin/chromium missing)")
async def test_counterfactual_diff_page_in_the_inspector(protocol_deployment: Deployment) -> None:
    """Headless Chromium: the branch's run page names its source run and links "compare with its
    source"; the diff page shows the shared prefix and the two decisions side by side."""
    from playwright.async_api import expect

    url = protocol_deployment.http_url
    with get_sync_client(url) as sync:
        thread, run_id, call = await asyncio.to_thread(decided_run, sync)
        branch = await asyncio.to_thread(sync.runs.counterfactual, run_id, call, result={"approved": False})
        await asyncio.to_thread(sync.runs.wait, branch["run_id"], timeout=WAIT)
        common = (await asyncio.to_thread(sync.threads.diff, thread, branch["thread_id"]))["common"]
        first = (await asyncio.to_thread(sync.threads.messages, thread))["messages"][0]["event_id"]
        fork = (await asyncio.to_thread(sync.threads.fork, thread, first))["thread_id"]
    async with asyncio.timeout(180), chromium_page() as page:
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await page.goto(f"{url}/ui#/runs/{branch['run_id']}")
        await expect(page.locator("#run-id")).to_have_text(branch["run_id"])
        await expect(page.locator("#run-branch")).to_contain_text(f"branch of run {run_id} at call {call}")
        await page.click("#compare-source")
        await expect(page.locator("#diff-common")).to_contain_text(f"{common} event(s) in common")
        changed = page.locator("#diff-rows tr.changed").first
        await expect(changed).to_contain_text("ToolCallDecided")
        assert page.url.endswith(f"#/diff/{thread}/{branch['thread_id']}")
        await page.goto(f"{url}/ui#/runs/{run_id}")  # the source links to its branch
        await expect(page.locator(f"#run-branch a.compare-child[href$='/{branch['thread_id']}']")).to_be_visible()
        await page.goto(f"{url}/ui#/threads/{fork}")  # a plain fork without runs links its diff too
        await page.click("#compare-fork")
        await expect(page.locator("#diff-common")).to_contain_text("0 event(s) in common")
        assert errors == []
