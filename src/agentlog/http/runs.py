"""Run read routes (DESIGN 5.1): list, get, and the run's event stream.

The write routes (`POST /v1/runs`, `/v1/runs/{id}/inputs`, `/v1/runs/{id}/cancel`) belong to the
runtime issue: they are added by passing their `Route`s to `create_app(extra_routes=...)`, and
reach the runtime through `services(request).runtime`.
"""

from __future__ import annotations

from aiohttp import web

from agentlog.api import operations as ops
from agentlog.api.models import EventsQuery, GetViewQuery, ListRunsQuery
from agentlog.log.events import AnyEvent, RunFinished, RunSuspended, StoredCommit
from agentlog.views.fold import Folder

from . import sse
from .auth import Principal, principal
from .context import Services, get_thread_view, services, wait_min_seq
from .errors import not_found
from .replies import reply
from .routing import Route, parse_query, path_id
from .threads import resume_point


async def list_runs(request: web.Request) -> web.Response:
    q = parse_query(request, ListRunsQuery)
    return reply(await ops.list_runs(services(request), principal(request), q))


async def get_run(request: web.Request) -> web.Response:
    run_id = path_id(request, kind="run_id")
    q = parse_query(request, GetViewQuery)
    return reply(await ops.get_run(services(request), principal(request), run_id, q))


def _pauses(event: AnyEvent) -> bool:
    """A followed run stream ends when the run finishes or suspends (waits for a human)."""
    return isinstance(event, (RunFinished, RunSuspended))


async def _run_from_log(svc: Services, who: Principal, run_id: str) -> tuple[list[StoredCommit], str, bool]:
    """The run's commits, its thread, and whether it is live (not done, not waiting)."""
    commits = [c async for c in svc.store.read_run(run_id)]
    if not commits:
        raise not_found("run", run_id)
    thread_id = commits[0].commit.thread_id
    if who.tenant is not None:
        await wait_min_seq(svc, commits[0].seq)  # the thread's creation precedes its runs
        thread = await get_thread_view(svc, thread_id)
        if thread is None or not who.can_see(thread.resource_id):
            raise not_found("run", run_id)
    return commits, thread_id, _running(commits, run_id)


def _running(commits: list[StoredCommit], run_id: str) -> bool:
    """Live: running, or waiting only for a worker to apply decisions already recorded (a
    follower that joins right after an approval must see the run go on, not just its past)."""
    folder = Folder()
    for stored in commits:
        folder.apply_commit(stored.seq, stored.commit)
    view = folder.run(run_id)
    if view is None or view.status == "done":
        return False
    return view.status == "running" or all(c.decision is not None for c in view.calls.values()
                                           if c.status == "suspended")


async def _follow_run(request: web.Request, svc: Services, run_id: str, thread_id: str,
                      commits: list[StoredCommit]) -> sse.Membership | None:
    """Join the thread's shared feed, then read the run's commits appended since `commits` (so
    the history ends after the join: no gap). Extends `commits`; None (and left) if the run
    stopped running meanwhile (its end is then in the history, and nothing live would end the
    stream)."""
    live = await sse.hub_of(request).join(thread_id)
    try:
        tail = [c async for c in svc.store.read_run(run_id, after=commits[-1].seq)]
    except BaseException:
        await live.aclose()
        raise
    commits.extend(tail)
    if tail and not _running(commits, run_id):
        await live.aclose()
        return None
    return live


async def run_events(request: web.Request) -> web.StreamResponse:
    svc, who = services(request), principal(request)
    run_id = path_id(request, kind="run_id")
    q = parse_query(request, EventsQuery)
    after = resume_point(request, q)
    commits, thread_id, running = await _run_from_log(svc, who, run_id)
    live = await _follow_run(request, svc, run_id, thread_id, commits) if q.follow and running else None
    frames = sse.positioned_events(commits, live, after, keep=lambda c: c.commit.run_id == run_id,
                                   stop=_pauses)
    return await sse.stream(request, frames, queue_size=svc.settings.sse_queue,
                            heartbeat=svc.settings.sse_heartbeat)


_RUN = {"$ref": "#/components/schemas/RunView"}

ROUTES: list[Route] = [
    Route("GET", "/v1/runs", list_runs, "List runs, ascending run id (from the listing index)", "runs", query=ListRunsQuery,
          response={"type": "object", "properties": {"runs": {"type": "array", "items": _RUN},
                                                     "total": {"type": "integer"}, "limit": {"type": "integer"},
                                                     "offset": {"type": "integer"}}}),
    Route("GET", "/v1/runs/{id}", get_run, "One run (from the views)", "runs", query=GetViewQuery,
          response=_RUN, errors=(404,)),
    Route("GET", "/v1/runs/{id}/events", run_events,
          "Event stream (SSE) of a run, from the log; with follow, until it finishes or suspends", "runs",
          query=EventsQuery, content_type="text/event-stream", errors=(404,)),
]

__all__ = ["ROUTES"]
