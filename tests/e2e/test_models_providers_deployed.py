"""A provider model named in a config file runs what users run: `agentlog serve`, and `agentlog
gateway` + `agentlog worker`, each as a subprocess on a real nats-server, the Anthropic, Gemini and
OpenAI SDKs inside the worker pointed (by environment) at a local wire-format fake on loopback.

One fake and one deployment per topology serve the module: each test runs an agent of its own on
a thread of its own, and starts from an empty script and request record (`providers`), so what
it asserts about the requests is what its own run sent."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from agentlog.eventlog.events import InferenceCompleted, RunFinished
from agentlog.eventlog.jetstream.store import JetStreamEventStore

from tests.fakes.fake_providers import Answer, FakeProviders, FakeProvidersThread
from tests.support.deployed_runs import start_and_settle
from tests.support.topology import TOPOLOGIES, Deployment, deploy

CONFIG = """\
version: 1
models:
  claude:
    type: anthropic
    model: claude-test
    prices: {input: 3.0, output: 15.0, cache_read: 0.3}
  flash: "gemini:gemini-test"
pools:
  main: {models: [claude], affinity: thread}
tools: ["tests.apps.config_app:add"]
agents:
  - id: assistant
    pool: main
    tools: [add]
  - id: gemini-agent
    model: flash
    tools: [add]
  - id: responses-agent
    model: "openai-responses:gpt-test"
    tools: [add]
"""


@pytest.fixture(scope="module")
def fake_providers() -> Iterator[FakeProvidersThread]:
    runner = FakeProvidersThread()
    with runner:
        yield runner


@pytest.fixture(scope="module", params=TOPOLOGIES)
def deployment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
               fake_providers: FakeProvidersThread) -> Iterator[Deployment]:
    """One deployment per topology for the module, its workers pointed at the module's fake."""
    where = tmp_path_factory.mktemp(f"providers-{request.param}")
    config = where / "agents.yaml"
    config.write_text(CONFIG)
    with deploy(request.param, where / "deployment", app=str(config), env=fake_providers.env()) as running:
        yield running


@pytest.fixture
def providers(fake_providers: FakeProvidersThread) -> tuple[FakeProvidersThread, FakeProviders]:
    """The module's fake, emptied for this test: no answer scripted, no request recorded."""
    fake = fake_providers.fake
    fake.answers.clear()
    fake.requests.clear()
    fake.media_errors.clear()
    fake.always = fake.responder = None
    return fake_providers, fake


async def run_over_http(deployment: Deployment, agent: str) -> tuple[list[Any], Any]:
    async with aiohttp.ClientSession(deployment.http_url) as http:
        started, seq, last = await start_and_settle(deployment.nats_url, http,
                                                    {"agent_id": agent, "messages": "what is 1 + 2?"})
        store = await JetStreamEventStore.connect(deployment.nats_url)
        try:
            events = [e async for sc in store.read_run(started["run_id"]) for e in sc.commit.events]
        finally:
            await store.close()
        async with http.get(f"/v1/runs/{started['run_id']}", params={"min_seq": str(seq)}) as r:
            view = await r.json()
    assert any(isinstance(e, RunFinished) for e in last.commit.events), deployment.outputs()
    return events, view


async def test_anthropic_config_agent_runs_deployed(deployment: Deployment, providers: Any) -> None:
    _, fake = providers
    fake.script(Answer(calls=[("add", {"a": 1, "b": 2})], input_tokens=1000, cache_read=200, output_tokens=50),
                Answer(text="It is 3.", input_tokens=1200, output_tokens=10))
    events, view = await run_over_http(deployment, "assistant")
    finished = [e for e in events if isinstance(e, RunFinished)][0]
    assert finished.termination.type == "natural_end", deployment.outputs()
    inferences = [e for e in events if isinstance(e, InferenceCompleted)]
    assert [i.model for i in inferences] == ["claude-test", "claude-test"]
    assert inferences[0].usage.cache_read_tokens == 200
    expected = (800 * 3 + 200 * 0.3 + 50 * 15 + 1200 * 3 + 10 * 15) / 1e6
    assert finished.cost == pytest.approx(expected) and view["cost"] == pytest.approx(expected)
    assert view["model"] == "claude"  # the pool's pick, recorded
    assert [r.path for r in fake.requests] == ["/v1/messages", "/v1/messages"]
    headers = fake.requests[0].headers  # the key from the worker's environment (the SDK's header for it)
    assert "fake" in (headers.get("x-api-key") or headers.get("authorization") or "")


async def test_gemini_provider_id_agent_runs_deployed(deployment: Deployment, providers: Any) -> None:
    _, fake = providers
    fake.script(Answer(calls=[("add", {"a": 1, "b": 2})]), Answer(text="3"))
    events, view = await run_over_http(deployment, "gemini-agent")
    assert view["status"] == "done" and view["termination"]["type"] == "natural_end", deployment.outputs()
    assert all(r.path.endswith("/models/gemini-test:streamGenerateContent") for r in fake.requests)
    assert len(fake.requests) == 2


async def test_responses_provider_id_agent_runs_deployed(deployment: Deployment, providers: Any) -> None:
    _, fake = providers
    fake.script(Answer(thinking="a sum", calls=[("add", {"a": 1, "b": 2})]), Answer(text="3"))
    events, view = await run_over_http(deployment, "responses-agent")
    assert view["status"] == "done" and view["termination"]["type"] == "natural_end", deployment.outputs()
    assert [r.path for r in fake.requests] == ["/v1/responses", "/v1/responses"]
    # the reasoning item went back, with the call and its result, as input items
    kinds = [item.get("type") for item in fake.requests[1].body["input"]]
    assert kinds[-3:] == ["reasoning", "function_call", "function_call_output"]
