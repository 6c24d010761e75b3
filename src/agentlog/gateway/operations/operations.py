"""The API's operations, once, for every transport: validated pydantic input + a principal in,
a JSON-able dict out. HTTP handlers (`agentlog.gateway.http.write`) and NATS endpoints
(`agentlog.gateway.nats.service`) are thin wrappers around these, so a request means the same thing and
fails with the same error code whichever way it arrives.

Tenant scoping lives here too: a scoped principal may only touch runs on threads whose
`resource_id` it can see (anything else is 404, like an unknown id) and may only create threads
inside its prefix (403).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from agentlog.eventlog.events import Position
from agentlog.eventlog.store import first_commit
from agentlog.gateway.operations import threads
from agentlog.gateway.operations.auth import Principal
from agentlog.gateway.operations.dispatch import Accepted, Dispatcher, RunAccess
from agentlog.gateway.operations.errors import ApiError, not_found
from agentlog.gateway.operations.models import (
    CancelRunBody,
    CreateThread,
    DecisionIn,
    ForkThread,
    GetViewQuery,
    InputMessage,
    ListRunsQuery,
    ListThreadsQuery,
    MessagesQuery,
    RunInputsBody,
    StartRunBody,
)
from agentlog.gateway.operations.services import (
    Services,
    current_run,
    current_thread,
    get_thread_view,
    thread_from_log,
    visible_run,
    visible_thread,
    wait_min_seq,
)
from agentlog.projections.fold import fold_messages
from agentlog.projections.index import RUN_FILTERS, THREAD_FILTERS
from agentlog.runtime import RunConflict, RunNotFound, RunRequest
from agentlog.runtime.inputs import RunInput, as_run_input


def accepted(a: Accepted) -> dict[str, Any]:
    """`{thread_id, run_id, seq[, duplicate: true][, status: "queued"]}` (see `Accepted`)."""
    out: dict[str, Any] = {"thread_id": a.thread_id, "run_id": a.run_id, "seq": a.seq}
    if a.duplicate:
        out["duplicate"] = True
    if a.queued:
        out["status"] = "queued"
    return out


def _messages(messages: Any) -> Any:
    if isinstance(messages, str):
        return messages
    return [m.model_dump(exclude_none=True) if isinstance(m, InputMessage) else m for m in messages]


def _decisions(decisions: list[DecisionIn]) -> list[dict[str, Any]]:
    return [d.model_dump(exclude_none=True) for d in decisions]


def _run_input(body: StartRunBody) -> RunInput | None:
    """The body's overrides, context and state as a run input (`agentlog.runtime.inputs.run_input`)."""
    out: dict[str, Any] = {}
    if body.overrides is not None:
        out["overrides"] = body.overrides.model_dump(exclude_none=True)
    if body.context:
        out["context"] = [c.model_dump() for c in body.context]
    if body.state is not None:
        out["state"] = body.state
    return as_run_input(out)


# -- access checks (from the log first: a run just started may not be in the views yet) --------


async def check_thread_access(svc: Services, who: Principal, thread_id: str) -> None:
    """An existing thread must be visible to a scoped caller (404 otherwise); a new one is fine."""
    if who.tenant is None:
        return
    version = await svc.store.thread_version(thread_id)
    if version:
        await wait_min_seq(svc, version)
        await visible_thread(svc, who, thread_id)


async def check_run_access(svc: Services, who: Principal, run_id: str) -> None:
    """404 `run_not_found` for an unknown run, or one on a thread the caller may not see."""
    first = await first_commit(svc.store.read_run(run_id))
    if first is None:
        raise not_found("run", run_id)
    if who.tenant is None:
        return
    await wait_min_seq(svc, first.seq)
    thread = await get_thread_view(svc, first.commit.thread_id)
    if thread is None or not who.can_see(thread.resource_id):
        raise not_found("run", run_id)


