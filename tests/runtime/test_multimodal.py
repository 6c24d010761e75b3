"""Multimodal messages: content as parts (text, image, file). A plain string stays a string; a
list of parts is kept in `Message.parts` (its text joined in `content`); a binary over
`INLINE_BINARY_LIMIT` is kept in the Object Store by reference, never inline in a commit, and
every read puts it back; each provider receives the parts in its native form (checked on the
wire by the local fakes of tests/fakes/fake_providers.py); the HTTP route takes them, through a real
`agentlog serve` and `agentlog gateway` + `agentlog worker`."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from agentlog import AnthropicModel, GeminiModel, OpenAIResponsesModel
from agentlog.cli.demo import follow_run
from agentlog.eventlog.codec import decode_commit
from agentlog.eventlog.events import ContentPart, MessageAppended
from agentlog.eventlog.jetstream.payloads import INLINE_BINARY_LIMIT, has_refs
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.runtime import AgentSpec, App, Runtime
from agentlog.runtime.inputs.admission import as_messages, check_messages
from agentlog.runtime.models import ScriptedModel
from agentlog.runtime.models.openai import OpenAIChatModel, to_wire_messages
from agentlog.runtime.models.openai_sdk import OpenAISDKChatModel
from agentlog.runtime.replay.verify import verify_run

from tests.fakes.fake_providers import Answer, FakeProviders
from tests.support.runtime import events_of, logged, store  # noqa: F401  (fixture)
from tests.support.topology import Deployment

LIMIT = 30
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(64))).decode()
PDF = base64.b64encode(b"%PDF-1.4 tiny").decode()
PARTS = [{"type": "text", "text": "What is in "}, {"type": "text", "text": "these?"},
         {"type": "image", "media_type": "image/png", "data": PNG},
         {"type": "file", "media_type": "application/pdf", "data": PDF, "filename": "a.pdf"},
         {"type": "image", "url": "https://example.test/cat.jpg", "media_type": "image/jpeg"}]


class Ids:
    n = 0

    def new_id(self) -> str:
        self.n += 1
        return f"m{self.n}"


def test_plain_string_content_stays_a_string() -> None:
    [m] = as_messages({"role": "user", "content": "hello"}, Ids())
    assert m.content == "hello" and m.parts is None
    [m] = as_messages({"role": "user", "content": [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}]}, Ids())
    assert m.content == "hello" and m.parts is None  # text-only parts: plain text
    [m] = as_messages({"role": "user", "content": PARTS}, Ids())
    assert m.content == "What is in these?" and [p.type for p in m.parts or ()] == ["text", "text", "image", "file", "image"]


@pytest.mark.parametrize("part, why", [
    ({"type": "audio", "data": PNG}, "type"),
    ({"type": "image", "data": PNG}, "media_type"),
    ({"type": "image", "media_type": "image/png", "data": "not base64!"}, "base64"),
    ({"type": "image", "media_type": "image/png"}, "data"),
    ("text", "object"),
])
def test_bad_content_parts_are_refused(part: Any, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        check_messages([{"role": "user", "content": [part]}])


def test_openai_chat_receives_image_url_and_file_parts() -> None:
    [m] = as_messages({"role": "user", "content": PARTS}, Ids())
    [wire] = to_wire_messages([m])
    assert wire["content"][2] == {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
    assert wire["content"][3] == {"type": "file", "file": {"filename": "a.pdf",
                                                           "file_data": f"data:application/pdf;base64,{PDF}"}}


@pytest.fixture
async def fake() -> AsyncIterator[FakeProviders]:
    async with FakeProviders() as f:
        try:
            yield f
        finally:
            for model in f.clients:
                await model.aclose()


async def run_with(store: Any, model: Any, content: Any = PARTS) -> Any:
    rt = Runtime(store, agents=[AgentSpec(id="agent", model=model)])
    async with asyncio.timeout(LIMIT):
        result = await rt.run("agent", [{"role": "user", "content": content}])
    assert result.termination.type == "natural_end"
    return rt, result


async def test_anthropic_receives_images_and_files_as_native_blocks(store: Any, fake: FakeProviders) -> None:
    fake.script(Answer(text="a picture and a pdf"))
    model = AnthropicModel("claude-test", base_url=fake.anthropic_url, api_key="k")
    fake.clients.append(model)
    await run_with(store, model)
    assert fake.media_errors == []  # the fake checks the API's shapes
    [turn] = fake.requests[0].body["messages"]  # (prompt caching marks the last block)
    assert [{k: v for k, v in b.items() if k != "cache_control"} for b in turn["content"]] == [
        {"type": "text", "text": "What is in "}, {"type": "text", "text": "these?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PDF}},
        {"type": "image", "source": {"type": "url", "url": "https://example.test/cat.jpg"}},
    ]


async def test_responses_receives_input_image_and_input_file(store: Any, fake: FakeProviders) -> None:
    fake.script(Answer(text="a picture and a pdf"))
    model = OpenAIResponsesModel("gpt-test", base_url=fake.openai_url, api_key="k")
    fake.clients.append(model)
    await run_with(store, model)
    assert fake.media_errors == []
    [item] = [i for i in fake.requests[0].body["input"] if i.get("role") == "user"]
    assert item["content"] == [
        {"type": "input_text", "text": "What is in "}, {"type": "input_text", "text": "these?"},
        {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"},
        {"type": "input_file", "filename": "a.pdf", "file_data": f"data:application/pdf;base64,{PDF}"},
        {"type": "input_image", "image_url": "https://example.test/cat.jpg"},
    ]


async def test_gemini_receives_inline_data_and_file_data_parts(store: Any, fake: FakeProviders) -> None:
    fake.script(Answer(text="a picture and a pdf"))
    model = GeminiModel("gemini-test", base_url=fake.gemini_url, api_key="k")
    fake.clients.append(model)
    await run_with(store, model)
    assert fake.media_errors == []
    [turn] = fake.requests[0].body["contents"]
    assert [gemini_wire(p) for p in turn["parts"]] == [
        {"text": "What is in "}, {"text": "these?"},
        {"inlineData": {"mimeType": "image/png", "data": PNG}},
        {"inlineData": {"mimeType": "application/pdf", "data": PDF}},
        {"fileData": {"fileUri": "https://example.test/cat.jpg", "mimeType": "image/jpeg"}},
    ]


@pytest.mark.parametrize("client", ["aiohttp", "sdk"])
async def test_openai_chat_clients_send_image_url_and_file_parts(store: Any, fake: FakeProviders, client: str) -> None:
    """Both Chat Completions clients (`openai:` on aiohttp, and on the SDK) put the parts on
    the wire as the API takes them."""
    fake.script(Answer(text="a picture and a pdf"))
    if client == "aiohttp":
        model: Any = OpenAIChatModel("gpt-test", base_url=fake.openai_url, api_key="k")
    else:
        model = OpenAISDKChatModel("gpt-test", base_url=fake.openai_url, api_key="k")
    fake.clients.append(model)
    await run_with(store, model)
    assert fake.media_errors == [] and fake.requests[0].path.endswith("/chat/completions")
    [user] = [m for m in fake.requests[0].body["messages"] if m["role"] == "user"]
    assert [c["type"] for c in user["content"]] == ["text", "text", "image_url", "file", "image_url"]


async def test_anthropic_fake_refuses_an_image_the_api_would_refuse(store: Any, fake: FakeProviders) -> None:
    """The fakes' shape checks have teeth: an `image` whose media type is not an image is a 400,
    which the run reports as a refused model request."""
    fake.script(Answer(text="never"))
    model = AnthropicModel("claude-test", base_url=fake.anthropic_url, api_key="k")
    fake.clients.append(model)
    rt = Runtime(store, agents=[AgentSpec(id="agent", model=model)])
    async with asyncio.timeout(LIMIT):
        result = await rt.run("agent", [{"role": "user", "content": [
            {"type": "image", "media_type": "text/plain", "data": PNG}]}])
    assert result.termination.type == "error" and fake.media_errors, result.termination


def gemini_wire(part: dict[str, Any]) -> dict[str, Any]:
    """A Gemini part as the API reads it: the SDK writes bytes url-safe base64 and may keep
    snake_case keys inside a blob (the API's JSON parser takes both spellings)."""
    camel = {"mime_type": "mimeType", "file_uri": "fileUri"}
    if "fileData" in part:
        return {"fileData": {camel.get(k, k): v for k, v in part["fileData"].items()}}
    if "inlineData" not in part:
        return part
    blob = {camel.get(k, k): v for k, v in part["inlineData"].items()}
    data = base64.b64encode(base64.urlsafe_b64decode(blob["data"])).decode()
    return {"inlineData": {"mimeType": blob["mimeType"], "data": data}}


async def test_large_image_is_kept_in_the_object_store_by_reference(store: JetStreamEventStore) -> None:
    big = base64.b64encode(bytes(i % 251 for i in range(60_000))).decode()
    assert len(big) > INLINE_BINARY_LIMIT
    model = ScriptedModel(["a big picture"])
    rt, result = await run_with(store, model, [{"type": "text", "text": "look"},
                                               {"type": "image", "media_type": "image/png", "data": big},
                                               {"type": "image", "media_type": "image/png", "data": PNG}])
    # the model got the bytes
    [sent] = [m for m in model.requests[0].messages if m.role == "user"]
    assert sent.parts is not None and sent.parts[1].data == big and sent.parts[2].data == PNG
    # the log holds a reference for the big one (the small one stays inline) ...
    log = await logged(rt, result)
    js = store.nc.jetstream()
    raws = [await js.get_msg(store.stream, sc.seq, direct=True) for sc in log]
    assert all(big not in r.data.decode() for r in raws)
    [raw] = [decode_commit(r.data) for r in raws if has_refs(r.data)]
    [user] = [e.message for e in raw.events if type(e) is MessageAppended and e.message.role == "user"]
    assert user.parts is not None and user.parts[1].data is None and user.parts[1].data_ref is not None
    assert user.parts[1].data_ref.size == 60_000 and user.parts[2].data == PNG
    # ... and every read puts the bytes back
    [read] = [e.message for e in events_of(log, "MessageAppended") if e.message.role == "user"]
    assert read.parts == [ContentPart(type="text", text="look"),
                          ContentPart(type="image", media_type="image/png", data=big),
                          ContentPart(type="image", media_type="image/png", data=PNG)]
    report = await verify_run(store, result.run_id, App(agents=[rt.agents.get("agent")]))
    assert report.ok, report.divergence


async def test_http_runs_take_content_parts_deployed(protocol_deployment: Deployment) -> None:
    """POST /v1/runs with an image part, through `agentlog serve` and gateway + worker: the
    message keeps its parts (the big image by reference in the log), and bad parts are a 400."""
    big = base64.b64encode(bytes(i % 253 for i in range(40_000))).decode()
    content = [{"type": "text", "text": "what is this?"}, {"type": "image", "media_type": "image/png", "data": big}]
    async with aiohttp.ClientSession(protocol_deployment.http_url) as http:
        async with http.post("/v1/runs", json={"agent_id": "open", "messages": [
                {"role": "user", "content": [{"type": "image", "media_type": "image/png", "data": "%%%"}]}]}) as r:
            assert r.status == 400, await r.text()
            assert (await r.json())["code"] == "invalid_input"
        async with http.post("/v1/runs", json={"agent_id": "open", "messages": [
                {"role": "user", "content": content}, "and a plain string"]}) as r:
            assert r.status == 202, await r.text()
            started = await r.json()
        store = await JetStreamEventStore.connect(protocol_deployment.nats_url)
        try:
            async with asyncio.timeout(LIMIT * 2):
                await follow_run(store, started["thread_id"], started["run_id"], 0, lambda _c: None)
            log = [sc async for sc in store.read_thread(started["thread_id"])]
            js = store.nc.jetstream()
            raws = [await js.get_msg(store.stream, sc.seq, direct=True) for sc in log]
        finally:
            await store.close()
        assert all(big not in r.data.decode() for r in raws)
        users = [e.message for e in events_of(log, "MessageAppended") if e.message.role == "user"]
        assert users[0].content == "what is this?" and users[0].parts is not None
        assert users[0].parts[1].data == big
        assert users[1].content == "and a plain string" and users[1].parts is None
        async with http.get(f"/v1/threads/{started['thread_id']}/messages") as r:
            shown = [m["message"] for m in (await r.json())["messages"]]
        assert shown[0]["parts"][1]["media_type"] == "image/png"
        assert "parts" not in shown[1]



