"""Thread routes (DESIGN 5.1): create, list, get, patch metadata, delete, messages, state, events.

Writes (create/patch/delete) are commits of thread-level events appended under per-thread OCC;
their answers carry the commit `seq` for read-your-writes (`min_seq`). The view they return is
the fold of the log up to that commit, so it is exact even while the projection catches up.
"""

from __future__ import annotations

from aiohttp import web

from agentlog.eventlog.events import (
    Position,
    StoredCommit,
    ThreadDeleted,
    ThreadMetadataUpdated,
)
from agentlog.gateway.http import sse
from agentlog.gateway.http.errors import ApiError
from agentlog.gateway.http.replies import reply
from agentlog.gateway.http.requests import principal, services
from agentlog.gateway.http.routing import Route, parse_body, parse_query, path_id
from agentlog.gateway.operations import branches
from agentlog.gateway.operations import operations as ops
from agentlog.gateway.operations.models import (
    CreateThread,
    DeleteThreadQuery,
    EventsQuery,
    ForkThread,
    GetViewQuery,
    ListThreadsQuery,
    MessagesQuery,
    RevokeQuery,
    StateQuery,
    UpdateThread,
)
from agentlog.gateway.operations.services import thread_from_log
from agentlog.gateway.operations.threads import after, append, create, current, revoke
from agentlog.projections.timeline import within
from agentlog.projections.timetravel import state_at


async def create_thread(request: web.Request) -> web.Response:
    body = await parse_body(request, CreateThread)
    return reply(await create(services(request), principal(request), body), status=201)


async def fork_thread(request: web.Request) -> web.Response:
    """A new thread from this one's history as of an event (`agentlog.api.threads.fork`)."""
    body = await parse_body(request, ForkThread)
    return reply(await ops.fork_thread(services(request), principal(request), path_id(request), body), status=201)


async def diff_threads(request: web.Request) -> web.Response:
    """Two branches compared event by event from their fork point (`agentlog.api.threads.diff`)."""
    a, b = path_id(request), path_id(request, "other")
    return reply(await branches.diff(services(request), principal(request), a, b))


async def revoke_permission(request: web.Request) -> web.Response:
    """Remove standing permission rules of a tool (`agentlog.api.threads.revoke`)."""
    q = parse_query(request, RevokeQuery)
    return reply(await revoke(services(request), principal(request), path_id(request), q))


async def list_threads(request: web.Request) -> web.Response:
    q = parse_query(request, ListThreadsQuery)
    return reply(await ops.list_threads(services(request), principal(request), q))


async def get_thread(request: web.Request) -> web.Response:
    thread_id = path_id(request)
    q = parse_query(request, GetViewQuery)
    return reply(await ops.get_thread(services(request), principal(request), thread_id, q))


async def update_thread(request: web.Request) -> web.Response:
    svc, who = services(request), principal(request)
    thread_id = path_id(request)
    body = await parse_body(request, UpdateThread)
    view, version = await current(svc, who, thread_id, body.expected_version)
    seq, commit = await append(svc, thread_id, [ThreadMetadataUpdated(metadata=body.metadata)], version)
    return reply({"thread": after(view, seq, commit), "seq": seq})


async def delete_thread(request: web.Request) -> web.Response:
    svc, who = services(request), principal(request)
    thread_id = path_id(request)
    q = parse_query(request, DeleteThreadQuery)
    _view, version = await current(svc, who, thread_id, q.expected_version)
    seq, _commit = await append(svc, thread_id, [ThreadDeleted(reason=q.reason)], version)
    return reply({"thread_id": thread_id, "deleted": True, "seq": seq})


async def thread_messages(request: web.Request) -> web.Response:
    """Messages in log order, each with the event id that appended it (the `after` cursor)."""
    thread_id = path_id(request)
    q = parse_query(request, MessagesQuery)
    return reply(await ops.thread_messages(services(request), principal(request), thread_id, q))


async def thread_state(request: web.Request) -> web.Response:
    svc, who = services(request), principal(request)
    thread_id = path_id(request)
    q = parse_query(request, StateQuery)
    commits, view = await thread_from_log(svc, who, thread_id)
    if q.at is None:
        return reply({"thread_id": thread_id, "at": None, "version": view.version, "state": view.state})
    at, warning = within(commits, Position.parse(q.at))
    out = {"thread_id": thread_id, "at": str(at), "version": view.version, "state": state_at(commits, thread_id, at)}
    return reply({**out, "warning": warning} if warning else out)


def resume_point(request: web.Request, q: EventsQuery) -> Position | None:
    """`Last-Event-ID` (what browsers send on reconnect) wins over `after`."""
    header = request.headers.get("Last-Event-ID")
    text = header if header is not None and header.strip() else q.after
    if text is None:
        return None
    try:
        return Position.parse(text)
    except ValueError as exc:
        raise ApiError(400, "invalid_event_id", str(exc),
                       [{"field": "Last-Event-ID" if header else "after", "message": str(exc),
                         "type": "invalid_event_id"}]) from None


