"""The providers on their official SDKs (Anthropic Messages, OpenAI Responses, Gemini), end to end:
each SDK pointed (base_url) at a local server on loopback speaking that provider's wire format
(tests/fakes/fake_providers.py, SSE streams included), driven by a Runtime on a real nats-server, and
each recorded run checked by verified replay. Never the network."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentlog import AnthropicModel, GeminiModel, ModelPrices, OpenAIResponsesModel
from agentlog.eventlog.events import Message
from agentlog.runtime import AgentSpec, App, Runtime, tool
from agentlog.runtime.live import MemoryLiveSink
from agentlog.runtime.models import ModelRequest, ToolSpec, complete
from agentlog.runtime.replay.verify import verify_run

from tests.fakes.fake_providers import Answer, FakeProviders
from tests.support.runtime import events_of, logged, store  # noqa: F401  (fixture)

LIMIT = 30
ROOT = Path(__file__).resolve().parents[2]
PROVIDERS = ["anthropic", "responses", "gemini"]


def make_model(provider: str, fake: FakeProviders, **kw: Any) -> Any:
    model: Any
    if provider == "anthropic":
        model = AnthropicModel("claude-test", base_url=fake.anthropic_url, api_key="k", **kw)
    elif provider == "responses":
        model = OpenAIResponsesModel("gpt-test", base_url=fake.openai_url, api_key="k", **kw)
    else:
        model = GeminiModel("gemini-test", base_url=fake.gemini_url, api_key="k", **kw)
    fake.clients.append(model)
    return model


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@pytest.fixture
async def fake() -> AsyncIterator[FakeProviders]:
    async with FakeProviders() as f:
        try:
            yield f
        finally:
            for model in f.clients:  # the SDKs' HTTP pools close in the loop that opened them
                await model.aclose()


def runtime(store: Any, model: Any, **spec: Any) -> Runtime:
    agent = AgentSpec(id="agent", model="m", tools=["add"], retry={"max_attempts": 3, "backoff_ms": 0}, **spec)
    return Runtime(store, agents=[agent], tools=[add], models={"m": model})


async def run_and_verify(rt: Runtime, model: Any, messages: Any = "what is 1 + 2?") -> tuple[Any, list[Any]]:
    async with asyncio.timeout(LIMIT):
        result = await rt.run("agent", messages)
        log = await logged(rt, result)
        report = await verify_run(log, result.run_id, App(agents=[rt.agents.get("agent")], tools=[add]))
    assert report.ok, report
    return result, log


def tool_result_in(provider: str, body: dict[str, Any]) -> Any:
    """The tool result as the provider's next request carries it (its native form)."""
    if provider == "anthropic":
        return [b for m in body["messages"] for b in m["content"] if b.get("type") == "tool_result"]
    if provider == "responses":
        return [i for i in body["input"] if i.get("type") == "function_call_output"]
    return [p["functionResponse"] for c in body["contents"] for p in c["parts"] if "functionResponse" in p]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_provider_tool_round_trip_streams_records_and_replays(store: Any, fake: FakeProviders,
                                                                   provider: str) -> None:
    fake.script(Answer(text="let me add", calls=[("add", {"a": 1, "b": 2})], input_tokens=20, cache_read=8),
                Answer(text="the sum is 3", input_tokens=30, output_tokens=4))
    model = make_model(provider, fake)
    rt = runtime(store, model)
    result, log = await run_and_verify(rt, model)
    assert result.termination.type == "natural_end"
    inferences = events_of(log, "InferenceCompleted")
    assert [i.usage.input_tokens for i in inferences] == [20, 30]
    assert inferences[0].usage.cache_read_tokens == 8 and inferences[1].usage.output_tokens == 4
    completed = events_of(log, "ToolCallCompleted")
    assert completed[0].result == 3
    # the second request sends the call and its result back in the provider's own shape
    sent = tool_result_in(provider, fake.requests[1].body)
    assert len(sent) == 1 and "3" in str(sent[0])
    answer = [e.message for e in events_of(log, "MessageAppended") if e.message.role == "assistant"][-1]
    assert answer.content == "the sum is 3"


