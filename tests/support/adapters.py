"""Shared helpers for the adapter tests (no tests here): record REAL runs on a real nats-server
+ JetStream store, as the stream a route would see (committed events merged with live deltas)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from agentlog.eventlog.events import Message, StoredCommit
from agentlog.runtime import (
    AgentSpec,
    CommittedEvent,
    DeterministicEntropy,
    MemoryLiveSink,
    RunResult,
    Runtime,
    ToolContext,
    ToolError,
    ToolResult,
    tool,
)
from agentlog.runtime.models import ScriptedModel

from tests.support.runtime import store  # noqa: F401  (fixture)


@tool
def add(a: int, b: int, ctx: ToolContext) -> int:
    """Add two integers and remember the last sum in the thread state."""
    ctx.set("/last_sum", a + b)
    return a + b


@tool
def echo(text: str) -> str:
    """Echo the text."""
    return text


@tool
def broken() -> str:
    """Always fails."""
    raise ToolError("the disk is on fire")


@tool
def approve_me(what: str) -> ToolResult:
    """Needs a human to approve."""
    return ToolResult.pending("ticket1", message=f"approve {what}?")


@tool
def ask_name() -> ToolResult:
    """Needs a human to type something."""
    return ToolResult.pending("ticket2", action="input", message="your name?",
                              response_schema={"type": "object", "properties": {"name": {"type": "string"}}})


@tool
def slow_progress(n: int, ctx: ToolContext) -> str:
    """Reports progress n times."""
    for i in range(n):
        ctx.progress({"progress": i + 1, "total": n, "message": f"chunk {i + 1}"})
    return "finished"


ALL_TOOLS = [add, echo, broken, approve_me, ask_name, slow_progress]


@dataclass
class Recorded:
    items: list[Any]            # merged: live dicts and CommittedEvents, in arrival order
    committed: list[CommittedEvent]
    result: RunResult
    log: list[StoredCommit]
    state_before: dict[str, Any]
    messages_before: list[Message]


async def record(
    store: Any, turns: list[Any], *, message: str = "hi", live: bool = False, thread_id: str | None = None,
    rt: Runtime | None = None, chunk_words: int = 2, prefix: str = "id", tools: list[Any] | None = None,
    **spec: Any,
) -> Recorded:
    """Run one scenario to its end (finished or waiting) and return what a route would stream.

    Live items are tagged with how many commits the run had when they were published, then merged
    before the next commit: the order a route merging the two subscriptions would see them in."""
    tags: list[tuple[int, dict[str, Any]]] = []
    holder: dict[str, Any] = {}

    def on_publish(_subject: str, payload: dict[str, Any]) -> None:
        tags.append((len(holder["handle"].commits), payload))

    if rt is None:
        model = ScriptedModel(turns, chunk_words=chunk_words)
        tools = ALL_TOOLS if tools is None else tools
        agent = AgentSpec(id="agent", model=model, tools=[t.name for t in tools], **spec)
        rt = Runtime(store, agents=[agent], tools=tools, entropy=DeterministicEntropy(prefix=prefix),
                     live=MemoryLiveSink(on_publish) if live else None)
    before: list[StoredCommit] = []
    if thread_id is not None:
        before = [sc async for sc in store.read_thread(thread_id)]
    from agentlog.projections.fold import fold_commits
    view = fold_commits(before).threads.get(thread_id) if before else None
    messages_before = [e.message for sc in before for e in sc.commit.events if type(e).__name__ == "MessageAppended"]
    async with asyncio.timeout(15):
        handle = await rt.start("agent", message, thread_id=thread_id)
        holder["handle"] = handle
        committed = [ce async for ce in handle.events()]
        result = await handle.result()
    log = [sc async for sc in store.read_thread(result.thread_id)]
    # merge: commit k's events come after the live items published while the run had k commits
    by_commit: dict[int, list[dict[str, Any]]] = {}
    for n, payload in tags:
        by_commit.setdefault(n, []).append(payload)
    items: list[Any] = []
    seen_commits = 0
    last_seq = None
    for ce in committed:
        if ce.position.seq != last_seq:
            items += by_commit.pop(seen_commits, [])
            seen_commits += 1
            last_seq = ce.position.seq
        items.append(ce)
    for n in sorted(by_commit):
        items += by_commit[n]
    return Recorded(items, committed, result, log, dict(view.state) if view else {}, messages_before)