def run_access(svc: Services, who: Principal, run_id: str) -> RunAccess | None:
    """The access check a dispatcher makes on the run it reads for a request (`RunAccess`): a
    scoped caller sees `run_not_found` for a run on a thread it may not see. None: unscoped."""
    if who.tenant is None:
        return None

    async def check(thread_id: str, seq: int) -> None:
        await wait_min_seq(svc, seq)
        thread = await get_thread_view(svc, thread_id)
        if thread is None or not who.can_see(thread.resource_id):
            raise RunNotFound(f"unknown run {run_id!r}")  # word for word what an unknown run gets

    return check


# -- writes -------------------------------------------------------------------------------------


async def start_run(svc: Services, who: Principal, dispatcher: Dispatcher, body: StartRunBody) -> Accepted:
    if who.tenant is not None and body.thread_id is None and body.parent_run_id is None \
            and not who.can_see(body.resource_id):
        raise ApiError(403, "tenant_mismatch",
                       f"this token may only start runs on threads whose resource_id starts with {who.tenant!r}")
    if body.parent_run_id is not None:
        await check_run_access(svc, who, body.parent_run_id)
    if body.thread_id is not None:
        await check_thread_access(svc, who, body.thread_id)
        if who.tenant is not None and await svc.store.thread_version(body.thread_id) == 0 \
                and not who.can_see(body.resource_id):
            raise ApiError(403, "tenant_mismatch",
                           f"a new thread of this token needs a resource_id starting with {who.tenant!r}")
    return await dispatcher.start_run(RunRequest(
        agent_id=body.agent_id, messages=_messages(body.messages), thread_id=body.thread_id, run_id=body.run_id,
        parent_run_id=body.parent_run_id, decisions=_decisions(body.decisions), resource_id=body.resource_id,
        run_input=_run_input(body)))


async def run_inputs(svc: Services, who: Principal, dispatcher: Dispatcher, run_id: str,
                     body: RunInputsBody) -> Accepted:
    if body.mode is not None and not body.messages:
        raise ApiError(400, "invalid_input", f"mode {body.mode!r} needs messages")
    # the dispatcher checks a scoped caller's access on the run it reads anyway (no read of its own)
    access = run_access(svc, who, run_id)
    if body.mode is not None:
        return await dispatcher.submit_inputs(run_id, decisions=_decisions(body.decisions),
                                              messages=_messages(body.messages), mode=body.mode, access=access)
    try:
        return await dispatcher.submit_inputs(run_id, decisions=_decisions(body.decisions),
                                              messages=_messages(body.messages), access=access)
    except RunConflict as exc:
        if not body.messages:
            raise
        raise ApiError(409, exc.code, f"{exc} (send them with \"mode\": \"steer\" (taken at its next step), "
                                      "\"mode\": \"follow_up\" (taken when it would end) or "
                                      "\"mode\": \"interrupt\" (cancel it, then go on))") from None


async def cancel_run(svc: Services, who: Principal, dispatcher: Dispatcher, run_id: str,
                     body: CancelRunBody) -> Accepted:
    if who.tenant is not None:  # else the dispatcher's own read of the run answers `run_not_found`
        await check_run_access(svc, who, run_id)
    return await dispatcher.cancel(run_id, reason=body.reason)


# -- reads --------------------------------------------------------------------------------------


async def get_run(svc: Services, who: Principal, run_id: str, q: GetViewQuery) -> Any:
    """With `min_seq`: the views once they include it. Without: at least the run's thread's
    last commit (`current_run`), so a read right after a write shows it."""
    if q.min_seq is None:
        return await current_run(svc, who, run_id)
    await wait_min_seq(svc, q.min_seq)
    return await visible_run(svc, who, run_id)


def _filters(q: Any, attrs: Iterable[str]) -> dict[str, str]:
    return {attr: value for attr in attrs if (value := getattr(q, attr)) is not None}


def _listing(key: str, items: list[Any], total: int, q: Any) -> dict[str, Any]:
    return {key: items, "total": total, "limit": q.limit, "offset": q.offset, "order": q.order}


