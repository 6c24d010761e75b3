"""`Runtime.start` rejects a bad request before its first write.

A continuation of a waiting parent appends (the parent is closed first), so every check that can
reject the request must run before that: otherwise a request that fails still changes the log.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentlog.runtime import RunConflict, RunNotFound, RunRequest
from agentlog.runtime.inputs.commands import StartRun

from tests.support import hitl as S
from tests.support.input import codes_of
from tests.support.runtime import store  # noqa: F401  (fixture)

WAIT = 20.0


async def waiting_parent(store: Any) -> Any:
    rt = S.build(store, "continuation", 0)
    result = await S.start(rt, "continuation")
    assert result.status == "waiting"
    return rt


BAD_CONTINUATIONS: list[tuple[str, dict[str, Any], type[Exception]]] = [
    ("unknown agent", {"agent_id": "nobody"}, LookupError),
    ("bad message role", {"messages": [{"role": "robot", "content": "x"}]}, ValueError),
    ("bad visibility", {"messages": [{"role": "user", "content": "x", "visibility": "secret"}]}, ValueError),
    ("bad message id", {"messages": [{"role": "user", "content": "x", "id": "a.b"}]}, ValueError),
    ("bad run id", {"run_id": "a.b"}, ValueError),
    ("run id taken", {"run_id": S.RUN}, RunConflict),
    ("other thread", {"thread_id": "elsewhere"}, RunNotFound),
]


@pytest.mark.parametrize("case", BAD_CONTINUATIONS, ids=[c[0] for c in BAD_CONTINUATIONS])
async def test_a_rejected_continuation_writes_nothing(store: Any, case: Any) -> None:
    _, overrides, error = case
    async with asyncio.timeout(WAIT):
        rt = await waiting_parent(store)
        before = await store.last_seq()
        kwargs: dict[str, Any] = {"agent_id": "agent", "messages": "never mind",
                                  "parent_run_id": S.RUN, **overrides}
        agent_id = kwargs.pop("agent_id")
        messages = kwargs.pop("messages")
        with pytest.raises(error):
            await rt.start(agent_id, messages, **kwargs)
        assert await store.last_seq() == before
        assert (await rt.run_view(S.RUN)).status == "waiting"  # the parent was not closed


# -- a deleted thread (one start-admission rule) ------------------------------------------------


async def _delete_thread(store: Any, thread_id: str) -> None:
    from agentlog.eventlog.events import Commit, ThreadDeleted

    commit = Commit(commit_id=f"del-{thread_id}", thread_id=thread_id, ts=1, events=[ThreadDeleted(reason="gone")])
    await store.append(commit, expected_version=await store.last_seq())


async def test_a_deleted_thread_takes_no_run_through_any_path(store: Any) -> None:
    """A new run, a continuation (with or without decisions) and the in-process dispatcher all
    refuse a deleted thread with the same typed 404 (`thread_not_found`) and write nothing: the
    waiting parent stays waiting. `Runtime.start` raises the typed error, not a bare
    AgentlogError (a 500 `agentlog_error` over HTTP), and a continuation is refused before it
    cancels the waiting parent (a write)."""
    from tests.support.inprocess import InProcessDispatcher

    async with asyncio.timeout(WAIT):
        rt = await waiting_parent(store)
        await _delete_thread(store, S.THREAD)
        before = await store.last_seq()
        call_id = next(iter((await rt.run_view(S.RUN)).calls))
        decision = {"target_id": call_id, "decision_id": "d-late", "action": "resume", "result": {"ok": True}}
        dispatcher = InProcessDispatcher(rt)
        attempts = [
            lambda: rt.start("agent", "a new run", thread_id=S.THREAD),
            lambda: rt.start("agent", "never mind", parent_run_id=S.RUN),
            lambda: rt.start("agent", "go on", parent_run_id=S.RUN, decisions=[decision]),
            lambda: dispatcher.start_run(RunRequest(agent_id="agent", messages="a new run", thread_id=S.THREAD)),
            lambda: dispatcher.submit_inputs(S.RUN, messages="never mind"),
        ]
        assert await codes_of(attempts) == ["thread_not_found"] * len(attempts)
        assert await store.last_seq() == before
        assert (await rt.run_view(S.RUN)).status == "waiting"


# -- a start command for a run that is in the log already -------------------------------------


@pytest.mark.parametrize("first_delivery", [True, False], ids=["first-delivery", "redelivery"])
async def test_a_start_command_for_a_run_in_the_log_resumes_it_and_starts_nothing(
        store: Any, first_delivery: bool) -> None:
    """On its first delivery a start is tried at once (no read of the run first); a run of that
    id in the log anyway is refused by the start's admission and taken up as it is, like a
    redelivered start's: nothing is started twice, nothing is written for a waiting run."""
    async with asyncio.timeout(WAIT):
        await waiting_parent(store)
        logged = [sc async for sc in store.read_run(S.RUN)]
        rt = S.build(store, "continuation", 1)  # another process: nothing of the run in memory
        command = StartRun.of(RunRequest(agent_id="agent", messages="again"), S.THREAD, S.RUN)
        assert await rt.execute(command, first_delivery=first_delivery) == "done"
        assert [sc async for sc in store.read_run(S.RUN)] == logged
        assert (await rt.run_view(S.RUN)).status == "waiting"
