"""One decision over HTTP, through the stack `agentlog serve` assembles (`agentlog.cli.assembly`):
what it costs on the way to the resumed run's commit. The decision is parsed and checked once
(`agentlog.runtime.loop.hitl`, by the gateway: the worker's runtime takes the verdict with the run),
the run is loaded once (`agentlog.runtime.loading.RunLoader`: snapshot + tail), the loop resumes
it once, and the run id is validated once, where it comes in (the HTTP path).

The serve process's store is wrapped (its reads of runs and threads are counted by method) and
the run id's validations are counted by a profile hook on `agentlog.eventlog.ids.validate_id`.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp
import pytest

from agentlog.cli import assembly
from agentlog.cli.assembly import ServerConfig, serve
from agentlog.eventlog import ids
from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import RunResumed, RunSuspended, StoredCommit
from agentlog.gateway.operations.connection import ConnectionOptions
from agentlog.runtime.loading import RunLoader
from agentlog.runtime.loop import hitl

from tests.apps import approval_app


class Reads:
    """The store's reads of runs and threads while `counting`, by method (and what they read)."""

    def __init__(self, store: Any) -> None:
        self.counting = False
        self.by_method: Counter[str] = Counter()
        self.calls: list[tuple[str, str, int]] = []
        self.raw_read_thread = store.read_thread
        for name in ("read_run", "read_thread", "read_run_tail", "thread_version"):
            setattr(store, name, self._counted(name, getattr(store, name)))

    def _counted(self, name: str, real: Any) -> Any:
        reads = self

        if name == "thread_version":
            async def version(thread_id: str) -> int:
                reads._count(name, thread_id, 0)
                return await real(thread_id)
            return version

        def read(key: str, after: int = 0, *args: Any) -> AsyncIterator[StoredCommit]:
            reads._count(name, key, after)
            return real(key, after, *args)
        return read

    def _count(self, name: str, key: str, after: int) -> None:
        if self.counting:
            self.by_method[name] += 1
            self.calls.append((name, key, after))


class Validations:
    """Checks of one value by `validate_id` (a profile hook: every module's imported name counts),
    by the function that asked for it. The command codec's checks (the queue is a process
    boundary: a worker may be another process) and the store's checks of each commit it writes
    are apart from the path's own."""

    def __init__(self, value: str) -> None:
        self.value = value
        self.code = ids.validate_id.__code__
        self.callers: list[str] = []
        #: Calls of the decision's parse and check (`agentlog.runtime.loop.hitl`), by name.
        self.decision_checks: Counter[str] = Counter()
        self._counted = {hitl.parse_decisions.__code__: "parse", hitl.check_decisions.__code__: "check"}

    def _profile(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event == "call" and frame.f_code in self._counted:
            self.decision_checks[self._counted[frame.f_code]] += 1
        if event != "call" or frame.f_code is not self.code or frame.f_locals.get("value") != self.value:
            return
        caller = frame.f_back
        if caller is not None and caller.f_code is ids.validate_run_id.__code__:
            caller = caller.f_back
        self.callers.append(caller.f_code.co_name if caller is not None else "?")

    @property
    def on_the_path(self) -> list[str]:
        return [c for c in self.callers if c not in ("validate_command", "check_commit")]

    def __enter__(self) -> Validations:
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)


@pytest.fixture
def counted_serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Reads]]:
    """`agentlog.cli.assembly`'s own assembly, on a store whose reads are counted."""
    wrapped: dict[str, Reads] = {}
    real_connect = assembly.connect

    async def connect(*args: Any, **kwargs: Any) -> Any:
        store, embedded = await real_connect(*args, **kwargs)
        wrapped["reads"] = Reads(store)
        return store, embedded

    monkeypatch.setattr(assembly, "connect", connect)
    loads: Counter[str] = Counter()
    real_load = RunLoader.load

    async def load(self: RunLoader, run_id: str, *args: Any, **kwargs: Any) -> Any:
        reads = wrapped.get("reads")
        if reads is not None and reads.counting:
            loads[run_id] += 1
        return await real_load(self, run_id, *args, **kwargs)

    monkeypatch.setattr(RunLoader, "load", load)
    wrapped["loads"] = loads  # type: ignore[assignment]
    yield wrapped


async def _until(store: Any, thread_id: str, after: int, kind: type) -> StoredCommit:
    """The first commit after `after` holding a `kind` event (a follow of the log: not a counted read)."""
    follower = store.follow(thread_id, after=after)
    try:
        async for sc in follower:
            if any(type(e) is kind for e in sc.commit.events):
                return sc
    finally:
        await follower.aclose()
    raise AssertionError("the follow ended")


