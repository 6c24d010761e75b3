"""Forking a thread at an event (`POST /v1/threads/{id}/fork`, NATS `agentlog.api.threads.fork`,
`agentlog thread fork`, `client.threads.fork`), against what users run: `agentlog serve`, and
`agentlog gateway` + `agentlog worker` (the shared `protocol_deployment` of tests/apps/protocol_app.py,
whose scripted agents answer by the first word of the user message: "state" calls `add`, which
sets `/last_sum`).

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
from agentlog.client import ApiError, AsyncClient, SyncClient, get_sync_client
from agentlog.eventlog.events import (
    Commit,
    Message,
    MessageAppended,
    Position,
    StoredCommit,
    ThreadCreated,
    ToolCall,
)
from agentlog.eventlog.ids import new_id
from agentlog.projections.fork import CUT_OFF, fork_events

from tests.gateway.test_inspector_browser import CHROMIUM, chromium_page
from tests.support.adapters_routes import TRANSPORTS, Transport, open_deployed
from tests.support.http_stack import uid
from tests.support.topology import Deployment

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("keep_structlog_config")
WAIT = 90


@pytest.fixture
def client(protocol_deployment: Deployment) -> Iterator[SyncClient]:
    with get_sync_client(protocol_deployment.http_url) as value:
        yield value


def finished_thread(client: SyncClient, text: str = "state: add them") -> tuple[str, str, list[dict[str, Any]]]:
    """A thread whose one run (agent `open`) has finished: (thread, run, its messages with event ids)."""
    run = client.runs.create("open", text)
    assert client.runs.wait(run["run_id"], timeout=WAIT)["status"] == "done"
    messages = client.threads.messages(run["thread_id"])["messages"]
    return run["thread_id"], run["run_id"], messages


def contents(client: SyncClient, thread: str) -> list[tuple[str, str]]:
    return [(m["message"]["role"], m["message"]["content"]) for m in client.threads.messages(thread)["messages"]]


def verify(d: Deployment, run_id: str) -> Any:
    return runner.invoke(app, ["replay", run_id, "--verify", "--app", "tests.apps.protocol_app:app", "--nats", d.nats_url,
                               "--timeout", "10"])


def test_fork_copies_messages_and_state_as_of_the_position(client: SyncClient) -> None:
    """Forked at the user message: that message and the state before the tool ran; forked at
    the end: every message and the state after it. Both record their lineage."""
    thread, _run, messages = finished_thread(client)
    assert client.threads.state(thread)["state"] == {"last_sum": 3}
    first = messages[0]["event_id"]
    early = client.threads.fork(thread, first)
    assert early["thread"]["forked_from"] == {"thread_id": thread, "position": first}
    assert contents(client, early["thread_id"]) == [("user", "state: add them")]
    assert client.threads.state(early["thread_id"])["state"] == {}
    last = messages[-1]["event_id"]
    late = client.threads.fork(thread, last, new_thread_id=uid("f"))
    assert contents(client, late["thread_id"]) == contents(client, thread)
    assert client.threads.state(late["thread_id"])["state"] == {"last_sum": 3}
    got = client.threads.get(late["thread_id"], min_seq=late["seq"])
    assert got["forked_from"] == {"thread_id": thread, "position": last} and got["run_ids"] == []
    assert client.threads.messages(thread)["messages"] == messages  # the source is untouched


def test_fork_runs_normally_and_replay_verify_passes(client: SyncClient, protocol_deployment: Deployment) -> None:
    """A run started on a fork sees the copied history (the scripted agent answers the copied
    "state" request: it calls `add`), and `replay --verify` of it passes from the fork's log."""
    thread, _run, messages = finished_thread(client)
    fork = client.threads.fork(thread, messages[0]["event_id"])
    run = client.runs.create("open", [], thread_id=fork["thread_id"])
    view = client.runs.wait(run["run_id"], timeout=WAIT)
    assert view["status"] == "done" and view["termination"]["type"] == "natural_end"
    assert client.threads.state(fork["thread_id"])["state"] == {"last_sum": 3}
    assert contents(client, fork["thread_id"])[-1] == ("assistant", "The sum is 3.")
    result = verify(protocol_deployment, run["run_id"])
    assert result.exit_code == 0, result.output
    assert f"verified run {run['run_id']}" in result.stdout


