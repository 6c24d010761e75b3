"""What every transport's handlers share: the services the app was built with, its settings, and the reads every
route needs (read-your-writes waits, tenant-checked thread lookups).

Two sources, on purpose: lists and single views come from the KV projections (cheap, maybe a
little behind: `min_seq` closes that gap); anything that must be exact at a position (messages,
time travel, event streams, and the checks before a write) folds the log itself.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import msgspec

from agentlog.eventlog.errors import StoreUnavailable
from agentlog.eventlog.events import StoredCommit
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.store import first_commit
from agentlog.gateway.operations.auth import Principal
from agentlog.gateway.operations.dispatch import Dispatcher
from agentlog.gateway.operations.errors import ApiError, not_found
from agentlog.gateway.operations.metrics import Metrics
from agentlog.projections.errors import ProjectionTimeout
from agentlog.projections.fold import Folder
from agentlog.projections.store import ViewStore
from agentlog.projections.views import RunView, ThreadView


class Runner(Protocol):
    """The part of `ProjectionRunner` the gateway uses."""

    applied_seq: int

    async def wait_for(self, seq: int, timeout: float = 5.0) -> None: ...

    async def lag(self) -> int: ...


CORS_ENV = "AGENTLOG_CORS_ORIGINS"
SSE_HEARTBEAT_ENV = "AGENTLOG_SSE_HEARTBEAT"
DEFAULT_SSE_HEARTBEAT = 15.0


def cors_origins_from_env() -> tuple[str, ...]:
    return parse_origins(os.environ.get(CORS_ENV, ""))


def sse_heartbeat_from_env() -> float:
    """`AGENTLOG_SSE_HEARTBEAT` (seconds), else 15: a proxy or load balancer that closes a
    connection idle for less than that needs more frequent heartbeats on its quiet streams."""
    raw = os.environ.get(SSE_HEARTBEAT_ENV, "").strip()
    if not raw:
        return DEFAULT_SSE_HEARTBEAT
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0 < value < math.inf:
        raise ValueError(f"{SSE_HEARTBEAT_ENV} must be a positive number of seconds, not {raw!r}")
    return value


MAX_CONCURRENT_ENV = "AGENTLOG_MAX_CONCURRENT_REQUESTS"


def max_concurrent_from_env() -> int | None:
    """`AGENTLOG_MAX_CONCURRENT_REQUESTS` (a positive integer), else None (no limit)."""
    raw = os.environ.get(MAX_CONCURRENT_ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{MAX_CONCURRENT_ENV} must be a positive integer, not {raw!r}")
    return value


def parse_origins(spec: str) -> tuple[str, ...]:
    """`"https://a.example, http://localhost:3000"` -> a tuple; blanks are ignored."""
    return tuple(o.strip().rstrip("/") for o in spec.split(",") if o.strip())


@dataclass(frozen=True)
class Settings:
    #: Upper bound of a read-your-writes wait (`min_seq`) and of pre-write projection catch-up.
    read_wait: float = 5.0
    #: Seconds between SSE heartbeat comments while the log is quiet (default
    #: `AGENTLOG_SSE_HEARTBEAT`, else 15; see `sse_heartbeat_from_env`).
    sse_heartbeat: float = field(default_factory=sse_heartbeat_from_env)
    #: Frames buffered per SSE client.
    sse_queue: int = 1000
    #: Seconds an SSE client may take no frame while its buffer is full before it is dropped
    #: as stalled (it resumes with `Last-Event-ID`).
    sse_stall: float = 10.0
    #: Largest accepted request body (bytes); bigger -> 413.
    max_body: int = 1024 * 1024
    #: How long a view read without `min_seq` waits for the views to reach the thread's last
    #: commit before it answers from a fold of the log instead (`current_run`, `current_thread`).
    fresh_wait: float = 1.0
    #: Browser origins allowed by CORS (`*`: any); default `AGENTLOG_CORS_ORIGINS` (see `cors`).
    cors_origins: tuple[str, ...] = field(default_factory=cors_origins_from_env)
    #: HTTP requests served at once; more are answered 503 `overloaded` (`agentlog.gateway.http.limits`).
    #: Default `AGENTLOG_MAX_CONCURRENT_REQUESTS`, else no limit.
    max_concurrent_requests: int | None = field(default_factory=lambda: max_concurrent_from_env())


@dataclass
class Services:
    store: JetStreamEventStore
    views: ViewStore
    runner: Runner
    metrics: Metrics
    settings: Settings = field(default_factory=Settings)
    #: How runs are started, decided and cancelled (the adapters' routes, verified replay); None
    #: on a read-only gateway.
    dispatcher: Dispatcher | None = None


def _connected(svc: Services) -> None:
    """Fail fast (503) while NATS is down: a read would otherwise sit out nats-py's own timeout."""
    if not svc.store.nc.is_connected:
        raise StoreUnavailable("not connected to NATS (reconnecting); retry shortly")


