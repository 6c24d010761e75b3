"""Long-term memory on the profile scope: the `remember` and `recall` tools, and `MemoryPlugin`.

    memory = MemoryPlugin()
    agent = AgentSpec(id="assistant", model=..., tools=["remember", "recall"], plugins=[memory])
    rt = Runtime(store, agents=[agent], tools=memory.tools)

Facts live in one typed profile key (`MEMORY`, scope `profile`): a thread's `resource_id` names
its profile, so every thread of that resource (a user, a tenant's customer) reads what the
others remembered, in a later conversation too. `remember` stores a fact under a topic (a
later fact on the same topic replaces it); `recall` answers the facts whose topic or text holds
the query words (every fact without one). Each write is a `StateWritten` of scope profile,
appended to the profile's stream when the call completes (optimistic per profile) and recorded
in the run's log, so the profile is time-travelable (`GET /v1/profiles/{id}/state?at=`) and the
run replays from its log.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pydantic

from agentlog.runtime.plugins import Plugin
from agentlog.runtime.state import ops
from agentlog.runtime.state.keys import StateKey
from agentlog.runtime.tools import Tool, ToolContext, ToolError, tool


class Fact(pydantic.BaseModel):
    """One remembered fact: its text, and the thread it was remembered in."""

    text: str = pydantic.Field(min_length=1, max_length=2000)
    thread_id: str | None = None


class Memories(pydantic.BaseModel):
    """The profile's facts by topic."""

    facts: dict[str, Fact] = {}


#: The profile key the memory tools read and write.
MEMORY: StateKey[Memories] = StateKey("memory", Memories, scope="profile",
                                      description="facts remembered for the resource, by topic")

#: How many facts a profile keeps; `remember` refuses more (forget by remembering over a topic).
MAX_FACTS = 500


def _topic(text: str) -> str:
    words = "".join(c if c.isalnum() else " " for c in text.lower()).split()
    return "-".join(words[:6])[:80] or "fact"


@tool(state_keys=[MEMORY])
async def remember(fact: str, ctx: ToolContext, topic: str | None = None) -> dict[str, Any]:
    """Remember a fact about the user for later conversations (a later fact on the same topic
    replaces the earlier one)."""
    name = (topic or _topic(fact)).strip()[:80] or "fact"
    memories = await ctx.profile.read(MEMORY)
    if name not in memories.facts and len(memories.facts) >= MAX_FACTS:
        raise ToolError(f"the memory holds {MAX_FACTS} facts: remember over an existing topic instead")
    entry = Fact(text=fact, thread_id=ctx.thread_id)
    await ctx.profile.update(MEMORY, ops.set(f"/facts/{name.replace('~', '~0').replace('/', '~1')}",
                                             entry.model_dump(mode="json")))
    return {"remembered": name, "facts": len((await ctx.profile.read(MEMORY)).facts)}


@tool(state_keys=[MEMORY])
async def recall(ctx: ToolContext, query: str = "") -> dict[str, Any]:
    """Recall remembered facts about the user: those matching every word of the query (all of
    them when the query is empty)."""
    memories = await ctx.profile.read(MEMORY)
    words = query.lower().split()
    found = {topic: f.text for topic, f in sorted(memories.facts.items())
             if all(w in topic.lower() or w in f.text.lower() for w in words)}
    return {"facts": found, "count": len(found)}


class MemoryPlugin(Plugin):
    """Gives its agents the `remember` and `recall` tools (plugin tools: offered to every agent
    the plugin is in, registered with the runtime) and declares the profile key they use."""

    id = "memory"
    state_keys: Sequence[StateKey[Any]] = (MEMORY,)

    def tools(self) -> Sequence[Tool]:
        return (remember, recall)


__all__ = ["MAX_FACTS", "MEMORY", "Fact", "Memories", "MemoryPlugin", "recall", "remember"]
