"""Thread writes every transport shares (DESIGN 5.1): create, and the checked append under
per-thread OCC that patch and delete use. Answers carry the commit `seq` for read-your-writes
(`min_seq`); the view they return is the fold of the log up to that commit, so it is exact even
while the projection catches up.
"""

from __future__ import annotations

from typing import Any

from agentlog.eventlog.errors import VersionConflict
from agentlog.eventlog.events import Commit, Position, StatePatched, ThreadCreated
from agentlog.eventlog.ids import new_id, now_ms
from agentlog.gateway.operations.auth import Principal
from agentlog.gateway.operations.errors import ApiError
from agentlog.gateway.operations.models import CreateThread, ForkThread, RevokeQuery
from agentlog.gateway.operations.services import Services, thread_from_log, visible_thread, wait_min_seq
from agentlog.projections.fold import Folder
from agentlog.projections.fork import InvalidFork, fork_events
from agentlog.projections.views import ThreadView
from agentlog.runtime import STANDING_KEY


def conflict(message: str) -> ApiError:
    return ApiError(409, "thread_exists", message)


async def append(svc: Services, thread_id: str, events: list[Any], version: int) -> tuple[int, Commit]:
    commit = Commit(commit_id=new_id(), thread_id=thread_id, run_id=None, ts=now_ms(), events=events)
    result = await svc.store.append(commit, expected_version=version)
    return result.seq, commit


def after(view: ThreadView | None, seq: int, commit: Commit) -> ThreadView | None:
    folder = Folder({view.thread_id: view} if view is not None else None)
    folder.apply_commit(seq, commit)
    return folder.thread(commit.thread_id)


async def create(svc: Services, who: Principal, body: CreateThread) -> dict[str, Any]:
    """Create a thread (HTTP and NATS `threads.create`): `{"thread": view, "seq": seq}`."""
    if not who.can_see(body.resource_id):
        raise ApiError(403, "tenant_mismatch",
                       f"this token may only create threads whose resource_id starts with {who.tenant!r}")
    if body.parent_thread_id is not None:
        await _check_parent(svc, who, body.parent_thread_id)
    thread_id = body.thread_id or new_id()
    if await svc.store.thread_version(thread_id) != 0:
        raise conflict(f"thread {thread_id!r} already exists")
    event = ThreadCreated(resource_id=body.resource_id, parent_thread_id=body.parent_thread_id,
                          metadata=body.metadata)
    try:
        seq, commit = await append(svc, thread_id, [event], 0)
    except VersionConflict:
        raise conflict(f"thread {thread_id!r} already exists") from None
    return {"thread": after(None, seq, commit), "seq": seq}


async def fork(svc: Services, who: Principal, thread_id: str, body: ForkThread) -> dict[str, Any]:
    """Fork `thread_id` at the event `body.at` into a new thread (HTTP `POST /v1/threads/{id}/fork`,
    NATS `threads.fork`): `{"thread_id", "thread": view, "seq"}`. One commit
    (`agentlog.projections.fork`); the fork inherits the source's `resource_id`, so a tenant forks only
    its own threads (another's is a 404, like any read of it). Every check is made before it."""
    commits, _view = await thread_from_log(svc, who, thread_id)
    new_thread = body.new_thread_id or new_id()
    try:
        events = fork_events(
            commits, thread_id, Position.parse(body.at), new_id=new_id, state=body.state,
            state_patch=body.state_patch,
            replace_message=body.replace_message.model_dump() if body.replace_message else None,
            metadata=body.metadata)
    except InvalidFork as exc:
        raise ApiError(400, exc.code, str(exc)) from None
    if await svc.store.thread_version(new_thread) != 0:
        raise conflict(f"thread {new_thread!r} already exists")
    try:
        seq, commit = await append(svc, new_thread, events, 0)
    except VersionConflict:
        raise conflict(f"thread {new_thread!r} already exists") from None
    return {"thread_id": new_thread, "thread": after(None, seq, commit), "seq": seq}


async def revoke(svc: Services, who: Principal, thread_id: str, q: RevokeQuery) -> dict[str, Any]:
    """Remove standing permission rules (`agentlog.runtime.permission`) of tool `q.tool` from the
    thread state: one `StatePatched`, under OCC. Refused (409 `run_active`) while a run is
    active on the thread: the run owns the thread's writes until it stops."""
    view, version = await current(svc, who, thread_id, None)
    if view.active_run_id is not None:
        raise ApiError(409, "run_active", f"run {view.active_run_id!r} is active on thread {thread_id!r}: "
                                          "revoke once it has stopped (or cancel it)")
    stored = view.state.get(STANDING_KEY)
    rules = dict(stored) if isinstance(stored, dict) else {}
    removed: list[dict[str, Any]] = []
    kept: dict[str, Any] = dict(rules)
    for verdict in ("allow", "deny"):
        if q.verdict not in (None, verdict):
            continue
        entries = rules.get(verdict) or []
        gone = [r for r in entries if isinstance(r, dict) and r.get("tool") == q.tool]
        removed += [{"verdict": verdict, **r} for r in gone]
        kept[verdict] = [r for r in entries if r not in gone]
    if not removed:
        raise ApiError(404, "rule_not_found", f"no standing rule for tool {q.tool!r} on thread {thread_id!r}")
    op = {"op": "add", "path": "/" + STANDING_KEY, "value": kept}
    try:
        seq, _commit = await append(svc, thread_id, [StatePatched(ops=[op], source="api")], version)
    except VersionConflict:
        raise ApiError(409, "version_conflict", f"thread {thread_id!r} changed: try again") from None
    return {"thread_id": thread_id, "removed": removed, "permissions": kept, "seq": seq}


async def _check_parent(svc: Services, who: Principal, parent_id: str) -> None:
    """The parent must exist (in the log) and, for a tenant, be one of its own threads."""
    version = await svc.store.thread_version(parent_id)
    if version == 0:
        raise ApiError(404, "thread_not_found", f"parent thread {parent_id!r} not found")
    if who.tenant is not None:
        await wait_min_seq(svc, version)
        await visible_thread(svc, who, parent_id)


async def current(svc: Services, who: Principal, thread_id: str, expected: int | None) -> tuple[ThreadView, int]:
    """The thread as of its latest commit, for a write: the log gives the version, the view
    (caught up to that version, bounded) gives tenancy and the tombstone."""
    version = await svc.store.thread_version(thread_id)
    if version == 0:
        raise ApiError(404, "thread_not_found", f"thread {thread_id!r} not found")
    await wait_min_seq(svc, version)
    view = await visible_thread(svc, who, thread_id)
    if expected is not None and expected != version:
        raise VersionConflict(thread_id, expected, version)
    return view, version


__all__ = ["after", "append", "conflict", "create", "current", "fork", "revoke"]
