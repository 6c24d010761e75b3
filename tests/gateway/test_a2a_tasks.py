"""A2A ListTasks, the authenticated extended agent card, tenant-scoped tokens and push
notifications (a loopback webhook receiver; a gateway killed mid-delivery), with the
official a2a-sdk client against what users run (`agentlog serve`, and `agentlog gateway` +
`agentlog worker`): the shared `tokens_deployment` (conftest.py; tokens `admin` (unscoped), and
this module's tenants `te:tenantE`, `tf:tenantF`), and deployments of their own with `TOKENS`
for the kill and two-gateway checks.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, create_client
from a2a.types.a2a_pb2 import (
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import TaskNotFoundError
from aiohttp import web
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.struct_pb2 import Value

from agentlog.gateway.adapters.a2a.push import signature

from tests.support.topology import TOPOLOGIES, Deployment, Kind, deploy

TIMEOUT = 60
TOKENS = "admin,tok-a:tenantA,tok-b:tenantB"


@pytest.fixture
def a2a_deployment(tokens_deployment: Deployment) -> Deployment:
    """The shared deployment with tokens (`tokens_deployment`, conftest.py): `admin`, and this
    module's tenants E (`te`) and F (`tf`)."""
    return tokens_deployment


async def client_for(base: str, token: str, agent: str = "open", *, streaming: bool = False) -> Any:
    http = httpx.AsyncClient(timeout=TIMEOUT, headers={"Authorization": f"Bearer {token}"})
    card = await A2ACardResolver(http, base, f"/a2a/{agent}/.well-known/agent-card.json").get_agent_card()
    return await create_client(card, ClientConfig(streaming=streaming, httpx_client=http))


def text(t: str, *, mid: str, context_id: str = "") -> SendMessageRequest:
    return SendMessageRequest(message=Message(message_id=mid, role=Role.ROLE_USER, parts=[Part(text=t)],
                                              context_id=context_id))


async def send(client: Any, t: str, mid: str, context_id: str = "") -> Any:
    events = [ev async for ev in client.send_message(text(t, mid=mid, context_id=context_id))]
    assert len(events) == 1 and events[0].HasField("task"), events
    return events[0].task


async def all_tasks(client: Any, **kw: Any) -> list[Any]:
    out, token = [], ""
    while True:
        page = await client.list_tasks(ListTasksRequest(page_token=token, **kw))
        out += list(page.tasks)
        token = page.next_page_token
        if not token:
            return out


async def test_list_tasks_is_scoped_to_the_tenant(a2a_deployment: Deployment) -> None:
    """A tenant lists its own tasks (just created ones included), never another tenant's; an
    unscoped token lists them all."""
    base = a2a_deployment.http_url
    async with asyncio.timeout(TIMEOUT):
        a, b, admin = [await client_for(base, t) for t in ("te", "tf", "admin")]
        mine = [await send(a, "text: a1", "ma1"), await send(a, "text: a2", "ma2")]
        theirs = await send(b, "text: b1", "mb1")
        assert all(t.status.state == TaskState.TASK_STATE_COMPLETED for t in [*mine, theirs])
        seen_a = {t.id for t in await all_tasks(a)}
        seen_b = {t.id for t in await all_tasks(b)}
        seen_admin = {t.id for t in await all_tasks(admin)}
    assert {t.id for t in mine} <= seen_a and theirs.id not in seen_a
    assert theirs.id in seen_b and not seen_b & {t.id for t in mine}
    assert {theirs.id, *(t.id for t in mine)} <= seen_admin


async def test_list_tasks_pages_and_filters(a2a_deployment: Deployment) -> None:
    base = a2a_deployment.http_url
    async with asyncio.timeout(TIMEOUT):
        a = await client_for(base, "te")
        first = await send(a, "text: p1", "mp1")
        second = await send(a, "text: p2", "mp2", context_id=first.context_id)
        page = await a.list_tasks(ListTasksRequest(context_id=first.context_id, page_size=1, history_length=0))
        assert len(page.tasks) == 1 and page.next_page_token and page.total_size == 2
        rest = await a.list_tasks(ListTasksRequest(context_id=first.context_id, page_size=1,
                                                   page_token=page.next_page_token, include_artifacts=True))
        assert [t.id for t in [*page.tasks, *rest.tasks]] == sorted([first.id, second.id])
        assert rest.tasks[0].artifacts and not page.tasks[0].artifacts
        waiting = await (await client_for(base, "te", "sequential")).list_tasks(
            ListTasksRequest(status=TaskState.TASK_STATE_INPUT_REQUIRED))
        assert all(t.status.state == TaskState.TASK_STATE_INPUT_REQUIRED for t in waiting.tasks)


