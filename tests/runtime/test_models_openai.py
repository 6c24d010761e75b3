"""OpenAIChatModel against a local fake server: streaming, tool calls, usage, retries, timeouts,
protocol errors, fallback and the wire mapping of requests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from agentlog.eventlog.events import Message, ToolCall, Usage
from agentlog.runtime.models import (
    Model,
    ModelDone,
    ModelProtocolError,
    ModelRequest,
    ModelRequestRejected,
    ModelUnavailable,
    OpenAIChatModel,
    RetryPolicy,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    complete,
)

from tests.fakes.fake_openai import FakeOpenAI, Reply, chunk

FAST = RetryPolicy(max_attempts=3, base_delay=0.001, max_delay=0.002)


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture
async def client(fake: FakeOpenAI) -> AsyncIterator[OpenAIChatModel]:
    async with OpenAIChatModel("gpt-test", base_url=fake.url, api_key="sk-test", retry=FAST) as model:
        yield model


def req(*messages: Message, tools: list[ToolSpec] | None = None, **options: object) -> ModelRequest:
    return ModelRequest(
        model="ignored-when-client-has-one",
        messages=list(messages) or [Message(id="u1", role="user", content="hi")],
        tools=tools or [],
        options=dict(options),
    )


async def collect(model: Model, request: ModelRequest) -> list:
    async with asyncio.timeout(10):
        return [c async for c in model.stream(request)]


def test_is_a_model() -> None:
    assert isinstance(OpenAIChatModel("m", api_key="k"), Model)


async def test_streams_text_and_usage(fake: FakeOpenAI, client: OpenAIChatModel) -> None:
    fake.script(Reply.text("Hello there, world!", chunks=3, usage=(12, 4)))
    chunks = await collect(client, req())
    deltas = [c.text for c in chunks if isinstance(c, TextDelta)]
    assert len(deltas) == 3 and "".join(deltas) == "Hello there, world!"
    assert isinstance(chunks[-1], ModelDone)
    response = chunks[-1].response
    assert response.text == "Hello there, world!"
    assert response.usage == Usage(input_tokens=12, output_tokens=4)
    assert response.stop_reason == "stop"
    assert response.model == "gpt-test"
    assert response.tool_calls == []
    [sent] = fake.requests
    assert sent.headers["Authorization"] == "Bearer sk-test"
    assert sent.body["stream"] is True
    assert sent.body["stream_options"] == {"include_usage": True}
    assert sent.model == "gpt-test"


async def test_sse_lines_split_across_writes(fake: FakeOpenAI, client: OpenAIChatModel) -> None:
    reply = Reply.text("split into tiny network writes", chunks=4)
    reply.write_size = 5
    fake.script(reply)
    response = await complete(client, req())
    assert response.text == "split into tiny network writes"
    assert response.usage == Usage(input_tokens=7, output_tokens=3)


async def test_streamed_tool_call_arguments(fake: FakeOpenAI, client: OpenAIChatModel) -> None:
    fake.script(
        Reply.tool_calls(
            [
                ("call_a", "get_weather", '{"city": "Paris", "units": "metric"}'),
                ("call_b", "get_time", '{"tz": "Europe/Paris"}'),
            ],
            fragments=4,
        )
    )
    chunks = await collect(client, req())
    deltas = [c for c in chunks if isinstance(c, ToolCallDelta)]
    assert deltas[0] == ToolCallDelta(index=0, call_id="call_a", name="get_weather", arguments_delta="")
    assert len([d for d in deltas if d.index == 0 and d.arguments_delta]) == 4
    assert "".join(d.arguments_delta for d in deltas if d.index == 1) == '{"tz": "Europe/Paris"}'
    response = chunks[-1].response
    assert response.tool_calls == [
        ToolCall(id="call_a", name="get_weather", arguments={"city": "Paris", "units": "metric"}),
        ToolCall(id="call_b", name="get_time", arguments={"tz": "Europe/Paris"}),
    ]
    assert response.stop_reason == "tool_calls"
    assert response.usage == Usage(input_tokens=11, output_tokens=5)


async def test_unparseable_tool_arguments_are_a_protocol_error(
    fake: FakeOpenAI, client: OpenAIChatModel
) -> None:
    fake.script(Reply.tool_calls([("c1", "f", '{"city": "Par')]))
    with pytest.raises(ModelProtocolError, match="not valid JSON"):
        await collect(client, req())
    assert len(fake.requests) == 1


async def test_429_then_success_is_retried(fake: FakeOpenAI, client: OpenAIChatModel) -> None:
    fake.script(Reply.error(429, retry_after="0"), Reply.error(429), Reply.text("finally"))
    response = await complete(client, req())
    assert response.text == "finally"
    assert len(fake.requests) == 3


async def test_500_exhausted_is_model_unavailable(fake: FakeOpenAI, client: OpenAIChatModel) -> None:
    fake.always(Reply.error(500, '{"error": {"message": "boom inside"}}'))
    with pytest.raises(ModelUnavailable) as info:
        await collect(client, req())
    message = str(info.value)
    assert "HTTP 500" in message and "boom inside" in message and "3 attempt(s)" in message
    assert info.value.retryable
    assert len(fake.requests) == 3


async def test_other_4xx_is_rejected_without_retry(fake: FakeOpenAI, client: OpenAIChatModel) -> None:
    fake.always(Reply.error(400, '{"error": {"message": "bad param"}}'))
    with pytest.raises(ModelRequestRejected, match=r"HTTP 400.*bad param"):
        await collect(client, req())
    assert len(fake.requests) == 1


async def test_timeout_before_headers_is_retried_then_unavailable(fake: FakeOpenAI) -> None:
    fake.always(Reply.hanging())
    retry = RetryPolicy(max_attempts=2, base_delay=0.001, max_delay=0.002)
    async with OpenAIChatModel(
        "gpt-test", base_url=fake.url, api_key="k", retry=retry, read_timeout=0.2, timeout=5
    ) as model:
        with pytest.raises(ModelUnavailable, match="timed out"):
            await collect(model, req())
    assert len(fake.requests) == 2


async def test_stall_after_output_is_not_retried(fake: FakeOpenAI) -> None:
    events = [chunk({"role": "assistant", "content": "partial "}), chunk({"content": "answer"})]
    fake.script(Reply.hanging(1, events=events), Reply.text("should not be requested"))
    seen: list[str] = []
    async with OpenAIChatModel("m", base_url=fake.url, api_key="k", retry=FAST, read_timeout=0.2) as model:
        with pytest.raises(ModelUnavailable, match="mid-stream"):
            async with asyncio.timeout(10):
                async for c in model.stream(req()):
                    if isinstance(c, TextDelta):
                        seen.append(c.text)
    assert seen == ["partial "]
    assert len(fake.requests) == 1


async def test_stream_cut_before_any_output_is_retried(fake: FakeOpenAI, client: OpenAIChatModel) -> None:
    fake.script(Reply.raw(chunk({"role": "assistant", "content": ""}), done=False), Reply.text("ok"))
    assert (await complete(client, req())).text == "ok"
    assert len(fake.requests) == 2


async def test_malformed_chunk_is_protocol_error(fake: FakeOpenAI, client: OpenAIChatModel) -> None:
    fake.script(Reply.raw(chunk({"content": "fine"}), "{not json"))
    with pytest.raises(ModelProtocolError, match="malformed stream chunk"):
        await collect(client, req())
    assert len(fake.requests) == 1


async def test_fallback_model_after_primary_exhausted(fake: FakeOpenAI) -> None:
    fake.always(Reply.error(503), model="primary")
    fake.always(Reply.error(500), model="second")
    fake.script(Reply.text("from the backup"), model="third")
    retry = RetryPolicy(max_attempts=2, base_delay=0.001, max_delay=0.002)
    async with OpenAIChatModel(
        "primary", base_url=fake.url, api_key="k", retry=retry, fallback_models=["second", "third"]
    ) as model:
        response = await complete(model, req())
    assert response.text == "from the backup"
    assert response.model == "third"
    assert fake.models_requested() == ["primary", "primary", "second", "second", "third"]


async def test_all_models_exhausted_names_each(fake: FakeOpenAI) -> None:
    fake.always(Reply.error(502))
    retry = RetryPolicy(max_attempts=1)
    async with OpenAIChatModel(
        "a", base_url=fake.url, api_key="k", retry=retry, fallback_models=["b"]
    ) as model:
        with pytest.raises(ModelUnavailable) as info:
            await collect(model, req())
    assert "'a': 1 attempt(s)" in str(info.value) and "'b': 1 attempt(s)" in str(info.value)
    assert info.value.models == ["a", "b"]  # type: ignore[attr-defined]


async def test_connection_refused_is_unavailable() -> None:
    fake = FakeOpenAI()
    url = await fake.start()
    await fake.close()
    async with OpenAIChatModel("m", base_url=url, api_key="k", retry=FAST) as model:
        with pytest.raises(ModelUnavailable, match="3 attempt"):
            await collect(model, req())


async def test_request_mapping(fake: FakeOpenAI, client: OpenAIChatModel) -> None:
    fake.script(Reply.text("done"))
    call = ToolCall(id="call_1", name="get_weather", arguments={"city": "Paris"})
    messages = [
        Message(id="s", role="system", content="You are terse."),
        Message(id="u", role="user", content="Weather in Paris?"),
        Message(id="a", role="assistant", tool_calls=[call]),
        Message(id="t", role="tool", content='{"temp": 21}', tool_call_id="call_1"),
        Message(id="a2", role="assistant", content="21C.", visibility="internal"),
    ]
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tools = [
        ToolSpec(name="get_weather", description="Current weather", parameters=schema),
        ToolSpec(name="noop"),
    ]
    await complete(client, req(*messages, tools=tools, temperature=0.2, max_tokens=50))
    body = fake.requests[0].body
    assert body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
        {"role": "assistant", "content": "21C."},
    ]
    assert json.loads(body["messages"][2]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "Current weather", "parameters": schema},
        },
        {
            "type": "function",
            "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}},
        },
    ]
    assert body["temperature"] == 0.2 and body["max_tokens"] == 50
    assert body["model"] == "gpt-test"


async def test_request_model_used_when_client_has_none(fake: FakeOpenAI) -> None:
    fake.script(Reply.text("ok"))
    async with OpenAIChatModel(base_url=fake.url, api_key="k", retry=FAST) as model:
        response = await complete(model, ModelRequest(model="from-request", messages=[]))
    assert fake.models_requested() == ["from-request"]
    assert response.model == "from-request"
    assert "tools" not in fake.requests[0].body


async def test_tool_message_without_call_id_rejected_before_sending(
    fake: FakeOpenAI, client: OpenAIChatModel
) -> None:
    with pytest.raises(ModelRequestRejected, match="tool_call_id"):
        await collect(client, req(Message(id="t", role="tool", content="x")))
    assert fake.requests == []


async def test_api_key_from_environment(fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    fake.script(Reply.text("ok"))
    async with OpenAIChatModel("m", base_url=fake.url, retry=FAST) as model:
        await complete(model, req())
    assert fake.requests[0].headers["Authorization"] == "Bearer sk-env"


async def test_session_is_reused_and_closed(fake: FakeOpenAI) -> None:
    fake.always(Reply.text("ok"))
    model = OpenAIChatModel("m", base_url=fake.url, api_key="k", retry=FAST)
    await complete(model, req())
    session = model._session
    await complete(model, req())
    assert model._session is session and session is not None
    await model.aclose()
    assert session.closed and model._session is None


def test_retry_policy_backoff_and_retry_after() -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=5.0, jitter=0.0, max_retry_after=30)
    assert [policy.delay(n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert policy.delay(1, retry_after=12.5) == 12.5
    assert policy.delay(1, retry_after=999) == 30
    jittered = RetryPolicy(base_delay=1.0, jitter=0.5)
    assert all(0.5 <= jittered.delay(1) <= 1.0 for _ in range(50))
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