def reasoning_in(provider: str, body: dict[str, Any]) -> list[Any]:
    """The reasoning a request sends back, in the provider's own shape."""
    if provider == "anthropic":
        return [b for m in body["messages"] for b in m["content"] if b.get("type") == "thinking"]
    if provider == "responses":
        return [i for i in body["input"] if i.get("type") == "reasoning"]
    return [p for c in body["contents"] for p in c["parts"] if "thoughtSignature" in p]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_provider_reasoning_is_recorded_sent_back_and_replayed(store: Any, fake: FakeProviders,
                                                                     provider: str) -> None:
    fake.script(Answer(thinking="the user wants a sum", calls=[("add", {"a": 1, "b": 2})]), Answer(text="3"))
    live = MemoryLiveSink()
    agent = AgentSpec(id="agent", model="m", tools=["add"])
    rt = Runtime(store, agents=[agent], tools=[add], models={"m": make_model(provider, fake)}, live=live)
    async with asyncio.timeout(LIMIT):
        result = await rt.run("agent", "what is 1 + 2?")
        log = await logged(rt, result)
        report = await verify_run(log, result.run_id, App(agents=[rt.agents.get("agent")], tools=[add]))
    assert report.ok, report
    first = [e.message for e in events_of(log, "MessageAppended") if e.message.role == "assistant"][0]
    assert first.reasoning and first.reasoning[0].text == "the user wants a sum"
    assert {r.provider for r in first.reasoning} == {"openai" if provider == "responses" else provider}
    streamed = live.of_type("reasoning_delta")  # live, under the message id the commit has
    assert "".join(d["text"] for d in streamed) == "the user wants a sum"
    assert {d["message_id"] for d in streamed} == {first.id}
    sent = reasoning_in(provider, fake.requests[1].body)
    assert sent, fake.requests[1].body  # the next request carries it back, signed / encrypted
    if provider == "anthropic":
        assert sent[0] == {"type": "thinking", "thinking": "the user wants a sum", "signature": "sig-1"}
    elif provider == "responses":
        assert sent[0]["id"] == "rs_0" and sent[0]["encrypted_content"] == "sig-1"
    else:  # the thought and the call's part each keep their signature
        assert len(sent) == 2 and any("functionCall" in p for p in sent)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_provider_rate_limit_is_retried_after_its_retry_after(store: Any, fake: FakeProviders,
                                                                    provider: str) -> None:
    fake.script(Answer.failure(429, "slow down", retry_after="0"), Answer(text="ok"))
    rt = runtime(store, make_model(provider, fake))
    result, log = await run_and_verify(rt, None)
    assert result.termination.type == "natural_end" and len(fake.requests) == 2


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_provider_auth_error_fails_the_run_typed_without_retrying(store: Any, fake: FakeProviders,
                                                                        provider: str) -> None:
    fake.script(Answer.failure(401, "bad key"))
    rt = runtime(store, make_model(provider, fake))
    async with asyncio.timeout(LIMIT):
        result = await rt.run("agent", "hi")
    assert result.termination.type == "error" and result.termination.code == "model_auth_failed"
    assert len(fake.requests) == 1  # another attempt would get the same answer


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_provider_context_overflow_compacts_and_retries_once(store: Any, fake: FakeProviders,
                                                                   provider: str) -> None:
    # refused as too long, then the summary request, then the retried inference
    fake.script(Answer.overflow(), Answer(text="they talked about numbers"), Answer(text="done"))
    rt = runtime(store, make_model(provider, fake))
    result, log = await run_and_verify(rt, None, ["first " * 50, "second " * 50, "third " * 50, "so?"])
    assert result.termination.type == "natural_end"
    compacted = events_of(log, "ContextCompacted")
    assert len(compacted) == 1 and compacted[0].reason == "overflow"
    assert compacted[0].summary == "they talked about numbers"
    assert len(events_of(log, "InferenceCompleted")) == 1 and len(fake.requests) == 3
    assert "they talked about numbers" in str(fake.requests[2].body)  # the retry sends the summary