async def test_list_tasks_tenant_token_cannot_reach_another_tenants_task(a2a_deployment: Deployment) -> None:
    """Tenant tokens are served (not refused): another tenant's task answers like an unknown
    one, to reads and to messages; its own task is readable."""
    base = a2a_deployment.http_url
    async with asyncio.timeout(TIMEOUT):
        a, b = await client_for(base, "te"), await client_for(base, "tf")
        task = await send(a, "text: secret", "ms1")
        assert (await a.get_task(GetTaskRequest(id=task.id))).id == task.id
        with pytest.raises(TaskNotFoundError):
            await b.get_task(GetTaskRequest(id=task.id))
        with pytest.raises(TaskNotFoundError):
            await send(b, "text: in your context", "ms2", context_id=task.context_id)


async def test_extended_card_for_authenticated_callers(a2a_deployment: Deployment) -> None:
    """The public card says an extended card exists; an authenticated caller (tenant tokens too)
    gets it, with a skill per tool; without a token the endpoint is a 401."""
    base = a2a_deployment.http_url
    async with asyncio.timeout(TIMEOUT):
        async with httpx.AsyncClient() as http:
            public = await A2ACardResolver(http, base, "/a2a/open/.well-known/agent-card.json").get_agent_card()
            assert public.capabilities.extended_agent_card
            refused = await http.post(f"{base}/a2a/open", json={"jsonrpc": "2.0", "id": 1,
                                                                 "method": "GetExtendedAgentCard", "params": {}},
                                      headers={"A2A-Version": "1.0"})
            assert refused.status_code == 401
        for token in ("admin", "te"):
            card = await (await client_for(base, token)).get_extended_agent_card(GetExtendedAgentCardRequest())
            names = {s.name for s in card.skills}
            assert {"open", "add", "echo", "report"} <= names and len(card.skills) > len(public.skills)


# -- push notifications ------------------------------------------------------------------------


class Webhook:
    """A loopback webhook receiver: records every POST; `hang_first` holds the first delivery of
    a completed task open (never answering) so a test can kill the gateway mid-delivery."""

    def __init__(self, hang_first: bool = False) -> None:
        self.hang_first = hang_first
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.changed = asyncio.Condition()
        self.hanging = asyncio.Event()
        self._release = asyncio.Event()  # ends the held delivery's handler (else cleanup waits 60 s on it)
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> Webhook:
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/hook"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        self._release.set()
        await self._runner.cleanup()

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        async with self.changed:
            self.received.append((dict(request.headers), body))
            self.changed.notify_all()
        if self.hang_first and self.state(body) == "TASK_STATE_COMPLETED" and not self.hanging.is_set():
            self.hanging.set()
            await self._release.wait()  # its gateway dies meanwhile; the receiver closes after
        return web.Response(status=204)

    @staticmethod
    def state(body: bytes) -> str:
        return str(json.loads(body)["task"]["status"]["state"])

    async def wait_for(self, cond: Any) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: cond(self.received))


def completed(received: list[tuple[dict[str, str], bytes]]) -> list[tuple[dict[str, str], bytes]]:
    return [(h, b) for h, b in received if Webhook.state(b) == "TASK_STATE_COMPLETED"]


async def waiting_task(client: Any, mid: str) -> tuple[Any, str]:
    task = await send(client, "approval: deploy it", mid)
    assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, task
    call_id = MessageToDict(task.status.message.parts[1].data)["suspended"][0]["call_id"]
    return task, call_id


async def approve(client: Any, task_id: str, call_id: str) -> Any:
    data = ParseDict({"decisions": [{"target_id": call_id, "decision_id": f"ok-{task_id}", "action": "resume",
                                     "result": {"approved": True}}]}, Value())
    msg = Message(message_id=f"d-{task_id}", role=Role.ROLE_USER, parts=[Part(data=data)], task_id=task_id)
    events = [ev async for ev in client.send_message(SendMessageRequest(message=msg))]
    return events[-1].task


