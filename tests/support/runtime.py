"""Shared helpers for the runtime tests (no tests here): a real JetStream store per test and
ways to look at what a run wrote to the log."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import StoredCommit
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.runtime import RunResult, Runtime


@pytest.fixture
async def store(nats_server: EmbeddedNatsServer) -> AsyncIterator[JetStreamEventStore]:
    s = await JetStreamEventStore.connect(nats_server.url)
    try:
        yield s
    finally:
        await s.close()


async def thread_log(store: Any, thread_id: str) -> list[StoredCommit]:
    return [sc async for sc in store.read_thread(thread_id)]


def shape(commits: list[StoredCommit]) -> list[list[str]]:
    """Event type names, grouped by commit: asserts the events AND the commit points."""
    return [[type(e).__name__ for e in sc.commit.events] for sc in commits]


def events_of(commits: list[StoredCommit], kind: str) -> list[Any]:
    return [e for sc in commits for e in sc.commit.events if type(e).__name__ == kind]


async def logged(rt: Runtime, result: RunResult) -> list[StoredCommit]:
    """The thread's log as the store holds it (not the in-process copy)."""
    return await thread_log(rt.store, result.thread_id)


START = ["ThreadCreated", "RunStarted", "MessageAppended"]
INFER_TOOL = ["StepStarted", "MessageAppended", "InferenceCompleted", "ToolCallStarted"]
FINAL_TEXT = ["StepStarted", "MessageAppended", "InferenceCompleted", "StepFinished", "RunFinished"]
DONE_CALL = ["ToolCallCompleted", "MessageAppended"]
