"""The live listing changes (`GET /v1/changes`, `agentlog.gateway.http.changes`), pure: what each
watcher is told of the projection runner's batches. A first frame that says reload; then per
frame the ids changed since the last one, each once however often it changed; only what the
watcher's token may see; past `MAX_IDS` one reload instead of ids; and a watcher that left is
told nothing. The deployed stream is tested in tests/gateway/test_failed_runs_deployed.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agentlog.gateway.http.changes import MAX_IDS, ListingChanges
from agentlog.gateway.operations.auth import Principal
from agentlog.projections.notices import BatchChanges
from agentlog.projections.views import RunView, ThreadView


def batch(seq: int, *items: tuple[str, str | None, list[str]]) -> BatchChanges:
    """(thread id, resource id, run ids) -> what the runner tells of a batch that wrote those views."""
    threads = {t: ThreadView(thread_id=t, resource_id=res) for t, res, _ in items}
    runs = {r: RunView(run_id=r, thread_id=t) for t, _, rs in items for r in rs}
    return BatchChanges.of_views(seq, threads, runs)


def data(frame: bytes) -> dict[str, Any]:
    head, _, rest = frame.decode().partition("data: ")
    assert head.startswith("id: ") and "event: changes" in head
    doc: dict[str, Any] = json.loads(rest)
    assert head.split("\n")[0] == f"id: {doc['seq']}"
    return doc


def test_watchers_are_told_what_changed_since_their_last_frame_and_only_what_they_may_see() -> None:
    async def go() -> None:
        hub = ListingChanges()
        admin = hub.frames(Principal(), lambda: 10)
        tenant = hub.frames(Principal(tenant="acme"), lambda: 10)
        assert data(await anext(admin)) == {"seq": 10, "threads": [], "runs": [], "deleted": [], "reload": True}
        assert data(await anext(tenant))["reload"] is True
        assert len(hub.watchers) == 2

        hub(batch(11, ("t1", "acme/a", ["r1"]), ("t2", "other", ["r2"])))
        hub(batch(12, ("t1", "acme/a", ["r1", "r3"])))  # r1 again: one id
        hub(batch(13, ("t3", None, ["r4"])))
        assert data(await anext(admin)) == {"seq": 13, "threads": ["t1", "t2", "t3"], "runs": ["r1", "r2", "r3", "r4"],
                                            "deleted": [], "reload": False}
        assert data(await anext(tenant)) == {"seq": 13, "threads": ["t1"], "runs": ["r1", "r3"], "deleted": [], "reload": False}

        # nothing the tenant may see: it is not woken (the next frame it gets is its own)
        hub(batch(14, ("t2", "other", ["r2"])))
        hub(batch(15, ("t5", "acme/b", [])))
        assert data(await anext(tenant)) == {"seq": 15, "threads": ["t5"], "runs": [], "deleted": [], "reload": False}

        # more than a frame names: one reload
        hub(batch(16, *((f"x{i}", None, [f"y{i}"]) for i in range(MAX_IDS))))
        assert data(await anext(admin)) == {"seq": 16, "threads": [], "runs": [], "deleted": [], "reload": True}
        hub(batch(17, ("t1", "acme/a", [])))
        assert data(await anext(admin))["threads"] == ["t1"]

        # a deleted thread is named as such (a read of it would be a 404)
        gone = ThreadView(thread_id="t1", resource_id="acme/a", deleted=True)
        hub(BatchChanges.of_views(18, {"t1": gone, "t6": ThreadView(thread_id="t6")}, {}))
        assert data(await anext(admin)) == {"seq": 18, "threads": ["t6"], "runs": [], "deleted": ["t1"],
                                            "reload": False}
        assert data(await anext(tenant)) == {"seq": 18, "threads": [], "runs": [], "deleted": ["t1"],
                                             "reload": False}

        await admin.aclose()
        await tenant.aclose()
        assert hub.watchers == set()
        hub(batch(19, ("t1", "acme/a", [])))  # no one to tell

    asyncio.run(go())


def test_a_watcher_joins_and_reads_the_seq_in_one_step() -> None:
    """The first frame's seq is the runner's as the watcher joined, and a batch the runner tells
    its listeners of after that is framed (the runner raises its seq in the same step)."""
    async def go() -> None:
        hub = ListingChanges()
        applied = [20]
        frames = hub.frames(Principal(), lambda: applied[0])
        assert data(await anext(frames)) == {"seq": 20, "threads": [], "runs": [], "deleted": [], "reload": True}
        applied[0] = 21
        hub(batch(21, ("t", None, ["r"])))
        assert data(await anext(frames)) == {"seq": 21, "threads": ["t"], "runs": ["r"], "deleted": [], "reload": False}
        await frames.aclose()

    asyncio.run(go())


def test_without_follow_the_stream_is_its_first_frame() -> None:
    async def go() -> None:
        hub = ListingChanges()
        frames = [f async for f in hub.frames(Principal(), lambda: 7, follow=False)]
        assert [data(f) for f in frames] == [{"seq": 7, "threads": [], "runs": [], "deleted": [], "reload": True}]
        assert hub.watchers == set()

    asyncio.run(go())


def test_a_reload_told_by_the_runner_is_every_watchers_next_frame() -> None:
    """A standby that may have missed the writer's notice of a batch tells `reload`: each watcher's
    next frame says reload (what it had pending is dropped: the lists are loaded again), at that seq."""
    async def go() -> None:
        hub = ListingChanges()
        admin = hub.frames(Principal(), lambda: 30)
        tenant = hub.frames(Principal(tenant="acme"), lambda: 30)
        await anext(admin)
        await anext(tenant)
        hub(batch(31, ("t1", "acme/a", ["r1"])))
        hub(BatchChanges(seq=33, reload=True))
        reload = {"seq": 33, "threads": [], "runs": [], "deleted": [], "reload": True}
        assert data(await anext(admin)) == reload and data(await anext(tenant)) == reload
        hub(batch(34, ("t1", "acme/a", [])))
        assert data(await anext(tenant)) == {"seq": 34, "threads": ["t1"], "runs": [], "deleted": [], "reload": False}
        await admin.aclose()
        await tenant.aclose()

    asyncio.run(go())
