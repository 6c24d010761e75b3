"""A2A ListTasks, the authenticated extended agent card and tenant-scoped tokens, with the
official a2a-sdk client against what users run (`agentlog serve`, and `agentlog gateway` +
`agentlog worker`) with tokens `admin` (unscoped), `tok-a:tenantA`, `tok-b:tenantB`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, create_client
from a2a.types.a2a_pb2 import (
    GetExtendedAgentCardRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskState,
)
from a2a.utils.errors import TaskNotFoundError
from topology import TOPOLOGIES, Deployment, deploy

TIMEOUT = 60
TOKENS = "admin,tok-a:tenantA,tok-b:tenantB"


@pytest.fixture(scope="module", params=TOPOLOGIES)
def a2a_deployment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    where: Path = tmp_path_factory.mktemp(f"a2a-{request.param}")
    with deploy(request.param, where, app="protocol_app:app", tokens=TOKENS) as running:
        yield running


async def client_for(base: str, token: str, agent: str = "open") -> Any:
    http = httpx.AsyncClient(timeout=TIMEOUT, headers={"Authorization": f"Bearer {token}"})
    card = await A2ACardResolver(http, base, f"/a2a/{agent}/.well-known/agent-card.json").get_agent_card()
    return await create_client(card, ClientConfig(streaming=False, httpx_client=http))


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
        a, b, admin = [await client_for(base, t) for t in ("tok-a", "tok-b", "admin")]
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
        a = await client_for(base, "tok-a")
        first = await send(a, "text: p1", "mp1")
        second = await send(a, "text: p2", "mp2", context_id=first.context_id)
        page = await a.list_tasks(ListTasksRequest(context_id=first.context_id, page_size=1, history_length=0))
        assert len(page.tasks) == 1 and page.next_page_token and page.total_size == 2
        rest = await a.list_tasks(ListTasksRequest(context_id=first.context_id, page_size=1,
                                                   page_token=page.next_page_token, include_artifacts=True))
        assert [t.id for t in [*page.tasks, *rest.tasks]] == sorted([first.id, second.id])
        assert rest.tasks[0].artifacts and not page.tasks[0].artifacts
        waiting = await (await client_for(base, "tok-a", "sequential")).list_tasks(
            ListTasksRequest(status=TaskState.TASK_STATE_INPUT_REQUIRED))
        assert all(t.status.state == TaskState.TASK_STATE_INPUT_REQUIRED for t in waiting.tasks)


async def test_list_tasks_tenant_token_cannot_reach_another_tenants_task(a2a_deployment: Deployment) -> None:
    """Tenant tokens are served (not refused): another tenant's task answers like an unknown
    one, to reads and to messages; its own task is readable."""
    base = a2a_deployment.http_url
    async with asyncio.timeout(TIMEOUT):
        a, b = await client_for(base, "tok-a"), await client_for(base, "tok-b")
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
        for token in ("admin", "tok-a"):
            card = await (await client_for(base, token)).get_extended_agent_card(GetExtendedAgentCardRequest())
            names = {s.name for s in card.skills}
            assert {"open", "add", "echo", "report"} <= names and len(card.skills) > len(public.skills)
