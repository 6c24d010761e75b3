"""`GET /v1/changes`: which threads and runs changed, live (SSE), for lists kept open.

Each frame is `id: <seq>`, `event: changes`, `data: {"seq", "threads", "runs", "deleted",
"reload"}`: the views of those thread and run ids changed in the projection batches up to `seq`;
read them with `min_seq=<seq>` (`GET /v1/runs/{id}`, `GET /v1/threads/{id}`); the `deleted`
threads were deleted (a read of them is a 404: drop them). The first frame of a stream has
`reload: true` and no ids: the views hold everything up to its `seq`, so a client loads its lists
then (with `min_seq`) and applies the frames that follow, missing nothing. `reload: true` on a
later frame means more changed than one frame names: load the lists again. A stream never resumes
(`Last-Event-ID` is ignored): a client that reconnects gets a first frame and reloads. With
`follow=false` the stream is its first frame alone (the views' seq now).

Why this and not a poll of the listings or a tail of the log, with many tabs open:

- one broadcaster per process, fed by the projection runner as each batch becomes visible
  (`ProjectionRunner.listeners`), on every gateway whichever writes the views (the writer
  publishes one small core NATS notice per batch, `agentlog.projections.notices`; a gateway
  that may have missed one tells its clients `reload`): no consumer or KV read per client, and a
  frame only when something changed (a poll would cost every tab a listing read every few
  seconds, idle or not, and still lag);
- each client keeps only the set of ids changed since its last frame: a run that changed fifty
  times while a tab was busy is one id, and past `MAX_IDS` the set is dropped for one `reload`.
  So a slow tab holds bounded memory, nothing is queued per change, and neither the runner nor
  the other tabs ever wait on it (its SSE pump drops it if it stops reading; it reconnects);
- a client learns only of threads its token may see (the thread's `resource_id`, as every
  read is scoped) and of runs on them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import msgspec
from aiohttp import web
from pydantic import Field

from agentlog.gateway.http import sse
from agentlog.gateway.http.requests import principal, services
from agentlog.gateway.http.routing import Route, parse_query
from agentlog.gateway.operations.auth import Principal
from agentlog.gateway.operations.models import Query
from agentlog.projections.notices import BatchChanges

#: Most ids one client keeps between frames; past it the client is told to reload.
MAX_IDS = 500
#: Frames queued for one client's connection (each names what changed since the one before).
QUEUE_SIZE = 16

_encode = msgspec.json.Encoder().encode


class Watcher:
    """One client's pending changes: ids since its last frame, and the seq they reach."""

    __slots__ = ("deleted", "ready", "reload", "runs", "seq", "threads", "who")

    def __init__(self, who: Principal, seq: int) -> None:
        self.who = who
        self.seq = seq
        self.threads: set[str] = set()
        self.deleted: set[str] = set()
        self.runs: set[str] = set()
        self.reload = True  # the first frame: load the lists
        self.ready = asyncio.Event()
        self.ready.set()

    def offer(self, changes: BatchChanges) -> None:
        who, threads, runs = self.who, changes.threads, changes.runs
        seen = [tid for tid, t in threads.items() if who.can_see(t.resource_id)]
        self.seq = max(self.seq, changes.seq)
        if changes.reload:
            self.reload = True
        if not self.reload:
            for tid in seen:
                if threads[tid].deleted:
                    self.deleted.add(tid)
                    self.threads.discard(tid)
                else:
                    self.threads.add(tid)
            if who.tenant is None:
                self.runs.update(runs)
            else:
                visible = set(seen)
                self.runs.update(rid for rid, thread_id in runs.items() if thread_id in visible)
            if len(self.threads) + len(self.deleted) + len(self.runs) > MAX_IDS:
                self.reload = True
        if seen or self.reload:
            self.ready.set()

    def take(self) -> bytes:
        """The frame of what is pending, and nothing pending after it."""
        data = {"seq": self.seq, "threads": [] if self.reload else sorted(self.threads),
                "runs": [] if self.reload else sorted(self.runs),
                "deleted": [] if self.reload else sorted(self.deleted), "reload": self.reload}
        self.threads, self.runs, self.deleted, self.reload = set(), set(), set(), False
        self.ready.clear()
        return b"id: %d\nevent: changes\ndata: %s\n\n" % (self.seq, _encode(data))


class ListingChanges:
    """The process's broadcaster: a `ProjectionRunner` listener offering each batch to every
    watcher (`Watcher.offer`: a few set updates, never a wait)."""

    def __init__(self) -> None:
        self.watchers: set[Watcher] = set()

    def __call__(self, changes: BatchChanges) -> None:
        for watcher in self.watchers:
            watcher.offer(changes)

    async def frames(self, who: Principal, applied_seq: Callable[[], int], *, follow: bool = True,
                     ) -> AsyncIterator[bytes]:
        """The frames of one client, from a first `reload` at `applied_seq()` on (only that one
        without `follow`). The watcher joins and reads the seq in one step: the runner raises its
        seq and tells its listeners in one step too, so every batch past the first frame's seq
        is framed."""
        watcher = Watcher(who, applied_seq())
        if not follow:
            yield watcher.take()
            return
        self.watchers.add(watcher)
        try:
            while True:
                await watcher.ready.wait()
                yield watcher.take()
        finally:
            self.watchers.discard(watcher)


CHANGES = web.AppKey("agentlog.listing_changes", ListingChanges)


def install(app: web.Application, runner: object) -> None:
    """Give `app` its broadcaster, listening to `runner`'s batches for as long as the app runs
    (a runner without listeners, a test double, gives streams with only their first frame)."""
    changes = app[CHANGES] = ListingChanges()
    listeners = getattr(runner, "listeners", None)
    if isinstance(listeners, list):
        listeners.append(changes)

        async def detach(_app: web.Application) -> None:
            if changes in listeners:
                listeners.remove(changes)

        app.on_cleanup.append(detach)


class ChangesQuery(Query):
    follow: bool = Field(default=True, description="false: the first frame (reload, the views' seq) alone")


async def listing_changes(request: web.Request) -> web.StreamResponse:
    svc, who = services(request), principal(request)
    q = parse_query(request, ChangesQuery)
    runner = svc.runner
    frames = request.app[CHANGES].frames(who, lambda: runner.applied_seq, follow=q.follow)
    return await sse.stream(request, frames, queue_size=QUEUE_SIZE, heartbeat=svc.settings.sse_heartbeat,
                            stall=svc.settings.sse_stall)


ROUTES: list[Route] = [
    Route("GET", "/v1/changes", listing_changes,
          "Live (SSE): the ids of threads and runs whose views changed, per projection batch (frames "
          "{seq, threads, runs, deleted, reload}; the first is a reload: load the lists with min_seq=seq)",
          "threads",
          query=ChangesQuery, content_type="text/event-stream"),
]

__all__ = ["CHANGES", "MAX_IDS", "ChangesQuery", "ListingChanges", "ROUTES", "Watcher", "install"]
