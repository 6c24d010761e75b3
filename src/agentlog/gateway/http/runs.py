"""Run read routes (DESIGN 5.1): list, get, and the run's event stream.

The write routes (`POST /v1/runs`, `/v1/runs/{id}/inputs`, `/v1/runs/{id}/cancel`) live in
`agentlog.gateway.http.write`: they are added by passing their `Route`s to
`create_app(extra_routes=...)`, and each holds the `Dispatcher` it was built with.
"""

from __future__ import annotations

from aiohttp import web

from agentlog.eventlog.events import (
    AnyEvent,
    Position,
    RunFinished,
    RunResumed,
    RunStarted,
    RunSuspended,
    StoredCommit,
    ToolCallDecided,
)
from agentlog.gateway.http import sse
from agentlog.gateway.http.errors import not_found
from agentlog.gateway.http.replies import reply
from agentlog.gateway.http.requests import principal, services
from agentlog.gateway.http.routing import Route, parse_query, path_id
from agentlog.gateway.http.threads import resume_point
from agentlog.gateway.operations import operations as ops
from agentlog.gateway.operations.auth import Principal
from agentlog.gateway.operations.models import EventsQuery, GetViewQuery, ListRunsQuery
from agentlog.gateway.operations.services import Services, get_thread_view, wait_min_seq


async def list_runs(request: web.Request) -> web.Response:
    q = parse_query(request, ListRunsQuery)
    return reply(await ops.list_runs(services(request), principal(request), q))


async def get_run(request: web.Request) -> web.Response:
    run_id = path_id(request, kind="run_id")
    q = parse_query(request, GetViewQuery)
    return reply(await ops.get_run(services(request), principal(request), run_id, q))


def pauses(event: AnyEvent) -> bool:
    """A followed run stream ends when the run finishes or suspends (waits for a human)."""
    return isinstance(event, (RunFinished, RunSuspended))


def paused(commits: list[StoredCommit]) -> bool | None:
    """Whether the run whose commits (a suffix of them, in log order) are `commits` is paused
    now: the last of its pause events (`RunSuspended`, `RunFinished`) and its go events
    (`RunStarted`, `RunResumed`) says which; None if `commits` hold neither (read further back).
    A suspension whose calls all have a decision recorded after it is not a pause: a worker is
    to apply them (the run is on its way, and its stream goes on to its next pause).

    The same events as the live stream's end (`pauses`), so that "the pause is already in the
    history" and "wait for the pause live" cannot disagree: a run paused by this test ends the
    stream after its history, one not paused is followed until a pause event arrives live. (A
    fold's status could say `running` after a `RunSuspended`, and the stream would then wait for
    a pause that had already happened.)"""
    decided: set[str] = set()
    for stored in reversed(commits):
        for event in reversed(stored.commit.events):
            if isinstance(event, ToolCallDecided):
                decided.add(event.call_id)
            elif isinstance(event, RunFinished):
                return True
            elif isinstance(event, RunSuspended):
                return not (event.call_ids and decided.issuperset(event.call_ids))
            elif isinstance(event, (RunStarted, RunResumed)):
                return False
    return None


async def run_from_log(svc: Services, who: Principal, run_id: str,
                       after: Position | None = None) -> tuple[list[StoredCommit], str, bool]:
    """The run's commits (with `after`, those from `after`'s commit on, when that is enough to
    tell whether the run is paused: a stream resumed with `Last-Event-ID` does not read the
    run's whole history again), its thread, and whether it is live (not paused: see `paused`)."""
    commits: list[StoredCommit] = []
    if after is not None and after.seq > 1:
        commits = [c async for c in svc.store.read_run(run_id, after=after.seq - 1)]
    state = paused(commits) if commits else None
    if state is None:
        commits = [c async for c in svc.store.read_run(run_id)]
        if not commits:
            raise not_found("run", run_id)
        state = paused(commits)
    thread_id = commits[0].commit.thread_id
    if who.tenant is not None:
        await wait_min_seq(svc, commits[0].seq)  # the thread's creation precedes its runs
        thread = await get_thread_view(svc, thread_id)
        if thread is None or not who.can_see(thread.resource_id):
            raise not_found("run", run_id)
    return commits, thread_id, not state


async def follow_run(request: web.Request, svc: Services, run_id: str, thread_id: str,
                     commits: list[StoredCommit]) -> sse.Membership | None:
    """Join the thread's shared feed, then read the run's commits appended since `commits` (so
    the history ends after the join: no gap). Extends `commits`; None (and left) if the run
    paused meanwhile (its pause is then in the history, and nothing live would end the stream).
    A member that started the feed from the last commit read reads nothing: the feed delivers
    every commit after it, a pause included."""
    live = await sse.hub_of(request).join(thread_id, after=commits[-1].seq)
    if live.since is not None:
        return live
    try:
        tail = [c async for c in svc.store.read_run_tail(run_id, commits[-1].seq)]
    except BaseException:
        await live.aclose()
        raise
    commits.extend(tail)
    if paused(tail):
        await live.aclose()
        return None
    return live


async def run_events(request: web.Request) -> web.StreamResponse:
    svc, who = services(request), principal(request)
    run_id = path_id(request, kind="run_id")
    q = parse_query(request, EventsQuery)
    after = resume_point(request, q)
    commits, thread_id, running = await run_from_log(svc, who, run_id, after if q.follow else None)
    live = await follow_run(request, svc, run_id, thread_id, commits) if q.follow and running else None
    frames = sse.positioned_events(commits, live, after, keep=lambda c: c.commit.run_id == run_id,
                                   stop=pauses)
    return await sse.stream(request, frames, queue_size=svc.settings.sse_queue,
                            heartbeat=svc.settings.sse_heartbeat, stall=svc.settings.sse_stall)


_RUN = {"$ref": "#/components/schemas/RunView"}

ROUTES: list[Route] = [
    Route("GET", "/v1/runs", list_runs, "List runs, newest first (order=asc: oldest first; from the listing index)",
          "runs", query=ListRunsQuery,
          response={"type": "object", "properties": {"runs": {"type": "array", "items": _RUN},
                                                     "total": {"type": "integer"}, "limit": {"type": "integer"},
                                                     "offset": {"type": "integer"},
                                                     "order": {"type": "string", "enum": ["desc", "asc"]}}}),
    Route("GET", "/v1/runs/{id}", get_run, "One run (from the views)", "runs", query=GetViewQuery,
          response=_RUN, errors=(404,)),
    Route("GET", "/v1/runs/{id}/events", run_events,
          "Event stream (SSE) of a run, from the log; with follow, until it finishes or suspends", "runs",
          query=EventsQuery, content_type="text/event-stream", errors=(404,)),
]

__all__ = ["ROUTES"]