async def wait_min_seq(svc: Services, min_seq: int | None) -> None:
    """Before a view read: fail fast with 503 if NATS is down (a KV read would otherwise sit out
    nats-py's own timeout), then read-your-writes: bounded wait until the views include
    `min_seq` (503 on timeout).

    A `min_seq` beyond the log's head names a commit that does not exist (every seq a write
    returns is already in the log), so waiting for it could only end in a 503 that blames the
    server: it is a 400 `min_seq_ahead` instead. The head is read only when the views are behind
    `min_seq`, so the usual read-your-writes path costs nothing extra."""
    _connected(svc)
    if min_seq:
        if svc.runner.applied_seq < min_seq:
            head = await svc.store.last_seq()
            if min_seq > head:
                raise ApiError(400, "min_seq_ahead", f"min_seq {min_seq} is beyond the log's last seq {head}",
                               detail={"min_seq": min_seq, "last_seq": head})
        await svc.runner.wait_for(min_seq, timeout=svc.settings.read_wait)


def _cache_of(svc: Services) -> Any:
    """The in-process projection runner, when it writes the very views this app reads: its cache
    (`ProjectionRunner.cached_run`) holds what it last wrote there, never older than the store,
    so a hit saves a KV round trip without changing what a read (with or without `min_seq`)
    may answer. None otherwise (a runner of another store, after a rebuild swapped it, or a
    test double): read the store."""
    runner = svc.runner
    if getattr(runner, "store", None) is svc.views and hasattr(runner, "cached_run"):
        return runner
    return None


async def get_run_view(svc: Services, run_id: str) -> RunView | None:
    """The run's view: the in-process runner's cache, else the store."""
    cache = _cache_of(svc)
    if cache is not None:
        view = cache.cached_run(run_id)
        if view is not None:
            return view
    return await svc.views.get_run(run_id)


async def get_thread_view(svc: Services, thread_id: str) -> ThreadView | None:
    """The thread's view: the in-process runner's cache, else the store."""
    cache = _cache_of(svc)
    if cache is not None:
        view = cache.cached_thread(thread_id)
        if view is not None:
            return view
    return await svc.views.get_thread(thread_id)


async def visible_thread(svc: Services, who: Principal, thread_id: str) -> ThreadView:
    """The thread's view, or 404 if unknown, deleted or outside the caller's tenant."""
    view = await get_thread_view(svc, thread_id)
    if view is None or view.deleted or not who.can_see(view.resource_id):
        raise not_found("thread", thread_id)
    return await with_whole_state(svc, view)


async def visible_run(svc: Services, who: Principal, run_id: str) -> RunView:
    view = await get_run_view(svc, run_id)
    if view is None:
        raise not_found("run", run_id)
    if who.tenant is not None:
        thread = await get_thread_view(svc, view.thread_id)
        if thread is None or not who.can_see(thread.resource_id):
            raise not_found("run", run_id)
    return await with_whole_state(svc, view)


V = TypeVar("V", ThreadView, RunView)


async def with_whole_state(svc: Services, view: V) -> V:
    """`view`, with its state folded from the log when the views could not hold it
    (`state_elided`): as of the view's own last commit, so the answer is of one moment."""
    if not view.state_elided:
        return view
    folder = _fold([c async for c in svc.store.read_thread(view.thread_id) if c.seq <= view.last_seq])
    whole = folder.run(view.run_id) if isinstance(view, RunView) else folder.thread(view.thread_id)
    if whole is None:
        return view
    return msgspec.structs.replace(view, state=whole.state, state_elided=False)


