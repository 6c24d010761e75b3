"""Profile state: the long-term typed state of a `resource_id`, in its own stream.

The store contract (per-profile optimistic concurrency, idempotent retries, reads) on both stores
(JetStream on a real nats-server), the pure fold and its time travel, and the loop: tools write
profile keys at their completion (retried against a profile that changed meanwhile), the
`remember` / `recall` tools share memories across a resource's threads, and verified replay
passes. The deployed scenarios are in tests/gateway/test_state_deployed.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pydantic
import pytest

from agentlog import StateKey
from agentlog.eventlog import EmbeddedNatsServer, InvalidCommit, MemoryEventStore, VersionConflict
from agentlog.eventlog.events import AppendResult, ProfileCommit, StateWritten
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.subjects import profile_subject
from agentlog.projections.profile import fold_profile
from agentlog.runtime import AgentSpec, DeterministicEntropy, Runtime, ToolContext, tool
from agentlog.runtime.models import ScriptedModel, Turn
from agentlog.runtime.replay.verify import verify_run
from agentlog.runtime.state import ops
from agentlog.runtime.toolkits.memory import MEMORY, MemoryPlugin

from tests.support.runtime import events_of

pytestmark = pytest.mark.asyncio


def write(key: str, op: dict[str, Any], profile: str = "user-1") -> StateWritten:
    return StateWritten(key=key, ops=[op], scope="profile", profile_id=profile)


def commit(commit_id: str, *events: StateWritten, profile: str = "user-1") -> ProfileCommit:
    return ProfileCommit(commit_id=commit_id, profile_id=profile, ts=1, events=list(events))


@pytest.fixture(params=["memory", "jetstream"])
async def profile_store(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[Any]:
    if request.param == "memory":
        yield MemoryEventStore()
        return
    server = EmbeddedNatsServer(tmp_path / "nats")
    server.start()
    try:
        store = await JetStreamEventStore.connect(server.url)
        try:
            yield store
        finally:
            await store.close()
    finally:
        server.stop()


async def test_profile_state_store_appends_under_per_profile_occ_and_dedups(profile_store: Any) -> None:
    first = await profile_store.append_profile(commit("c1", write("prefs", {"op": "set", "path": "/prefs", "value": 1})), 0)
    assert isinstance(first, AppendResult) and not first.duplicate
    # another profile has its own version
    other = await profile_store.append_profile(
        commit("c2", write("prefs", {"op": "set", "path": "/prefs", "value": 9}, "user/2"), profile="user/2"), 0)
    with pytest.raises(VersionConflict):
        await profile_store.append_profile(commit("c3", write("prefs", {"op": "increment", "path": "/prefs", "value": 1})), 0)
    again = await profile_store.append_profile(commit("c1", write("prefs", {"op": "set", "path": "/prefs", "value": 1})),
                                               first.seq)
    assert again.duplicate and again.seq == first.seq, "a retry of a written commit answers its seq"
    third = await profile_store.append_profile(
        commit("c3", write("prefs", {"op": "increment", "path": "/prefs", "value": 1})), first.seq)
    mine = [sc async for sc in profile_store.read_profile("user-1")]
    assert [sc.commit.commit_id for sc in mine] == ["c1", "c3"] and mine[-1].seq == third.seq
    assert [sc.commit.commit_id async for sc in _commits(profile_store, "user/2")] == ["c2"]
    assert other.seq not in {sc.seq for sc in mine}
    assert [sc.seq for sc in mine if sc.seq > first.seq] == [third.seq]
    assert fold_profile("user-1", mine).state == {"prefs": 2}
    with pytest.raises(InvalidCommit):
        await profile_store.append_profile(commit("c4", StateWritten(key="x", ops=[], scope="thread")), None)


async def _commits(store: Any, profile_id: str) -> AsyncIterator[Any]:
    async for sc in store.read_profile(profile_id):
        yield sc


async def test_profile_state_subject_is_a_digest_of_any_resource_id() -> None:
    assert profile_subject("user 42/é.*>") == profile_subject("user 42/é.*>")
    token = profile_subject("a.b").rsplit(".", 1)[1]
    assert len(token) == 64 and all(c in "0123456789abcdef" for c in token)
    assert profile_subject("a") != profile_subject("b")


async def test_profile_state_fold_and_time_travel() -> None:
    from agentlog.eventlog.events import StoredProfileCommit

    log = [
        StoredProfileCommit(3, commit("a", write("memory", {"op": "set", "path": "/memory", "value": {"facts": {}}}))),
        StoredProfileCommit(7, commit("b", write("memory", {"op": "set", "path": "/memory/facts/x", "value": {"text": "x"}}))),
        StoredProfileCommit(9, commit("c", write("memory", {"op": "set", "path": "/elsewhere", "value": 1}))),  # leaves its key
        StoredProfileCommit(12, commit("d", write("memory", {"op": "delete", "path": "/memory"}))),
    ]
    assert fold_profile("user-1", log, at=3).state == {"memory": {"facts": {}}}
    at7 = fold_profile("user-1", log, at=8)
    assert at7.state == {"memory": {"facts": {"x": {"text": "x"}}}} and at7.version == 7 and at7.keys == {"memory": 7}
    now = fold_profile("user-1", log)
    assert now.state == {} and now.version == 12 and now.rejected_writes == 1 and now.keys == {}


# -- the loop -------------------------------------------------------------------------------------


class Prefs(pydantic.BaseModel):
    language: str = "en"
    visits: int = 0


prefs = StateKey("prefs", Prefs, scope="profile")


@tool(state_keys=[prefs])
async def visit(ctx: ToolContext, language: str | None = None) -> dict[str, Any]:
    """Count a visit in the profile (and set the language)."""
    await ctx.profile.update(prefs, ops.increment("/visits"))
    if language is not None:
        await ctx.profile.update(prefs, ops.set("/language", language))
    return (await ctx.profile.read(prefs)).model_dump()


def memory_runtime(model: ScriptedModel, store: Any = None) -> Runtime:
    memory = MemoryPlugin()
    agent = AgentSpec(id="agent", model=model, tools=["visit"], plugins=[memory],
                      tool_execution_mode="sequential")
    return Runtime(store or MemoryEventStore(), agents=[agent], tools=[visit],
                   entropy=DeterministicEntropy())


async def test_profile_state_remember_in_one_thread_recall_in_another() -> None:
    model = ScriptedModel([
        Turn.tool("remember", {"fact": "prefers tea over coffee", "topic": "drink"}), "noted",
        Turn.tool("recall", {"query": "drink"}), "you like tea",
    ])
    rt = memory_runtime(model)
    async with asyncio.timeout(10):
        first = await rt.run("agent", "I like tea", resource_id="user-1")
        second = await rt.run("agent", "what do I drink?", resource_id="user-1")
    assert first.thread_id != second.thread_id
    log = [sc async for sc in rt.store.read_thread(second.thread_id)]
    assert events_of(log, "ToolCallCompleted")[0].result == {"facts": {"drink": "prefers tea over coffee"}, "count": 1}
    profile = fold_profile("user-1", [sc async for sc in rt.store.read_profile("user-1")])
    assert profile.state == {"memory": {"facts": {"drink": {"text": "prefers tea over coffee",
                                                            "thread_id": first.thread_id}}}}
    # the run recorded the write it made to the profile (scope profile), and replays from its log
    first_log = [sc async for sc in rt.store.read_thread(first.thread_id)]
    recorded = events_of(first_log, "StateWritten")
    assert [(e.key, e.scope, e.profile_id) for e in recorded] == [("memory", "profile", "user-1")]
    for result, commits in ((first, first_log), (second, log)):
        assert (await verify_run(commits, result.run_id, rt)).ok


async def test_profile_state_without_resource_id_fails_the_call() -> None:
    model = ScriptedModel([Turn.tool("remember", {"fact": "x"}), "ok"])
    rt = memory_runtime(model)
    async with asyncio.timeout(10):
        result = await rt.run("agent", "hi")
    log = [sc async for sc in rt.store.read_thread(result.thread_id)]
    completed = events_of(log, "ToolCallCompleted")[0]
    assert completed.outcome == "failed" and "ProfileUnavailable" in completed.result["error"]
    assert events_of(log, "StateWritten") == []


class _Interleaving(MemoryEventStore):
    """A store where another writer appends to the profile right before the run's first profile
    append: the run's append meets a version conflict and must read again and retry."""

    def __init__(self) -> None:
        super().__init__()
        self.raced = False

    async def append_profile(self, c: ProfileCommit, expected_version: int | None) -> AppendResult:
        if not self.raced and c.run_id is not None:
            self.raced = True
            other = ProfileCommit(commit_id="other", profile_id=c.profile_id, ts=1,
                                  events=[write("prefs", {"op": "increment", "path": "/prefs/visits", "value": 10},
                                                c.profile_id)])
            await super().append_profile(other, None)
        return await super().append_profile(c, expected_version)


async def test_profile_state_write_retries_on_a_profile_that_changed_meanwhile() -> None:
    store = _Interleaving()
    model = ScriptedModel([Turn.tool("visit", {"language": "fr"}), "ok"])
    rt = memory_runtime(model, store)
    async with asyncio.timeout(10):
        await rt.run("agent", "hi", resource_id="user-9")
    commits = [sc async for sc in store.read_profile("user-9")]
    assert [sc.commit.commit_id for sc in commits][0] == "other" and len(commits) == 2
    assert fold_profile("user-9", commits).state == {"prefs": {"visits": 11, "language": "fr"}}


async def test_profile_state_memory_key_is_declared_by_the_plugin() -> None:
    memory = MemoryPlugin()
    assert MEMORY in memory.state_keys and MEMORY.scope == "profile"
    assert [t.name for t in memory.tools()] == ["remember", "recall"]
