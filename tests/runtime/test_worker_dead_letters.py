"""A command a worker cannot carry out is dead-lettered instead of being retried forever. It goes to
`agentlog.dlq.<thread_id>` (stream AGENTLOG_DLQ) with the error code and message in headers, leaves
the work queue (so later commands of its thread run), its started-but-unfinished run gets
`RunFinished{error, code}`, and a gateway waiting for it answers with the worker's code at once, not
`dispatch_timeout`. So a start whose commit is over the max payload is not redelivered dozens of
times a minute, and an unreadable command is not silently dropped.

All against a real nats-server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import Commit, RunFinished, RunStarted, ThreadCreated
from agentlog.eventlog.ids import new_id, now_ms
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.gateway.operations.dispatch import CommandFailed, QueueDispatcher
from agentlog.runtime import RunRequest
from agentlog.runtime.inputs.commands import StartRun
from agentlog.runtime.workers.commands import (
    COMMANDS_STREAM,
    DLQ_CODE,
    DLQ_COMMAND_ID,
    DLQ_DELIVERIES,
    CommandClient,
    dlq_subject,
)
from agentlog.runtime.workers.worker import Worker

from tests.apps.app_forms import factory_runtime

TIMEOUT = 20.0


@contextlib.asynccontextmanager
async def _worker(server: EmbeddedNatsServer, **kw: Any) -> AsyncIterator[tuple[JetStreamEventStore, Worker]]:
    store = await JetStreamEventStore.connect(server.url, request_timeout=2.0)
    worker = Worker(store, runtime=factory_runtime(store), ack_wait=5.0, fetch_timeout=0.2,
                    nak_delay=0.01, max_nak_delay=0.02, **kw)
    await worker.start()
    try:
        yield store, worker
    finally:
        await worker.stop(timeout=2.0)
        await store.close()


async def _dead_letter(store: JetStreamEventStore, subject: str, action: Any) -> Any:
    """Run `action` and return the first dead letter published on `subject` (bounded wait)."""
    sub = await store.nc.subscribe(subject)
    try:
        await store.nc.flush()
        await action()
        async with asyncio.timeout(TIMEOUT):
            return await sub.next_msg(timeout=TIMEOUT)
    finally:
        await sub.unsubscribe()


async def _queued(store: JetStreamEventStore) -> int:
    return (await store.nc.jetstream().stream_info(COMMANDS_STREAM)).state.messages


async def _drained(store: JetStreamEventStore) -> bool:
    """The work queue empties (the worker acks a dead letter right after publishing it)."""
    async with asyncio.timeout(TIMEOUT):
        while await _queued(store):
            await asyncio.sleep(0.02)  # poll interval of a bounded condition wait
    return True


async def test_a_start_whose_commit_is_too_large_is_dead_lettered_once(nats_server: EmbeddedNatsServer) -> None:
    async with _worker(nats_server) as (store, worker):
        client = CommandClient(store.nc)
        # fits a command, not the start commit (envelope + ids + headers): the worker's start fails
        cmd = StartRun(thread_id="t-big", agent_id="echo", messages=["x" * (store.nc.max_payload - 400)])
        msg = await _dead_letter(store, dlq_subject("t-big"), lambda: client.submit(cmd))
        assert msg.headers[DLQ_CODE] == "commit_too_large"
        assert msg.headers[DLQ_COMMAND_ID] == cmd.command_id
        assert msg.headers[DLQ_DELIVERIES] == "1"  # never retried: no retry can make it fit
        assert await _drained(store)
        assert [sc async for sc in store.read_thread("t-big")] == []  # nothing half-written
        assert worker.stats["dead_lettered"] == 1


async def test_an_unreadable_command_is_dead_lettered(nats_server: EmbeddedNatsServer) -> None:
    async with _worker(nats_server) as (store, worker):
        js = store.nc.jetstream()

        async def publish() -> None:
            await js.publish("agentlog.cmd.t-junk", b'{"type": "start", "thread_id": 7}')

        msg = await _dead_letter(store, dlq_subject("t-junk"), publish)
        assert msg.headers[DLQ_CODE] == "invalid_command"
        assert msg.data == b'{"type": "start", "thread_id": 7}'  # the command as it was queued
        assert await _drained(store)


async def test_a_failing_command_is_dead_lettered_after_max_deliver_and_its_run_finishes_in_error(
        nats_server: EmbeddedNatsServer, monkeypatch: pytest.MonkeyPatch) -> None:
    async with _worker(nats_server, max_deliver=3) as (store, worker):
        # a run whose start is in the log but that nobody drives; resuming it fails every time
        run_id, thread_id = new_id(), "t-fail"
        await store.append(Commit(commit_id=new_id(), thread_id=thread_id, run_id=run_id, ts=now_ms(),
                                  events=[ThreadCreated(), RunStarted(run_id=run_id, agent_id="echo")]), 0)
        attempts = []

        async def broken_resume(*_a: Any, **_k: Any) -> None:
            attempts.append(1)
            raise RuntimeError("boom")

        monkeypatch.setattr(worker.runtime, "resume", broken_resume)
        cmd = StartRun(thread_id=thread_id, run_id=run_id, agent_id="echo", messages=["hi"])
        msg = await _dead_letter(store, dlq_subject(thread_id), lambda: CommandClient(store.nc).submit(cmd))
        assert msg.headers[DLQ_CODE] == "max_deliveries" and msg.headers[DLQ_DELIVERIES] == "3"
        assert len(attempts) == 3 and await _drained(store)
        (last,) = [sc async for sc in store.read_run(run_id)][-1:]
        (finished,) = last.commit.events
        assert isinstance(finished, RunFinished)
        assert (finished.termination.type, finished.termination.code) == ("error", "max_deliveries")
        assert "boom" in (finished.termination.detail or "")


async def test_the_gateway_answers_with_the_workers_code(nats_server: EmbeddedNatsServer) -> None:
    async with _worker(nats_server) as (store, _worker_):
        # a gateway that does not know the app: only the worker can tell the agent is unknown
        gateway = QueueDispatcher(store.nc, store, agents=None, timeout=TIMEOUT)
        with pytest.raises(CommandFailed) as err:
            await gateway.start_run(RunRequest(agent_id="ghost", messages="hi", thread_id="t-ghost",
                                               resource_id="tenant/1"))
        assert err.value.code == "agent_not_found"
        assert await _drained(store)
        # the gateway wrote nothing (resource_id rides in the command): no orphan thread
        assert [sc async for sc in store.read_thread("t-ghost")] == []
        accepted = await gateway.start_run(RunRequest(agent_id="echo", messages="hi", thread_id="t-ghost",
                                                      resource_id="tenant/1"))
        assert accepted.thread_id == "t-ghost"  # the thread is not blocked
        first = [sc async for sc in store.read_thread("t-ghost")][0].commit.events[0]
        assert isinstance(first, ThreadCreated) and first.resource_id == "tenant/1"  # by the worker's start


def test_dead_letter_codes_map_to_the_statuses_serve_mode_gives() -> None:
    from agentlog.gateway.http.errors import answer

    for code, status in (("agent_not_found", 404), ("commit_too_large", 413), ("run_finished", 409),
                         ("frontend_tool_conflict", 400), ("max_deliveries", 503), (None, 500)):
        got, body, _ = answer(CommandFailed("worker said no", code))
        assert (got, body["code"]) == (status, code or "command_failed")