async def _decide_once(http: aiohttp.ClientSession, server: Any, counted: dict[str, Any], token: str,
                       resource_id: str | None = None) -> None:
    """Start a run, let it wait, post one decision with `token`, and check what the decision
    cost until the resumed run's next suspension."""
    reads: Reads = counted["reads"]
    loads: Counter[str] = counted["loads"]
    url, auth = server.http_url, {"Authorization": f"Bearer {token}"}
    start = {"agent_id": "cycler", "messages": "go", **({"resource_id": resource_id} if resource_id else {})}
    async with http.post(f"{url}/v1/runs", json=start, headers=auth) as resp:
        assert resp.status == 202, await resp.text()
        started = await resp.json()
    run_id, thread_id = started["run_id"], started["thread_id"]
    waiting = await _until(server.store, thread_id, 0, RunSuspended)
    [call_id] = next(e.call_ids for e in waiting.commit.events if type(e) is RunSuspended)
    await server.runtime.flush_snapshots()

    body = {"decisions": [{"target_id": call_id, "decision_id": "d1", "action": "resume"}]}
    loads.clear()
    reads.calls.clear()
    reads.counting = True
    with Validations(run_id) as validations:
        async with http.post(f"{url}/v1/runs/{run_id}/inputs", json=body, headers=auth) as resp:
            assert resp.status == 202, await resp.text()
        resumed = await _until(server.store, thread_id, waiting.seq, RunResumed)
        await _until(server.store, thread_id, resumed.seq, RunSuspended)
    reads.counting = False
    # the gateway's check (a tenant's access check included) and the worker's decide share one
    # load: one snapshot + the thread's tail
    assert dict(loads) == {run_id: 1}
    assert reads.calls == [("read_thread", thread_id, reads.calls[0][2])]
    # the loop resumed the run once (one resume commit), from that load
    commits = [sc async for sc in reads.raw_read_thread(thread_id, waiting.seq)]
    assert sum(type(e) is RunResumed for sc in commits for e in sc.commit.events) == 1
    assert validations.on_the_path == ["path_id"]
    assert validations.decision_checks == {"parse": 1, "check": 1}


async def test_one_decision_over_http_is_checked_loaded_and_resumed_once(
        tmp_path: Path, nats_server: EmbeddedNatsServer, counted_serve: dict[str, Any]) -> None:
    config = ServerConfig(port=0, tokens="admin,acme-token:acme", app=approval_app.app, nats_service=False,
                          connection=ConnectionOptions(nats_url=nats_server.url))
    async with asyncio.timeout(90), serve(config) as server, aiohttp.ClientSession() as http:
        await _decide_once(http, server, counted_serve, "admin")
        await _decide_once(http, server, counted_serve, "acme-token", resource_id="acme-1")


async def test_a_tenant_deciding_on_another_tenants_run_is_told_it_does_not_exist(
        tmp_path: Path, nats_server: EmbeddedNatsServer) -> None:
    """The access check runs on the run the dispatcher loaded, before the decision is checked
    against it: another tenant's run answers `run_not_found`, whatever the decision."""
    config = ServerConfig(port=0, tokens="acme-token:acme,other-token:other", app=approval_app.app,
                          nats_service=False, connection=ConnectionOptions(nats_url=nats_server.url))
    async with asyncio.timeout(60), serve(config) as server, aiohttp.ClientSession() as http:
        url = server.http_url
        async with http.post(f"{url}/v1/runs", json={"agent_id": "cycler", "messages": "go", "resource_id": "acme-1"},
                             headers={"Authorization": "Bearer acme-token"}) as resp:
            assert resp.status == 202, await resp.text()
            started = await resp.json()
        waiting = await _until(server.store, started["thread_id"], 0, RunSuspended)
        [call_id] = next(e.call_ids for e in waiting.commit.events if type(e) is RunSuspended)
        for target in (call_id, "no-such-call"):
            body = {"decisions": [{"target_id": target, "decision_id": "d1", "action": "resume"}]}
            async with http.post(f"{url}/v1/runs/{started['run_id']}/inputs", json=body,
                                 headers={"Authorization": "Bearer other-token"}) as resp:
                assert resp.status == 404, await resp.text()
                assert (await resp.json())["code"] == "run_not_found"
        assert await server.store.thread_version(started["thread_id"]) == waiting.seq  # nothing written