async def _caught_up(svc: Services, seq: int) -> bool:
    """Whether the views include `seq`, waiting for them at most `settings.fresh_wait`."""
    if svc.runner.applied_seq >= seq:
        return True
    try:
        await svc.runner.wait_for(seq, timeout=svc.settings.fresh_wait)
    except ProjectionTimeout:
        return False
    return True


async def current_run(svc: Services, who: Principal, run_id: str) -> RunView:
    """The run as of (at least) its thread's last commit: what a read without `min_seq` answers.

    Why the thread's head and not a client token: whoever just wrote (a 202 start, a decision,
    the end of an AG-UI / AI SDK / A2A stream) has a write at or below that head, and the
    official protocol clients never send a position back. So every read shows the caller's own
    write by default, from any gateway, at the cost of one direct get of the head. The views
    answer when they have reached it (or reach it within `fresh_wait`); else, and for a run the
    views do not know yet, the run is folded from the log (exact, and it works while the
    projections lag, e.g. right after a restart)."""
    _connected(svc)
    applied = svc.runner.applied_seq  # before the view read: the view holds at least this
    view = await get_run_view(svc, run_id)
    if view is not None:
        thread_id = view.thread_id
    else:
        first = await first_commit(svc.store.read_run(run_id))
        if first is None:
            raise not_found("run", run_id)
        thread_id = first.commit.thread_id
    head = await svc.store.thread_version(thread_id)
    if view is not None and applied >= head:
        return await with_whole_state(svc, await _tenant_checked(svc, who, view))
    if await _caught_up(svc, head):
        return await visible_run(svc, who, run_id)
    commits = [c async for c in svc.store.read_thread(thread_id)]
    folder = _fold(commits)
    run, thread = folder.run(run_id), folder.thread(thread_id)
    if run is None or (who.tenant is not None and (thread is None or not who.can_see(thread.resource_id))):
        raise not_found("run", run_id)
    return run


async def current_thread(svc: Services, who: Principal, thread_id: str) -> ThreadView:
    """The thread as of (at least) its last commit: what a read without `min_seq` answers (see
    `current_run`); 404 if unknown, deleted or outside the caller's tenant."""
    _connected(svc)
    applied = svc.runner.applied_seq
    head = await svc.store.thread_version(thread_id)
    if head == 0:
        raise not_found("thread", thread_id)
    if applied >= head or await _caught_up(svc, head):
        return await visible_thread(svc, who, thread_id)
    return (await thread_from_log(svc, who, thread_id))[1]


async def _tenant_checked(svc: Services, who: Principal, view: RunView) -> RunView:
    if who.tenant is not None:
        thread = await get_thread_view(svc, view.thread_id)
        if thread is None or not who.can_see(thread.resource_id):
            raise not_found("run", view.run_id)
    return view


def _fold(commits: list[StoredCommit]) -> Folder:
    folder = Folder()
    for stored in commits:
        folder.apply_commit(stored.seq, stored.commit)
    return folder


async def thread_from_log(svc: Services, who: Principal, thread_id: str) -> tuple[list[StoredCommit], ThreadView]:
    """Every commit of the thread and its fold: exact, not subject to projection lag.
    404 if it has no commits, is deleted or is outside the caller's tenant."""
    commits = [c async for c in svc.store.read_thread(thread_id)]
    folder = Folder()
    for stored in commits:
        folder.apply_commit(stored.seq, stored.commit)
    view = folder.thread(thread_id)
    if view is None or view.deleted or not who.can_see(view.resource_id):
        raise not_found("thread", thread_id)
    return commits, view


__all__ = ["CORS_ENV", "Runner", "Services", "Settings", "cors_origins_from_env", "current_run", "current_thread",
           "get_run_view", "get_thread_view",
           "parse_origins", "thread_from_log", "visible_run", "visible_thread", "wait_min_seq"]