async def list_runs(svc: Services, who: Principal, q: ListRunsQuery) -> dict[str, Any]:
    """Newest first (by creation, the first commit's time; `order=asc`: oldest first), from the listing index (`agentlog.projections.listing`: O(limit) reads for one
    filter or none; a tenant reads the lists of its resources). A thread's runs without
    `min_seq` are listed as of (at least) the thread's last commit: the position is known there."""
    min_seq = q.min_seq
    if min_seq is None and q.thread_id is not None:
        min_seq = await svc.store.thread_version(q.thread_id)
    await wait_min_seq(svc, min_seq)
    filters = _filters(q, RUN_FILTERS)
    tenant = who.tenant
    if tenant is not None and q.thread_id is not None:
        thread = await get_thread_view(svc, q.thread_id)
        if thread is None or not who.can_see(thread.resource_id):
            return _listing("runs", [], 0, q)
        tenant = None  # the thread's runs are the answer: its list, O(limit)
    runs, total = await svc.views.run_page(filters, q.limit, q.offset, tenant=tenant, descending=q.order == "desc")
    return _listing("runs", runs, total, q)


async def create_thread(svc: Services, who: Principal, body: CreateThread) -> dict[str, Any]:
    return await threads.create(svc, who, body)


async def fork_thread(svc: Services, who: Principal, thread_id: str, body: ForkThread) -> dict[str, Any]:
    return await threads.fork(svc, who, thread_id, body)


async def get_thread(svc: Services, who: Principal, thread_id: str, q: GetViewQuery) -> Any:
    """Like `get_run`: without `min_seq`, at least the thread's last commit (`current_thread`).
    Adds `children`: the ids of the threads whose `parent_thread_id` is this one (its
    counterfactual branches, its sub-agents' threads), oldest first, at most `CHILDREN_SHOWN`
    (`GET /v1/threads?parent_thread_id=` lists them all)."""
    if q.min_seq is None:
        view = await current_thread(svc, who, thread_id)
    else:
        await wait_min_seq(svc, q.min_seq)
        view = await visible_thread(svc, who, thread_id)
    children, _total = await svc.views.thread_page({"parent_thread_id": thread_id}, CHILDREN_SHOWN, 0,
                                                   tenant=who.tenant)
    return {**msgspec.to_builtins(view), "children": [t.thread_id for t in children]}


#: How many child threads `get_thread` names.
CHILDREN_SHOWN = 100


async def list_threads(svc: Services, who: Principal, q: ListThreadsQuery) -> dict[str, Any]:
    """Live threads, newest first (`order=asc`: oldest first), from the listing index (see `list_runs`)."""
    await wait_min_seq(svc, q.min_seq)
    tenant = who.tenant
    if tenant is not None and q.resource_id is not None:
        if not who.can_see(q.resource_id):
            return _listing("threads", [], 0, q)
        tenant = None  # that resource's list is the answer
    threads, total = await svc.views.thread_page(_filters(q, THREAD_FILTERS), q.limit, q.offset, tenant=tenant,
                                                 descending=q.order == "desc")
    return _listing("threads", threads, total, q)


async def thread_messages(svc: Services, who: Principal, thread_id: str, q: MessagesQuery) -> dict[str, Any]:
    """Messages in log order, each with the event id that appended it (the `after` cursor)."""
    commits, _view = await thread_from_log(svc, who, thread_id)
    after = Position.parse(q.after) if q.after else None
    items: list[dict[str, Any]] = []
    for stored in commits:
        run_id = stored.commit.run_id
        for position, event in stored.positioned():
            # The fold decides what appends a message; folding onto () keeps this linear.
            appended = fold_messages((), event)
            if not appended:
                continue
            message = appended[-1]
            if after is not None and position <= after:
                continue
            if q.run_id is not None and run_id != q.run_id:
                continue
            if q.visibility is not None and message.visibility != q.visibility:
                continue
            items.append({"event_id": str(position), "run_id": run_id, "message": message})
    shown = items[: q.limit]
    more = len(items) > q.limit
    return {"messages": shown, "next_after": shown[-1]["event_id"] if more else None}


__all__ = [
    "accepted", "cancel_run", "create_thread", "fork_thread", "check_run_access", "check_thread_access", "run_access", "get_run", "get_thread", "list_runs",
    "list_threads", "run_inputs", "start_run", "thread_messages",
]