def last_seq(commits: list[StoredCommit], after: Position | None) -> int:
    """Where a live tail starts so it continues both the history and the resume point."""
    floor = after.seq - 1 if after is not None else 0
    return max(commits[-1].seq if commits else 0, floor)


async def thread_events(request: web.Request) -> web.StreamResponse:
    svc, who = services(request), principal(request)
    thread_id = path_id(request)
    q = parse_query(request, EventsQuery)
    after = resume_point(request, q)
    # join the shared feed before reading the history (see agentlog.gateway.http.sse: no gap, no dup)
    live = await sse.hub_of(request).join(thread_id) if q.follow else None
    try:
        commits, _view = await thread_from_log(svc, who, thread_id)
    except BaseException:
        if live is not None:
            await live.aclose()
        raise
    frames = sse.positioned_events(commits, live, after)
    return await sse.stream(request, frames, queue_size=svc.settings.sse_queue,
                            heartbeat=svc.settings.sse_heartbeat, stall=svc.settings.sse_stall)


_THREAD = {"$ref": "#/components/schemas/ThreadView"}
_WRITE = {"type": "object", "properties": {"thread": _THREAD, "seq": {"type": "integer"}},
          "required": ["thread", "seq"]}

ROUTES: list[Route] = [
    Route("POST", "/v1/threads", create_thread, "Create a thread (ThreadCreated)", "threads",
          body=CreateThread, response=_WRITE, status=201, errors=(403, 409, 413)),
    Route("GET", "/v1/threads", list_threads,
          "List live threads, newest first (order=asc: oldest first; from the listing index)", "threads",
          query=ListThreadsQuery,
          response={"type": "object", "properties": {"threads": {"type": "array", "items": _THREAD},
                                                     "total": {"type": "integer"}, "limit": {"type": "integer"},
                                                     "offset": {"type": "integer"},
                                                     "order": {"type": "string", "enum": ["desc", "asc"]}}}),
    Route("GET", "/v1/threads/{id}", get_thread, "One thread (from the views)", "threads",
          query=GetViewQuery, response=_THREAD, errors=(404,)),
    Route("PATCH", "/v1/threads/{id}", update_thread, "Merge metadata (ThreadMetadataUpdated)", "threads",
          body=UpdateThread, response=_WRITE, errors=(404, 409)),
    Route("DELETE", "/v1/threads/{id}", delete_thread, "Delete (ThreadDeleted tombstone)", "threads",
          query=DeleteThreadQuery,
          response={"type": "object", "properties": {"thread_id": {"type": "string"},
                                                     "deleted": {"type": "boolean"}, "seq": {"type": "integer"}}},
          errors=(404, 409)),
    Route("POST", "/v1/threads/{id}/fork", fork_thread,
          "Fork the thread at an event into a new thread (ThreadCreated.forked_from, its messages and state as of it)",
          "threads", body=ForkThread,
          response={"type": "object", "properties": {"thread_id": {"type": "string"}, "thread": _THREAD,
                                                     "seq": {"type": "integer"}},
                    "required": ["thread_id", "thread", "seq"]},
          status=201, errors=(400, 404, 409, 413)),
    Route("GET", "/v1/threads/{id}/diff/{other}", diff_threads,
          "Compare two threads event by event from their fork point: the common prefix's length, then the "
          "aligned rest (same / changed / only_a / only_b)", "threads",
          response={"type": "object", "properties": {"common": {"type": "integer"}, "rows": {"type": "array"}}},
          errors=(404,)),
    Route("DELETE", "/v1/threads/{id}/permissions", revoke_permission,
          "Revoke standing permission rules of a tool (thread state agentlog.permissions)", "threads",
          query=RevokeQuery,
          response={"type": "object", "properties": {"thread_id": {"type": "string"},
                                                     "removed": {"type": "array"}, "permissions": {"type": "object"},
                                                     "seq": {"type": "integer"}}},
          errors=(404, 409)),
    Route("GET", "/v1/threads/{id}/messages", thread_messages, "Messages, from the log", "threads",
          query=MessagesQuery,
          response={"type": "object", "properties": {
              "messages": {"type": "array", "items": {"type": "object", "properties": {
                  "event_id": {"type": "string"}, "run_id": {"type": ["string", "null"]},
                  "message": {"$ref": "#/components/schemas/Message"}}}},
              "next_after": {"type": ["string", "null"]}}},
          errors=(404,)),
    Route("GET", "/v1/threads/{id}/state", thread_state, "Thread state, now or as of an event id",
          "threads", query=StateQuery,
          response={"type": "object", "properties": {"thread_id": {"type": "string"},
                                                     "at": {"type": ["string", "null"]},
                                                     "version": {"type": "integer"}, "state": {"type": "object"},
                                                     "warning": {"$ref": "#/components/schemas/PositionWarning"}}},
          errors=(404,)),
    Route("GET", "/v1/threads/{id}/events", thread_events, "Event stream (SSE) of a thread, from the log",
          "threads", query=EventsQuery, content_type="text/event-stream", errors=(404,)),
]

__all__ = ["ROUTES", "last_seq", "resume_point"]