async def test_push_notifications_are_delivered_signed(a2a_deployment: Deployment) -> None:
    """A webhook set on a waiting task gets its next state changes (resumed, completed) as A2A
    task notifications, with the config's token and an HMAC signature of the body; the configs
    are readable, listable and deletable; the card says push is supported."""
    base = a2a_deployment.http_url
    async with asyncio.timeout(TIMEOUT), Webhook() as hook:
        client = await client_for(base, "te", "sequential")
        assert (await A2ACardResolver(httpx.AsyncClient(), base, "/a2a/sequential/.well-known/agent-card.json")
                .get_agent_card()).capabilities.push_notifications
        task, call_id = await waiting_task(client, "mp1")
        created = await client.create_task_push_notification_config(
            TaskPushNotificationConfig(task_id=task.id, id="hook1", url=hook.url, token="s3cret"))
        assert created.id == "hook1" and created.url == hook.url
        listed = await client.list_task_push_notification_configs(ListTaskPushNotificationConfigsRequest(task_id=task.id))
        assert [c.id for c in listed.configs] == ["hook1"]
        done = await approve(client, task.id, call_id)
        assert done.status.state == TaskState.TASK_STATE_COMPLETED
        await hook.wait_for(lambda got: completed(got))
        headers, body = completed(hook.received)[0]
        assert headers["X-A2A-Notification-Token"] == "s3cret"
        assert headers["X-Agentlog-Signature"] == signature("s3cret", body)
        assert json.loads(body)["task"]["id"] == task.id
        other = await client_for(base, "tf", "sequential")
        with pytest.raises(TaskNotFoundError):  # another tenant cannot see (or set) the task's hooks
            await other.list_task_push_notification_configs(ListTaskPushNotificationConfigsRequest(task_id=task.id))
        await client.delete_task_push_notification_config(
            DeleteTaskPushNotificationConfigRequest(task_id=task.id, id="hook1"))
        listed = await client.list_task_push_notification_configs(ListTaskPushNotificationConfigsRequest(task_id=task.id))
        assert list(listed.configs) == []


@pytest.mark.parametrize("kind", TOPOLOGIES)
async def test_push_survives_a_gateway_killed_mid_delivery(tmp_path: Path, kind: Kind) -> None:
    """The gateway is SIGKILLed while it is POSTing the completed-task notification (the webhook
    holds the request open): after a restart the same notification (same delivery id) is
    delivered again, from the outbox, not lost."""
    async with asyncio.timeout(TIMEOUT * 2), Webhook(hang_first=True) as hook:
        with deploy(kind, tmp_path, app="tests.apps.protocol_app:app", tokens=TOKENS,
                    env={"AGENTLOG_A2A_PUSH_ACK_WAIT": "2"}) as d:
            client = await client_for(d.http_url, "admin", "sequential")
            task, call_id = await waiting_task(client, "mk1")
            await client.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=task.id, id="hook1", url=hook.url, token="t"))
            await approve(client, task.id, call_id)
            await hook.hanging.wait()
            gateway = "serve" if kind == "serve" else "gateway"
            d.kill(gateway)
            d.start(gateway)
            await hook.wait_for(lambda got: len(completed(got)) >= 2)
        deliveries = [h["X-Agentlog-Delivery"] for h, _ in completed(hook.received)]
        assert len(set(deliveries)) == 1, deliveries  # the same notification, delivered again


async def test_resubscribe_to_a_task_from_another_gateway(tmp_path: Path) -> None:
    """Two gateways on one log (and one worker): a task started through the first is followed to
    its end by a SubscribeToTask on the second (tasks are read from the log, not from the
    gateway that started them)."""
    from a2a.types.a2a_pb2 import SendMessageConfiguration, SubscribeToTaskRequest

    from tests.apps.protocol_app import HOLD_DIR

    with deploy("split", tmp_path / "one", app="tests.apps.protocol_app:app", tokens=TOKENS) as first, \
            deploy("split", tmp_path / "two", app="tests.apps.protocol_app:app", tokens=TOKENS, workers=0,
                   nats=first.nats) as second:
        async with asyncio.timeout(TIMEOUT):
            starter = await client_for(first.http_url, "tok-a")
            request = text("hold: on", mid="mh1")
            request.configuration.CopyFrom(SendMessageConfiguration(return_immediately=True))
            (event,) = [ev async for ev in starter.send_message(request)]
            task = event.task
            assert task.status.state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING), task
            follower = await client_for(second.http_url, "tok-a", streaming=True)
            states: list[int] = []
            async for ev in follower.subscribe(SubscribeToTaskRequest(id=task.id)):
                kind = ev.WhichOneof("payload")
                if kind == "task":
                    HOLD_DIR.mkdir(parents=True, exist_ok=True)
                    (HOLD_DIR / task.context_id).write_text("go")  # released once we follow it
                elif kind == "status_update":
                    states.append(ev.status_update.status.state)
            assert states[-1] == TaskState.TASK_STATE_COMPLETED, states
            other = await client_for(second.http_url, "tok-b", streaming=True)
            with pytest.raises(TaskNotFoundError):
                [ev async for ev in other.subscribe(SubscribeToTaskRequest(id=task.id))]