def test_fork_with_edited_state_and_a_replaced_message(client: SyncClient) -> None:
    """LangGraph's update_state + fork: the fork's state is edited (a patch, or a replacement)
    and its user message replaced; a run on it answers the replaced message."""
    thread, _run, messages = finished_thread(client, "text: hello")
    user = messages[0]
    patched = client.threads.fork(thread, messages[-1]["event_id"],
                                  state_patch=[{"op": "add", "path": "/mode", "value": "edited"}])
    assert client.threads.state(patched["thread_id"])["state"] == {"mode": "edited"}
    replaced = client.threads.fork(thread, user["event_id"], state={"from": "fork"},
                                   replace_message={"id": user["message"]["id"], "content": "state: please"})
    assert contents(client, replaced["thread_id"]) == [("user", "state: please")]
    run = client.runs.create("open", [], thread_id=replaced["thread_id"])
    assert client.runs.wait(run["run_id"], timeout=WAIT)["status"] == "done"
    assert client.threads.state(replaced["thread_id"])["state"] == {"from": "fork", "last_sum": 3}
    assert contents(client, thread) == [(m["message"]["role"], m["message"]["content"]) for m in messages]


def test_fork_bad_input_is_a_typed_4xx_and_writes_nothing(client: SyncClient, protocol_deployment: Deployment) -> None:
    thread, _run, messages = finished_thread(client, "text: hi")
    at = messages[-1]["event_id"]
    taken = client.threads.fork(thread, at)
    before = client.threads.list(limit=1, min_seq=taken["seq"])["total"]
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"at": "nope"}, 400, "invalid_input"),
        ({"at": "999999999:0"}, 400, "position_not_found"),
        ({"at": f"{Position.parse(at).seq}:99"}, 400, "position_not_found"),
        ({"at": at, "state_patch": [{"op": "remove", "path": "/missing"}]}, 400, "invalid_patch"),
        ({"at": at, "state": {}, "state_patch": []}, 400, "invalid_fork"),
        ({"at": at, "replace_message": {"id": "no-such-message", "content": "x"}}, 400, "message_not_found"),
        ({"at": at, "new_thread_id": taken["thread_id"]}, 409, "thread_exists"),
        ({"at": at, "new_thread_id": "a.b"}, 400, "invalid_input"),
    ]
    for body, status, code in cases:
        with pytest.raises(ApiError) as raised:
            _post(client, thread, body)
        assert (raised.value.status, raised.value.code) == (status, code), (body, raised.value)
    with pytest.raises(ApiError) as raised:
        client.threads.fork(uid("t"), "1:0")
    assert (raised.value.status, raised.value.code) == (404, "thread_not_found")
    marker = client.threads.create()  # read after a later write: every bad request has been answered
    assert client.threads.list(limit=1, min_seq=marker["seq"])["total"] == before + 1


def _post(client: SyncClient, thread: str, body: dict[str, Any]) -> Any:
    return client.call(client.aio.request("POST", f"/v1/threads/{thread}/fork", json_body=body))


async def test_fork_over_nats(protocol_deployment: Deployment) -> None:
    d = protocol_deployment
    async with AsyncClient(d.http_url) as aio:
        run = await aio.runs.create("open", "state: add")
        await aio.runs.wait(run["run_id"], timeout=WAIT)
        thread = run["thread_id"]
        at = (await aio.threads.messages(thread))["messages"][0]["event_id"]
    nc = await nats.connect(d.nats_url)
    try:
        reply = await nc.request("agentlog.api.threads.fork", json.dumps({"thread_id": thread, "at": at}).encode(),
                                 timeout=30)
        assert not (reply.headers or {}).get("Nats-Service-Error-Code"), reply.data
        forked = json.loads(reply.data)
        assert forked["thread"]["forked_from"] == {"thread_id": thread, "position": at}
        bad = await nc.request("agentlog.api.threads.fork", json.dumps({"thread_id": thread, "at": "999999999:0"}
                                                                       ).encode(), timeout=30)
        assert (bad.headers or {}).get("Nats-Service-Error-Code") == "400"
        assert json.loads(bad.data)["code"] == "position_not_found"
    finally:
        await nc.close()