async def test_overflow_that_cannot_be_compacted_fails_the_run_typed(store: Any, fake: FakeProviders) -> None:
    fake.script(Answer.overflow())
    rt = runtime(store, make_model("anthropic", fake))
    async with asyncio.timeout(LIMIT):
        result = await rt.run("agent", "one long message")
    assert result.termination.code == "context_overflow" and len(fake.requests) == 1


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_provider_max_tokens_cutoff_is_continued_bounded_and_replays(store: Any, fake: FakeProviders,
                                                                           provider: str) -> None:
    fake.script(Answer(text="part one", truncated=True), Answer(text="part two", truncated=True),
                Answer(text="part three", truncated=True))
    rt = runtime(store, make_model(provider, fake), max_continuations=2)
    result, log = await run_and_verify(rt, None)
    assert result.termination.type == "natural_end"
    inferences = events_of(log, "InferenceCompleted")
    assert len(inferences) == 3  # the first answer and two continuations, then the bound
    internal = [e.message for e in events_of(log, "MessageAppended") if e.message.visibility == "internal"]
    assert len(internal) == 2 and all(m.role == "user" for m in internal)
    assistant = [e.message.content for e in events_of(log, "MessageAppended") if e.message.role == "assistant"]
    assert assistant == ["part one", "part two", "part three"]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_provider_cost_is_recorded_per_inference_and_summed_per_run(store: Any, fake: FakeProviders,
                                                                          provider: str) -> None:
    fake.script(Answer(calls=[("add", {"a": 1, "b": 2})], input_tokens=1000, cache_read=400, output_tokens=100),
                Answer(text="3", input_tokens=2000, output_tokens=10))
    prices = ModelPrices(input=3.0, output=15.0, cache_read=0.3)
    rt = runtime(store, make_model(provider, fake, prices=prices))
    result, log = await run_and_verify(rt, None)
    costs = [e.cost for e in events_of(log, "InferenceCompleted")]
    assert costs == [pytest.approx((600 * 3 + 400 * 0.3 + 100 * 15) / 1e6), pytest.approx((2000 * 3 + 10 * 15) / 1e6)]
    finished = events_of(log, "RunFinished")[0]
    assert finished.cost == pytest.approx(sum(costs))


async def test_anthropic_request_has_cache_breakpoints_and_thinking(fake: FakeProviders) -> None:
    fake.script(Answer(text="hi", cache_write=12, input_tokens=20))
    model = make_model("anthropic", fake, thinking_budget=1024)
    request = ModelRequest(model="x", tools=[ToolSpec(name="add")], messages=[
        _msg("s", "system", "be brief"), _msg("u", "user", "hello")])
    async with asyncio.timeout(LIMIT):
        response = await complete(model, request)
    body = fake.requests[0].body
    assert body["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert body["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024} and body["stream"] is True
    assert response.usage.cache_write_tokens == 12 and response.usage.input_tokens == 20


async def test_responses_request_is_stateless_input_items(fake: FakeProviders) -> None:
    fake.script(Answer(text="hi", reasoning=7, output_tokens=9))
    model = make_model("responses", fake, reasoning_effort="low")
    request = ModelRequest(model="x", options={"max_tokens": 50}, messages=[
        _msg("s", "system", "be brief"), _msg("u", "user", "hello")])
    async with asyncio.timeout(LIMIT):
        response = await complete(model, request)
    body = fake.requests[0].body
    assert body["instructions"] == "be brief" and body["store"] is False
    assert body["input"] == [{"role": "user", "content": "hello"}]
    assert body["max_output_tokens"] == 50 and body["reasoning"] == {"effort": "low", "summary": "auto"}
    assert body["include"] == ["reasoning.encrypted_content"]  # stateless: reasoning comes back to us
    assert response.usage.reasoning_tokens == 7


