"""A model's reasoning in the protocols: AG-UI `REASONING_*` events (a `reasoning` message before
the assistant's) and AI SDK `reasoning` parts, streamed from live `reasoning_delta`s and
synthesised from the committed message's `reasoning` when no delta arrived, each reasoning
started once; the history routes carry it too.

Runs are recorded for real (a Runtime on a real nats-server, the scripted model's `reasoning=`
turns, or a provider SDK against tests/fakes/fake_providers.py), then their commits and live deltas are
fed through `Merge` in generated arrival orders (hypothesis): the stream must not depend on them.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentlog import AnthropicModel, GeminiModel, OpenAIResponsesModel
from agentlog.eventlog.events import MessageAppended, StoredCommit
from agentlog.gateway.adapters import session
from agentlog.gateway.adapters.agui import session as agui_session
from agentlog.gateway.adapters.agui import translator as agui
from agentlog.gateway.adapters.aisdk import session as aisdk_session
from agentlog.gateway.adapters.aisdk import translator as aisdk
from agentlog.gateway.adapters.source import Merge
from agentlog.runtime import AgentSpec, Runtime, tool
from agentlog.runtime.live import MemoryLiveSink
from agentlog.runtime.models import ScriptedModel, Turn

from tests.fakes.fake_providers import Answer, FakeProviders
from tests.support.protocol_verify.agui import verify_agui_stream
from tests.support.protocol_verify.aisdk import verify_ui_stream
from tests.support.protocol_verify.reducers import AguiClient, AiSdkChat, normalise_agui, normalise_aisdk
from tests.support.runtime import store  # noqa: F401  (fixture)

LIMIT = 30
THOUGHT_1 = "the user wants a sum so I call add"
THOUGHT_2 = "add said three"


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@dataclass
class Run:
    thread_id: str
    run_id: str
    commits: list[StoredCommit]      # the thread's commits from the run's first
    live: list[dict[str, Any]]       # its live payloads, in publish order
    belongs: list[int]               # for each: how many of `commits` it follows (its `seq`)
    user: dict[str, Any]             # the user message as the AI SDK client holds it
    log: session.ThreadLog


async def record(store: Any, model: Any, message: str = "what is 1 + 2?") -> Run:
    live = MemoryLiveSink()
    rt = Runtime(store, agents=[AgentSpec(id="agent", model=model, tools=["add"])], tools=[add], live=live)
    async with asyncio.timeout(LIMIT):
        result = await rt.run("agent", message)
        log = await session.load_thread(store, result.thread_id)
    first = next(sc.seq for sc in log.commits if sc.commit.run_id == result.run_id)
    commits = [sc for sc in log.commits if sc.seq >= first]
    payloads = [p for _, p in live.items]
    belongs = [sum(sc.seq <= p.get("seq", 0) for sc in commits) for p in payloads]
    user = next(e.message for sc in commits for e in sc.commit.events
                if type(e) is MessageAppended and e.message.role == "user")
    return Run(result.thread_id, result.run_id, commits, payloads, belongs,
               {"id": user.id, "role": "user", "parts": [{"type": "text", "text": user.content}]}, log)


def arrival(run: Run, at: list[int]) -> list[Any]:
    """Commits in log order with `live[i]` arriving just before commit `at[i]` (live order kept),
    merged as a route merges them."""
    items: list[Any] = []
    i = 0
    for k, sc in enumerate(run.commits):
        while i < len(run.live) and at[i] <= k:
            items.append(run.live[i])
            i += 1
        items.append(sc)
    items += run.live[i:]
    merge = Merge(run.run_id, run.commits[0].seq - 1)
    out: list[Any] = []
    for item in items:
        out += merge.live(item) if isinstance(item, dict) else merge.commit(item)
    return out


def agui_events(run: Run, items: list[Any]) -> list[Any]:
    return verify_agui_stream(agui.translate(run.thread_id, run.run_id, items, state={}, echo_user_messages=True))


def wire(events: list[Any]) -> list[dict[str, Any]]:
    return [e.model_dump(mode="json", by_alias=True, exclude_none=True) for e in events]


def check_stream(run: Run, items: list[Any], thoughts: list[str]) -> None:
    """A valid stream in both protocols, each reasoning started once, and clients (with or
    without the final snapshot) that end with the server's history, reasoning included."""
    events = wire(agui_events(run, items))
    starts = [e["messageId"] for e in events if e["type"] == "REASONING_START"]
    assert len(starts) == len(set(starts)) == len(thoughts)
    expected = normalise_agui(agui_session.history(run.log))
    assert [m["content"] for m in expected if m["role"] == "reasoning"] == thoughts
    for snapshots in (False, True):
        client = AguiClient().apply_all(events, snapshots=snapshots)
        assert client.problems == []
        assert normalise_agui(client.messages) == expected
    parts = verify_ui_stream(aisdk.translate(run.thread_id, run.run_id, items))
    starts = [p["id"] for p in parts if p["type"] == "reasoning-start"]
    assert len(starts) == len(set(starts)) == len(thoughts)
    chat = AiSdkChat(messages=[copy.deepcopy(run.user)])
    chat.receive(parts)
    history = normalise_aisdk(aisdk_session.history(run.log))
    assert normalise_aisdk(chat.messages) == history
    assert [p["text"] for m in history for p in m["parts"] if p["type"] == "reasoning"] == thoughts