def test_fork_from_the_cli(client: SyncClient, protocol_deployment: Deployment) -> None:
    d = protocol_deployment
    thread, _run, messages = finished_thread(client)
    at = messages[0]["event_id"]
    for target in (["--nats", d.nats_url], ["--url", d.http_url]):
        result = runner.invoke(app, ["thread", "fork", thread, "--at", at, "--patch",
                                     '[{"op": "add", "path": "/cli", "value": true}]', "--json", *target,
                                     "--timeout", "10"])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        assert doc["thread"]["forked_from"]["thread_id"] == thread and doc["thread"]["state"] == {"cli": True}
    result = runner.invoke(app, ["thread", "fork", thread, "--at", "999999999:0", "--nats", d.nats_url])
    assert result.exit_code == 2 and "position_not_found" in result.output, result.output


def test_fork_mid_step_answers_the_calls_it_cut_off() -> None:
    """Forked after an assistant message that asked for a tool but before its result: the fork
    answers the call (cancelled), so a model never sees an unanswered call."""
    call = ToolCall(id="c1", name="echo", arguments={"text": "x"})
    commits = [
        StoredCommit(1, Commit(commit_id="k1", thread_id="t", ts=1, events=[ThreadCreated(metadata={"a": 1})])),
        StoredCommit(2, Commit(commit_id="k2", thread_id="t", run_id="r", ts=2, events=[
            MessageAppended(message=Message(id="m1", role="user", content="go")),
            MessageAppended(message=Message(id="m2", role="assistant", tool_calls=[call])),
            MessageAppended(message=Message(id="m3", role="tool", content="x", tool_call_id="c1")),
        ])),
    ]
    events = fork_events(commits, "t", Position(2, 1), new_id=new_id)
    created, *appended = events
    assert isinstance(created, ThreadCreated) and created.metadata == {"a": 1}
    messages = [e.message for e in appended if isinstance(e, MessageAppended)]
    assert [(m.role, m.content, m.tool_call_id) for m in messages] == [
        ("user", "go", None), ("assistant", "", None), ("tool", CUT_OFF, "c1")]
    whole = fork_events(commits, "t", Position(2, 2), new_id=new_id)
    assert [e.message.content for e in whole if isinstance(e, MessageAppended)] == ["go", "", "x"]


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium not installed (/usr/bin/chromium missing)")
async def test_fork_from_here_in_the_inspector(protocol_deployment: Deployment) -> None:
    """Headless Chromium: pick an event of a run's timeline, "Fork from here"; the page shows the
    new thread (its lineage and the messages it starts with), which the API confirms."""
    from playwright.async_api import expect

    url = protocol_deployment.http_url
    async with asyncio.timeout(180), AsyncClient(url) as aio, chromium_page() as page:
        run = await aio.runs.create("open", "state: add them")
        await aio.runs.wait(run["run_id"], timeout=WAIT)
        thread = run["thread_id"]
        at = (await aio.threads.messages(thread))["messages"][0]["event_id"]
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await page.goto(f"{url}/ui#/runs/{run['run_id']}")
        await expect(page.locator("#run-id")).to_have_text(run["run_id"])
        button = page.locator(f"button.fork[data-fork='{at}']")
        await expect(button).to_be_hidden()  # offered for the picked event only
        await page.click(f"a.ev[data-event='{at}']")
        await expect(button).to_be_visible()
        await button.click()
        await expect(page.locator("#thread-head")).to_contain_text(f"Forked from thread {thread} at event {at}.")
        await expect(page.locator("#thread-messages li")).to_have_count(1)
        await expect(page.locator("#thread-messages li")).to_contain_text("state: add them")
        fork = page.url.rsplit("/", 1)[-1]
        assert (await aio.threads.get(fork))["forked_from"] == {"thread_id": thread, "position": at}
        assert errors == []


# -- AI SDK regenerate-message: a fork before the answer --------------------------------------------


def chat_body(chat: str, texts: list[tuple[str, str]], **extra: Any) -> dict[str, Any]:
    """A `useChat` request: the client's messages (id, text) as UI messages."""
    return {"id": chat, "messages": [{"id": i, "role": "user", "parts": [{"type": "text", "text": t}]}
                                     for i, t in texts], "trigger": "submit-message", **extra}


