"""The gateway's fast paths answer exactly what the slow ones would.

`GET /v1/runs/{id}` (and the other single-view reads) is served from the in-process
`ProjectionRunner`'s cache when that runner writes the very views the app reads. The cache must
never answer older than KV, or a read with `min_seq` (read-your-writes) could miss a write the
views already hold. Invariant: a cached entry equals the KV value, because an entry is (re)added
only after its put succeeded, dropped before a put that changes it, and dropped on a failed
batch. The runner is driven by hand (`step()`), so every interleaving here is deterministic:
reads happen before, *during* (from inside the put) and after a batch's KV writes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from aiohttp.test_utils import TestClient, TestServer

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import (
    Commit,
    Message,
    MessageAppended,
    RunStarted,
    StatePatched,
    StepStarted,
    ThreadCreated,
)
from agentlog.eventlog.ids import new_id, now_ms
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.gateway.http import Settings, create_app
from agentlog.projections.kv import KVViewStore
from agentlog.projections.runner import ProjectionRunner

from tests.support.http_stack import TIMEOUT, body, error, stop_runner

_encode = msgspec.json.Encoder().encode


class Stack:
    def __init__(self, store: JetStreamEventStore, views: KVViewStore, runner: ProjectionRunner,
                 client: TestClient) -> None:
        self.store, self.views, self.runner, self.client = store, views, runner, client
        self.kv_run_reads = 0
        inner = views.get_run

        async def counted(run_id: str) -> Any:
            self.kv_run_reads += 1
            return await inner(run_id)

        views.get_run = counted  # type: ignore[method-assign]  # same object: still runner.store

    async def append(self, thread_id: str, run_id: str | None, events: list[Any]) -> int:
        version = await self.store.thread_version(thread_id)
        commit = Commit(commit_id=new_id(), thread_id=thread_id, run_id=run_id, ts=now_ms(), events=events)
        return (await self.store.append(commit, expected_version=version)).seq

    async def step_until(self, seq: int) -> None:
        while self.runner.applied_seq < seq:
            await self.runner.step()

    async def get_run(self, run_id: str, min_seq: int | None = None) -> dict[str, Any]:
        params = {"min_seq": str(min_seq)} if min_seq is not None else None
        return await body(await self.client.get(f"/v1/runs/{run_id}", params=params), 200)

    async def kv_run(self, run_id: str) -> dict[str, Any] | None:
        view = await self.views.runs.get(run_id)
        return msgspec.json.decode(view.value) if view is not None else None


@contextlib.asynccontextmanager
async def open_stack(server: EmbeddedNatsServer, *, other_views: bool = False) -> AsyncIterator[Stack]:
    """Store, views, a runner driven by hand (not started), the app on loopback.
    `other_views`: the app reads a different `KVViewStore` object than the runner writes."""
    store = await JetStreamEventStore.connect(server.url, request_timeout=2.0, connect_timeout=5.0)
    views = await KVViewStore.open(store.nc)
    runner = ProjectionRunner(store.nc, views, fetch_timeout=0.2)
    await runner.open()
    app_views = await KVViewStore.open(store.nc) if other_views else views
    app = create_app(store, app_views, runner, auth_tokens="", settings=Settings(read_wait=5.0, fresh_wait=0.05),
                     count_runs=False)
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        yield Stack(store, app_views, runner, client)
    finally:
        await client.close()
        await stop_runner(runner)
        with contextlib.suppress(ConnectionError):
            await store.close()


@pytest.fixture
async def stack(nats_server: EmbeddedNatsServer) -> AsyncIterator[Stack]:
    async with open_stack(nats_server) as value:
        yield value


async def _started(s: Stack, thread_id: str = "t1", run_id: str = "r1") -> int:
    await s.append(thread_id, None, [ThreadCreated(resource_id="acme/x")])
    return await s.append(thread_id, run_id, [
        RunStarted(run_id=run_id, agent_id="helper"),
        MessageAppended(message=Message(id=new_id(), role="user", content="hi")),
        StepStarted(step=1),
    ])


async def test_hit_serves_the_runners_view_without_a_kv_read(stack: Stack) -> None:
    async with asyncio.timeout(TIMEOUT):
        seq = await _started(stack)
        await stack.step_until(seq)
        assert stack.runner.cached_run("r1") is not None
        reads = stack.kv_run_reads
        got = await stack.get_run("r1", min_seq=seq)
        assert stack.kv_run_reads == reads  # served from the cache
        assert got == await stack.kv_run("r1") and got["last_seq"] == seq
        stack.runner.forget_cache()  # a miss falls back to KV, same answer
        assert await stack.get_run("r1") == got and stack.kv_run_reads == reads + 1
        await error(await stack.client.get("/v1/runs/nope"), 404, "run_not_found")


async def test_never_older_than_kv_before_during_and_after_puts(stack: Stack) -> None:
    """Every read, including one made while a batch's puts are done but the batch is not
    finished, answers what KV holds; reads with min_seq see their write."""
    async with asyncio.timeout(TIMEOUT):
        seq = await _started(stack)
        await stack.step_until(seq)
        inner_put = stack.views.put_views
        during: list[tuple[dict[str, Any], dict[str, Any] | None]] = []

        async def put_then_read(threads: Any, runs: Any) -> None:
            runs = list(runs)
            await inner_put(threads, runs)  # KV now has the new views; the batch is not done
            for run in runs:
                assert stack.runner.cached_run(run.run_id) is None  # the older entry was dropped
                during.append((await stack.get_run(run.run_id), await stack.kv_run(run.run_id)))

        stack.views.put_views = put_then_read  # type: ignore[method-assign]
        for k in range(1, 6):
            seq = await stack.append("t1", "r1", [StatePatched(ops=[{"op": "add", "path": f"/k{k}", "value": k}])])
            # not yet folded: a read whose min_seq the views have reached gets the old view,
            # from the cache; a read without min_seq folds the log (the views are behind)
            before = await stack.get_run("r1", min_seq=1)
            assert before == await stack.kv_run("r1") and before["last_seq"] < seq
            assert (await stack.get_run("r1"))["last_seq"] == seq
            await stack.step_until(seq)
            got, kv = during[-1]
            assert got == kv and got["last_seq"] == seq  # mid-batch read: KV's new view, not the cached old one
            after = await stack.get_run("r1", min_seq=seq)
            assert after == await stack.kv_run("r1") and after["last_seq"] == seq
            assert stack.runner.cached_run("r1") is not None


async def test_failed_batch_leaves_no_stale_entry(stack: Stack) -> None:
    """A batch that dies after its KV puts (before the ack): the cache drops everything, reads
    answer KV's (newer) view, and the redelivered batch brings the cache back in line."""
    async with asyncio.timeout(TIMEOUT):
        seq = await _started(stack)
        await stack.step_until(seq)
        inner_put = stack.views.put_views

        class Crash(Exception):
            pass

        async def put_then_crash(threads: Any, runs: Any) -> None:
            await inner_put(threads, runs)
            raise Crash

        stack.views.put_views = put_then_crash  # type: ignore[method-assign]
        seq2 = await stack.append("t1", "r1", [StatePatched(ops=[{"op": "add", "path": "/x", "value": 1}])])
        with pytest.raises(Crash):
            while True:
                await stack.runner.step()
        assert stack.runner.cached_run("r1") is None and stack.runner.applied_seq < seq2
        got = await stack.get_run("r1")
        assert got == await stack.kv_run("r1") and got["last_seq"] == seq2  # KV is ahead: so is the read
        stack.views.put_views = inner_put  # type: ignore[method-assign]
        await stack.step_until(seq2)
        assert await stack.get_run("r1", min_seq=seq2) == await stack.kv_run("r1")


async def test_runner_of_other_views_is_not_used(nats_server: EmbeddedNatsServer) -> None:
    """The cache is only a read path when the runner writes the app's own view store."""
    async with asyncio.timeout(TIMEOUT), open_stack(nats_server, other_views=True) as s:
        seq = await _started(s)
        await s.step_until(seq)
        assert s.runner.cached_run("r1") is not None
        got = await s.get_run("r1", min_seq=seq)
        assert s.kv_run_reads == 1 and got == await s.kv_run("r1")


async def test_thread_reads_and_empty_query(stack: Stack) -> None:
    """Thread views take the same path; the shared empty query still rejects bad queries."""
    async with asyncio.timeout(TIMEOUT):
        seq = await _started(stack)
        await stack.step_until(seq)
        assert stack.runner.cached_thread("t1") is not None
        thread = await body(await stack.client.get("/v1/threads/t1"), 200)
        assert thread["resource_id"] == "acme/x" and thread["version"] == seq
        for bad in ("min_seq=x", "min_seq=-1", "nope=1"):
            await error(await stack.client.get(f"/v1/runs/r1?{bad}"), 400, "invalid_input")
        assert (await stack.get_run("r1"))["run_id"] == "r1"
