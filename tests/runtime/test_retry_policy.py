"""One retry policy: when the runtime drives a self-retrying client (the OpenAI client), the agent's
`RetryPolicy` decides the attempts and the client makes one request per attempt, so N loop attempts
cost N requests, not N * the client's own attempts.

Against the local fake OpenAI server on 127.0.0.1, with a real nats-server behind the store.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentlog.runtime import AgentSpec, RetryPolicy, Runtime
from agentlog.runtime.models import OpenAIChatModel
from agentlog.runtime.models import RetryPolicy as ClientRetryPolicy

from tests.fakes.fake_openai import FakeOpenAI, Reply, chunk
from tests.support.runtime import store  # noqa: F401  (fixture)

#: The client alone would try each model 3 times (fast delays, so a regression fails quickly).
CLIENT_RETRY = ClientRetryPolicy(max_attempts=3, base_delay=0.001, max_delay=0.002)


async def _run(store: Any, fake: FakeOpenAI, agent: AgentSpec, model: OpenAIChatModel) -> Any:
    rt = Runtime(store, agents=[agent], models={"m": model})
    async with asyncio.timeout(30):
        return await rt.run(agent.id, "hi")


async def test_the_agent_policy_owns_retries_of_the_openai_client(store: Any) -> None:
    async with FakeOpenAI() as fake, OpenAIChatModel(
        "gpt-test", base_url=fake.url, api_key="k", retry=CLIENT_RETRY
    ) as model:
        fake.always(Reply.error(503))
        agent = AgentSpec(id="agent", model="m", retry=RetryPolicy(max_attempts=2, backoff_ms=0))
        result = await _run(store, fake, agent, model)
    assert result.termination.type == "error"
    assert result.termination.code == "model_unavailable"
    assert len(fake.requests) == 2  # 2 loop attempts x 1 request, not 2 x 3


async def test_a_retry_that_succeeds_costs_one_request_per_attempt(store: Any) -> None:
    async with FakeOpenAI() as fake, OpenAIChatModel(
        "gpt-test", base_url=fake.url, api_key="k", retry=CLIENT_RETRY
    ) as model:
        fake.script(Reply.error(503), Reply.error(429, retry_after="0"), Reply.text("hello"))
        agent = AgentSpec(id="agent", model="m", retry=RetryPolicy(max_attempts=3, backoff_ms=0))
        result = await _run(store, fake, agent, model)
    assert result.termination.type == "natural_end"
    assert len(fake.requests) == 3


async def test_the_client_alone_still_retries_with_its_own_policy() -> None:
    """Standalone (no loop), the client keeps its transport retries."""
    from agentlog.runtime.models import ModelDone, ModelRequest

    async with FakeOpenAI() as fake, OpenAIChatModel(
        "gpt-test", base_url=fake.url, api_key="k", retry=CLIENT_RETRY
    ) as model:
        fake.script(Reply.error(503), Reply.error(503), Reply.text("hello"))
        chunks = [c async for c in model.stream(ModelRequest(model="gpt-test", messages=[]))]
    assert isinstance(chunks[-1], ModelDone)
    assert len(fake.requests) == 3


async def test_by_default_a_run_makes_the_client_default_number_of_requests(store: Any) -> None:
    """Default `AgentSpec.retry` (3 attempts) over a client whose own policy is 3: 3, not 9."""
    async with FakeOpenAI() as fake, OpenAIChatModel(
        "gpt-test", base_url=fake.url, api_key="k", retry=CLIENT_RETRY
    ) as model:
        fake.always(Reply.error(503, retry_after="0"))
        result = await _run(store, fake, AgentSpec(id="agent", model="m"), model)
    assert result.termination.code == "model_unavailable"
    assert len(fake.requests) == 3


async def test_a_stream_cut_after_output_went_out_is_not_retried_by_the_loop(store: Any) -> None:
    """Text already streamed live: another attempt would duplicate it, so the loop does not retry."""
    async with FakeOpenAI() as fake, OpenAIChatModel(
        "gpt-test", base_url=fake.url, api_key="k", retry=CLIENT_RETRY
    ) as model:
        fake.always(Reply.raw(chunk({"role": "assistant", "content": "hel"}), done=False))
        agent = AgentSpec(id="agent", model="m", retry=RetryPolicy(max_attempts=3, backoff_ms=0))
        result = await _run(store, fake, agent, model)
    assert result.termination.code == "model_unavailable"
    assert "mid-stream" in result.termination.detail
    assert len(fake.requests) == 1