async def test_gemini_calls_without_ids_get_stable_derived_ids(fake: FakeProviders) -> None:
    fake.script(Answer(calls=[("add", {"a": 1, "b": 2})]), Answer(calls=[("add", {"a": 1, "b": 2})]))
    model = make_model("gemini", fake)
    request = ModelRequest(model="x", messages=[_msg("u", "user", "hello")])
    async with asyncio.timeout(LIMIT):
        first, second = await complete(model, request), await complete(model, request)
    assert first.tool_calls[0].id == second.tool_calls[0].id and first.tool_calls[0].id.startswith("call_")
    assert fake.requests[0].path.endswith("/models/gemini-test:streamGenerateContent")


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_provider_server_error_is_a_retryable_unavailable(fake: FakeProviders, provider: str) -> None:
    fake.script(Answer.failure(503, "down"), Answer(text="fine"))
    model = make_model(provider, fake)
    async with asyncio.timeout(LIMIT):
        with pytest.raises(Exception) as info:
            await complete(model, ModelRequest(model="x", messages=[_msg("u", "user", "hi")]))
    assert info.value.code == "model_unavailable" and info.value.retryable  # the loop may retry it


def _msg(id: str, role: Any, content: str) -> Message:
    return Message(id=id, role=role, content=content)



def test_bench_models_quick_compares_the_two_chat_clients() -> None:
    """The bench behind the models guide's choice of client for `openai:` ids keeps its contract (the
    figures themselves are the docs' measurements record, measured on a quiet machine, never asserted)."""
    proc = subprocess.run([sys.executable, "scripts/bench_models.py", "--quick", "--requests", "3"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["bench"] == "models" and doc["requests"] == 3
    for key in ("aiohttp_short_p50_ms", "sdk_short_p50_ms", "aiohttp_long_p50_ms", "sdk_long_p50_ms",
                "sdk_over_aiohttp_short", "sdk_over_aiohttp_long"):
        assert doc[key] > 0, (key, doc)


def test_readme_provider_config_loads_with_pools_prices_and_provider_ids(tmp_path: Path) -> None:
    """The models guide's provider config block is a valid file: provider ids become
    models (Anthropic thinking, prices), the pool resolves, the budget condition parses."""
    from agentlog.runtime.config import load_config
    from agentlog.runtime.stop import Budget

    from tests.support.docs import all_blocks

    [block] = [b.code for b in all_blocks("yaml") if "pools:" in b.code]
    path = tmp_path / "providers.yaml"
    path.write_text(block)
    app = load_config(path)
    assert isinstance(app.models["claude"], AnthropicModel) and app.models["claude"].thinking_budget == 2048
    assert app.models["claude"].prices == ModelPrices(input=3, output=15, cache_read=0.3, cache_write=3.75)
    assert isinstance(app.models["gpt"], OpenAIResponsesModel)
    assert isinstance(app.models["gemini:gemini-2.5-flash"], GeminiModel)
    assistant, quick = app.agents
    assert assistant.pool is not None and assistant.pool.models == ["claude", "gpt", "gemini:gemini-2.5-flash"]
    assert assistant.model == "claude" and isinstance(assistant.stop_conditions[0], Budget)
    assert quick.model == "gemini:gemini-2.5-flash"


@pytest.mark.parametrize(("yaml", "message"), [
    ('models: {m: "nope:x"}\nagents: [{id: a, model: m}]', "not a provider:model id"),
    ("agents: [{id: a}]", "needs a model or a pool"),
    ("agents: [{id: a, pool: missing}]", "unknown pool"),
    ('pools: {p: {models: ["anthropic:c", ghost]}}\nagents: [{id: a, pool: p}]', "unknown model 'ghost'"),
    ("agents: [{id: a, model: 'anthropic:c', stop_conditions: [{type: budget}]}]", "max_tokens or max_cost"),
])
def test_config_errors_for_provider_ids_pools_and_budgets(tmp_path: Path, yaml: str, message: str) -> None:
    from agentlog.runtime.config import ConfigError, load_config

    path = tmp_path / "bad.yaml"
    path.write_text("version: 1\n" + yaml + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert message in str(info.value) and "bad.yaml" in str(info.value)


@pytest.mark.parametrize("client", ["aiohttp", "sdk"])
@pytest.mark.parametrize(("answer", "error", "code"), [
    (Answer.failure(429, "slow down", retry_after="3"), "ModelRateLimited", "model_rate_limited"),
    (Answer.failure(401, "bad key"), "ModelAuthError", "model_auth_failed"),
    (Answer.overflow(), "ContextOverflow", "context_overflow"),
    (Answer.failure(400, "unknown parameter"), "ModelRequestRejected", "model_request_rejected"),
])
async def test_openai_chat_clients_raise_the_same_typed_errors(fake: FakeProviders, client: str, answer: Answer,
                                                               error: str, code: str) -> None:
    """Both Chat Completions clients (`openai:` and `openai-sdk:`) map statuses like the other
    providers, one attempt each under the loop (`single_attempt` for the self-retrying one)."""
    from agentlog.runtime.models import OpenAIChatModel, OpenAISDKChatModel

    fake.script(answer)
    base: Any = (OpenAIChatModel if client == "aiohttp" else OpenAISDKChatModel)(
        "gpt-test", base_url=fake.openai_url, api_key="k")
    fake.clients.append(base)
    model = base.single_attempt() if client == "aiohttp" else base
    async with asyncio.timeout(LIMIT):
        with pytest.raises(Exception) as info:
            await complete(model, ModelRequest(model="x", messages=[_msg("u", "user", "hi")]))
    assert type(info.value).__name__ == error and info.value.code == code
    if error == "ModelRateLimited":
        assert info.value.retry_after == 3 and info.value.retryable
    assert len(fake.requests) == 1


async def test_openai_chat_client_records_the_reasoning_content_of_compatible_servers() -> None:
    """`openai:` against a compatible server that streams `reasoning_content` (vLLM, DeepSeek):
    the reasoning streams as deltas and lands in the response, and is not sent back."""
    from agentlog.runtime.models import OpenAIChatModel, ReasoningDelta

    from tests.fakes.fake_openai import FakeOpenAI, Reply, chunk, usage_chunk

    async with FakeOpenAI() as fake:
        fake.script(Reply(events=[chunk({"reasoning_content": "think "}), chunk({"reasoning_content": "more"}),
                                  chunk({"content": "answer"}), chunk(finish_reason="stop"), usage_chunk(3, 4)]),
                    Reply.text("again"))
        model = OpenAIChatModel("m", base_url=fake.url, api_key="k")
        request = ModelRequest(model="x", messages=[_msg("u", "user", "hi")])
        try:
            async with asyncio.timeout(LIMIT):
                chunks = [c async for c in model.stream(request)]
                response = chunks[-1].response
                followup = ModelRequest(model="x", messages=[*request.messages, Message(
                    id="a", role="assistant", content=response.text, reasoning=response.reasoning)])
                await complete(model, followup)
        finally:
            await model.aclose()
    assert [c.text for c in chunks if isinstance(c, ReasoningDelta)] == ["think ", "more"]
    assert response.text == "answer" and response.reasoning[0].text == "think more"
    assert "think" not in json.dumps(fake.requests[1].body)


async def test_anthropic_provider_id_in_a_spec_needs_no_registration(store: Any, fake: FakeProviders,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`AgentSpec(model="anthropic:...")`: the runtime builds the model from the id and the
    provider's environment (`ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY`) on first use."""
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.anthropic_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "from-env")
    fake.script(Answer(text="hello from the id"))
    rt = Runtime(store, agents=[AgentSpec(id="agent", model="anthropic:claude-test")])
    async with asyncio.timeout(LIMIT):
        result = await rt.run("agent", "hi")
        log = await logged(rt, result)
    fake.clients.append(rt.models.resolve("anthropic:claude-test"))
    assert result.termination.type == "natural_end"
    assert events_of(log, "InferenceCompleted")[0].model == "claude-test"
    assert fake.requests[0].body["model"] == "claude-test"
