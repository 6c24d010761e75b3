"""Images and files on every protocol route: AG-UI image/document input content, AI SDK `file`
parts (`data:` URLs), A2A `raw`/`url` parts. Each becomes the message's content parts (the pure
parsers), the run gets them, and the history routes give them back, through a real
`agentlog serve` and `agentlog gateway` + `agentlog worker` (AG-UI, AI SDK, and the a2a-sdk
client against the gateway's A2A server)."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import aiohttp
import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, create_client
from a2a.types.a2a_pb2 import Message as A2AMessage
from a2a.types.a2a_pb2 import Part, Role, SendMessageRequest

from agentlog.cli.demo import follow_run
from agentlog.eventlog.events import MessageAppended
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.gateway.adapters.a2a.mapping import a2a_parts, message_content
from agentlog.gateway.adapters.agui import translator as agui
from agentlog.gateway.adapters.aisdk import translator as aisdk
from agentlog.gateway.adapters.common import AdapterInputError
from agentlog.projections.fold import fold_commits
from agentlog.runtime.inputs.admission import as_messages

from tests.support.http_stack import open_remote, uid
from tests.support.topology import Deployment

LIMIT = 60
RAW = b"\x89PNG\r\n\x1a\n" + bytes(range(40))
PNG = base64.b64encode(RAW).decode()
PDF = base64.b64encode(b"%PDF-1.4 tiny").decode()


class Ids:
    def new_id(self) -> str:
        return "m1"


def agui_body(thread: str, content: Any) -> dict[str, Any]:
    return {"threadId": thread, "runId": f"{thread}r", "state": {}, "tools": [], "context": [],
            "forwardedProps": {}, "messages": [{"id": f"{thread}u", "role": "user", "content": content}]}


AGUI_CONTENT = [{"type": "text", "text": "what is this?"},
                {"type": "image", "source": {"type": "data", "value": PNG, "mimeType": "image/png"}},
                {"type": "document", "source": {"type": "url", "value": "https://example.test/a.pdf",
                                                "mimeType": "application/pdf"}}]


def test_agui_image_and_document_input_become_parts() -> None:
    req = agui.parse_run_input(agui_body("t1", AGUI_CONTENT))
    [m] = as_messages(req.messages, Ids())
    assert m.content == "what is this?"
    assert [(p.type, p.media_type, p.data, p.url) for p in m.parts or ()] == [
        ("text", None, None, None), ("image", "image/png", PNG, None),
        ("file", "application/pdf", None, "https://example.test/a.pdf")]
    # and back: the history shows the same content
    [shown] = agui.to_agui_messages([m])
    dumped = shown.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert dumped["content"][1] == {"type": "image", "source": {"type": "data", "value": PNG, "mimeType": "image/png"}}
    # a plain string stays a string
    req = agui.parse_run_input(agui_body("t2", "hello"))
    assert req.messages[0]["content"] == "hello"


def test_agui_provider_file_handles_and_bad_data_are_refused() -> None:
    handle = {"type": "image", "source": {"type": "file", "value": "file-abc"}}
    with pytest.raises(AdapterInputError, match="handle"):
        agui.parse_run_input(agui_body("t3", [handle]))
    bad = {"type": "image", "source": {"type": "data", "value": "%%%", "mimeType": "image/png"}}
    with pytest.raises(AdapterInputError, match="base64"):
        agui.parse_run_input(agui_body("t4", [bad]))


AISDK_PARTS = [{"type": "text", "text": "what is this?"},
               {"type": "file", "mediaType": "image/png", "url": f"data:image/png;base64,{PNG}"},
               {"type": "file", "mediaType": "application/pdf", "url": f"data:application/pdf;base64,{PDF}",
                "filename": "a.pdf"}]


def test_aisdk_file_parts_become_parts() -> None:
    req = aisdk.parse_chat_request({"id": "t5", "messages": [{"id": "u1", "role": "user", "parts": AISDK_PARTS}]})
    assert req.message is not None
    [m] = as_messages([req.message], Ids())
    assert m.content == "what is this?"
    assert [(p.type, p.media_type, p.data, p.filename) for p in m.parts or ()] == [
        ("text", None, None, None), ("image", "image/png", PNG, None), ("file", "application/pdf", PDF, "a.pdf")]
    with pytest.raises(AdapterInputError, match="base64"):
        aisdk.parse_chat_request({"id": "t6", "messages": [{"id": "u1", "role": "user", "parts": [
            {"type": "file", "mediaType": "image/png", "url": "data:image/png,rawtext"}]}]})


def test_a2a_raw_and_url_parts_become_parts_and_back() -> None:
    msg = A2AMessage(message_id="m", role=Role.ROLE_USER, parts=[
        Part(text="what is this?"), Part(raw=RAW, media_type="image/png"),
        Part(url="https://example.test/a.pdf", media_type="application/pdf", filename="a.pdf")])
    content, decisions = message_content(msg)
    assert decisions == []
    [m] = as_messages([{"role": "user", "content": content}], Ids())
    assert [(p.type, p.data, p.url) for p in m.parts or ()] == [
        ("text", None, None), ("image", PNG, None), ("file", None, "https://example.test/a.pdf")]
    back = a2a_parts(m)
    assert back[1].raw == RAW and back[1].media_type == "image/png" and back[2].filename == "a.pdf"
    # text only: a plain string
    assert message_content(A2AMessage(message_id="m", role=Role.ROLE_USER, parts=[Part(text="hi")]))[0] == "hi"


async def user_messages(deployment: Deployment, thread: str, run_id: str | None = None) -> list[Any]:
    store = await JetStreamEventStore.connect(deployment.nats_url)
    try:
        if run_id is not None:
            async with asyncio.timeout(LIMIT):
                await follow_run(store, thread, run_id, 0, lambda _c: None)
        log = [sc async for sc in store.read_thread(thread)]
    finally:
        await store.close()
    return [e.message for sc in log for e in sc.commit.events
            if type(e) is MessageAppended and e.message.role == "user"]


async def test_agui_route_takes_an_image_deployed(protocol_deployment: Deployment) -> None:
    thread = f"agimg{protocol_deployment.kind}"
    async with aiohttp.ClientSession(protocol_deployment.http_url) as http:
        async with http.post("/v1/ag-ui/agents/open/runs", json=agui_body(thread, AGUI_CONTENT)) as r:
            assert r.status == 200, await r.text()
            stream = await r.text()
        assert "RUN_FINISHED" in stream, stream[-500:]
        [user] = await user_messages(protocol_deployment, thread)
        assert user.content == "what is this?" and user.parts is not None and user.parts[1].data == PNG
        async with http.get(f"/v1/ag-ui/threads/{thread}/messages") as r:
            messages = (await r.json())["messages"]
        assert messages[0]["content"][1]["source"] == {"type": "data", "value": PNG, "mimeType": "image/png"}


async def test_aisdk_route_takes_file_parts_deployed(protocol_deployment: Deployment) -> None:
    thread = f"aiimg{protocol_deployment.kind}"
    body = {"id": thread, "messages": [{"id": f"{thread}u", "role": "user", "parts": AISDK_PARTS}]}
    async with aiohttp.ClientSession(protocol_deployment.http_url) as http:
        async with http.post("/v1/ai-sdk/agents/open/runs", json=body) as r:
            assert r.status == 200, await r.text()
            stream = await r.text()
        assert '"finish"' in stream, stream[-500:]
        [user] = await user_messages(protocol_deployment, thread)
        assert [p.type for p in user.parts or ()] == ["text", "image", "file"]
        async with http.get(f"/v1/ai-sdk/threads/{thread}/messages") as r:
            messages = (await r.json())["messages"]
        assert messages[0]["parts"] == AISDK_PARTS


async def test_a2a_file_parts_reach_the_run(protocol_deployment: Deployment) -> None:
    async with asyncio.timeout(LIMIT), open_remote(protocol_deployment) as s:
        http = httpx.AsyncClient(timeout=LIMIT)
        card = await A2ACardResolver(http, s.url, "/a2a/open/.well-known/agent-card.json").get_agent_card()
        client = await create_client(card, ClientConfig(streaming=False, httpx_client=http))
        msg = A2AMessage(message_id=uid("m"), role=Role.ROLE_USER, parts=[
            Part(text="what is this?"), Part(raw=RAW, media_type="image/png")])
        events = [ev async for ev in client.send_message(SendMessageRequest(message=msg))]
        task = events[-1].task
        assert task.history[0].parts[1].raw == RAW and task.history[0].parts[1].media_type == "image/png"
        log = [sc async for sc in s.store.read_run(task.id)]
        users = [e.message for sc in log for e in sc.commit.events
                 if type(e) is MessageAppended and e.message.role == "user"]
        assert users[0].content == "what is this?" and users[0].parts is not None
        assert users[0].parts[1].data == PNG
        assert fold_commits(log).runs[task.id].status == "done"
        await http.aclose()