def check_arrivals(run: Run, thoughts: list[str]) -> None:
    """The property: the live link ahead of the log by any amount gives the very stream of the
    in-order arrival; any arrival at all (late deltas dropped) still gives a valid stream that
    builds the server's messages."""
    in_order = arrival(run, run.belongs)
    expected_agui = wire(agui_events(run, in_order))
    expected_ui = aisdk.translate(run.thread_id, run.run_id, in_order)
    check_stream(run, in_order, thoughts)

    def monotone(data: Any, bounds: list[tuple[int, int]]) -> list[int]:
        out, low = [], 0
        for lo, hi in bounds:
            low = data.draw(st.integers(max(low, lo), max(low, lo, hi)))
            out.append(low)
        return out

    @settings(max_examples=40, deadline=None)
    @given(data=st.data())
    def prop(data: Any) -> None:
        early = arrival(run, monotone(data, [(0, b) for b in run.belongs]))
        assert wire(agui_events(run, early)) == expected_agui
        assert aisdk.translate(run.thread_id, run.run_id, early) == expected_ui
        anywhere = arrival(run, monotone(data, [(0, len(run.commits))] * len(run.live)))
        check_stream(run, anywhere, thoughts)

    prop()


async def test_scripted_reasoning_streams_once_whatever_the_arrival_order(store: Any) -> None:
    model = ScriptedModel([Turn.tool("add", {"a": 1, "b": 2}, text="Adding.", reasoning=THOUGHT_1),
                           Turn.text("It is 3.", reasoning=THOUGHT_2)], chunk_words=1)
    run = await record(store, model)
    assert [p["type"] for p in run.live].count("reasoning_delta") == len((THOUGHT_1 + " " + THOUGHT_2).split())
    check_arrivals(run, [THOUGHT_1, THOUGHT_2])


async def test_committed_reasoning_without_live_deltas_is_synthesised(store: Any) -> None:
    model = ScriptedModel([Turn.text("It is 3.", reasoning=THOUGHT_2)])
    run = await record(store, model)
    committed = arrival(run, [len(run.commits)] * len(run.live))  # every delta late: all dropped
    assert not any(isinstance(it, dict) for it in committed)
    events = wire(agui_events(run, committed))
    kinds = [e["type"] for e in events]
    at = kinds.index("REASONING_START")
    assert kinds[at:at + 5] == ["REASONING_START", "REASONING_MESSAGE_START", "REASONING_MESSAGE_CONTENT",
                                "REASONING_MESSAGE_END", "REASONING_END"]
    assert "TEXT_MESSAGE_START" in kinds[at + 5:]  # the answer after its reasoning
    assert events[at + 2]["delta"] == THOUGHT_2
    parts = aisdk.translate(run.thread_id, run.run_id, committed)
    kinds = [p["type"] for p in parts]
    assert kinds.index("reasoning-end") < kinds.index("text-start")
    check_stream(run, committed, [THOUGHT_2])


async def test_text_without_reasoning_has_no_reasoning_events(store: Any) -> None:
    run = await record(store, ScriptedModel(["It is 3."]))
    items = arrival(run, run.belongs)
    assert not any(e.type.value.startswith("REASONING") for e in agui_events(run, items))
    assert not any(p["type"].startswith("reasoning") for p in aisdk.translate(run.thread_id, run.run_id, items))
    assert all(m["role"] != "reasoning" for m in agui_session.history(run.log))


@pytest.fixture
async def fake() -> AsyncIterator[FakeProviders]:
    async with FakeProviders() as f:
        try:
            yield f
        finally:
            for model in f.clients:  # the SDKs' HTTP pools close in the loop that opened them
                await model.aclose()


def provider_model(provider: str, fake: FakeProviders) -> Any:
    model: Any
    if provider == "anthropic":
        model = AnthropicModel("claude-test", base_url=fake.anthropic_url, api_key="k", thinking_budget=1024)
    elif provider == "responses":
        model = OpenAIResponsesModel("gpt-test", base_url=fake.openai_url, api_key="k", reasoning_effort="low")
    else:
        model = GeminiModel("gemini-test", base_url=fake.gemini_url, api_key="k")
    fake.clients.append(model)
    return model


async def test_anthropic_thinking_streams_as_agui_reasoning(store: Any, fake: FakeProviders) -> None:
    fake.script(Answer(thinking=THOUGHT_1, calls=[("add", {"a": 1, "b": 2})]), Answer(text="3"))
    run = await record(store, provider_model("anthropic", fake))
    deltas = [p for p in run.live if p["type"] == "reasoning_delta"]
    assert len(deltas) >= 2  # the fake streams the thinking in two pieces: live, not synthesised
    events = wire(agui_events(run, arrival(run, run.belongs)))
    content = [e["delta"] for e in events if e["type"] == "REASONING_MESSAGE_CONTENT"]
    assert content == [d["text"] for d in deltas] and "".join(content) == THOUGHT_1
    check_arrivals(run, [THOUGHT_1])


@pytest.mark.parametrize("provider", ["anthropic", "responses", "gemini"])
async def test_provider_reasoning_streams_as_aisdk_reasoning_parts(store: Any, fake: FakeProviders,
                                                                   provider: str) -> None:
    fake.script(Answer(thinking=THOUGHT_1, calls=[("add", {"a": 1, "b": 2})]), Answer(text="3"))
    run = await record(store, provider_model(provider, fake))
    parts = aisdk.translate(run.thread_id, run.run_id, arrival(run, run.belongs))
    assert "".join(p["delta"] for p in parts if p["type"] == "reasoning-delta") == THOUGHT_1
    check_stream(run, arrival(run, run.belongs), [THOUGHT_1])