@pytest.mark.parametrize("tr", TRANSPORTS, ids=lambda t: t.name)
async def test_fork_regenerate_message_answers_again_from_before_the_answer(
        protocol_deployment: Deployment, tr: Transport) -> None:
    """`regenerate-message` on the last answer: a new run answers the same input on a fork made
    before the old answer; the chat (same id) now shows the new answer only, continues on the
    fork, keeps the old answer in its original thread's log, and `replay --verify` passes."""
    async with asyncio.timeout(180), open_deployed(protocol_deployment) as stack:
        chat, user = uid("c"), uid("u")
        first = await tr.aisdk(stack, chat_body(chat, [(user, "state: add")]), agent="open")
        old = next(p["messageId"] for p in first.events if p["type"] == "start")
        again = await tr.aisdk(stack, chat_body(chat, [(user, "state: add")], trigger="regenerate-message",
                                                messageId=old), agent="open")
        assert not [p for p in again.events if p["type"] == "error"], again.events
        new = next(p["messageId"] for p in again.events if p["type"] == "start")
        assert new != old and again.events[-1]["type"] == "finish"
        async with stack.client.get(f"/v1/ai-sdk/threads/{chat}/messages") as resp:
            shown = (await resp.json())["messages"]
        assert [(m["role"], m["id"]) for m in shown] == [("user", user), ("assistant", new)]
        async with stack.client.get(f"/v1/threads/{chat}") as resp:
            fork = (await resp.json())["metadata"]["agentlog.branch"]
        async with stack.client.get(f"/v1/threads/{fork}") as resp:
            view = await resp.json()
        assert view["forked_from"]["thread_id"] == chat and view["run_ids"] == [new]
        assert old in [sc.commit.run_id async for sc in stack.store.read_thread(chat)]  # never erased
        follow_up = await tr.aisdk(stack, chat_body(chat, [(user, "state: add"), (uid("u"), "text: more")]),
                                   agent="open")
        assert follow_up.events[-1]["type"] == "finish"
        async with stack.client.get(f"/v1/ai-sdk/threads/{chat}/messages") as resp:
            shown = (await resp.json())["messages"]
        assert [m["role"] for m in shown] == ["user", "assistant", "user", "assistant"] and shown[1]["id"] == new
    result = await asyncio.to_thread(verify, protocol_deployment, new)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("tr", TRANSPORTS, ids=lambda t: t.name)
async def test_fork_regenerate_of_an_older_answer_is_refused(protocol_deployment: Deployment, tr: Transport) -> None:
    async with asyncio.timeout(120), open_deployed(protocol_deployment) as stack:
        chat, user = uid("c"), uid("u")
        await tr.aisdk(stack, chat_body(chat, [(user, "text: hi")]), agent="open")
        before = await stack.store.thread_version(chat)
        answer = await tr.aisdk(stack, chat_body(chat, [(user, "text: hi")], trigger="regenerate-message",
                                                 messageId="not-the-last"), agent="open")
        errors = [p for p in answer.events if p["type"] == "error"]
        assert errors and "only the last assistant message" in errors[0]["errorText"], answer.events
        assert await stack.store.thread_version(chat) == before


# -- tenants ---------------------------------------------------------------------------------------


def test_fork_inherits_the_tenant_and_a_tenant_forks_only_its_own(tokens_deployment: Deployment) -> None:
    """The shared deployment with tokens (`tokens_deployment`, conftest.py): this module's tenants
    are G (`tg`) and H (`th`)."""
    deployment = tokens_deployment
    with get_sync_client(deployment.http_url, token="tg") as a, get_sync_client(deployment.http_url, token="th") as b:
        run = a.runs.create("open", "text: mine", resource_id="tenantG-1")
        assert a.runs.wait(run["run_id"], timeout=WAIT)["status"] == "done"
        at = a.threads.messages(run["thread_id"])["messages"][-1]["event_id"]
        fork = a.threads.fork(run["thread_id"], at)
        assert fork["thread"]["resource_id"] == "tenantG-1"
        with pytest.raises(ApiError) as raised:
            b.threads.fork(run["thread_id"], at)
        assert (raised.value.status, raised.value.code) == (404, "thread_not_found")
        with pytest.raises(ApiError) as raised:
            b.threads.get(fork["thread_id"])
        assert raised.value.status == 404  # the fork is tenant G's too
        marker = a.threads.create(resource_id="tenantG-2")
        assert b.threads.list(min_seq=marker["seq"])["total"] == 0  # tenant H's fork wrote nothing
