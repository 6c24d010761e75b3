"""`agentlog events tail`, `threads`, `runs` and `projections rebuild`: reads of the log and
maintenance of its views (DESIGN 5.3). Registered on `agentlog.cli.core.app`."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from contextlib import aclosing
from typing import Annotated, Any

import msgspec
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from agentlog.api.timeline import (
    UnknownRun,
    event_data,
    event_summary,
    learn_call_names,
    parse_event_id,
)
from agentlog.log.events import AnyEvent, Position, StoredCommit
from agentlog.log.ids import validate_id, validate_run_id
from agentlog.log.jetstream import JetStreamEventStore
from agentlog.log.server import DEFAULT_DATA_DIR
from agentlog.log.store import as_generator
from agentlog.views import RunView, ThreadView, fold_commits
from agentlog.views.kv import KVViewStore
from agentlog.views.rebuild import rebuild

from .core import (
    CredsOpt,
    DataDirOpt,
    NatsOpt,
    ReplicasOpt,
    TimeoutOpt,
    TokenOpt,
    _guard,
    _options,
    _out,
    _print_json,
    _run,
    _time,
    app,
    events_app,
    projections_app,
    read_to_end,
    usd,
)

# -- events tail ----------------------------------------------------------------------------------


def _event_line(stored: StoredCommit, position: Position, event: AnyEvent, names: dict[str, str]) -> Text:
    commit = stored.commit
    line = Text()
    line.append(f"{position!s:>8}", style="cyan")
    line.append(f"  {commit.thread_id}  {commit.run_id or '-'}  ")
    line.append(type(event).__name__, style="bold")
    line.append("  " + event_summary(event, names))
    return line


def _event_json(stored: StoredCommit, position: Position, event: AnyEvent) -> dict[str, Any]:
    commit = stored.commit
    return {"id": str(position), "thread_id": commit.thread_id, "run_id": commit.run_id,
            "commit_id": commit.commit_id, "ts": commit.ts, "type": type(event).__name__,
            "event": event_data(event)}


@events_app.command("tail")
def events_tail(
    thread: Annotated[str | None, typer.Option("--thread", help="Only this thread.")] = None,
    run: Annotated[str | None, typer.Option("--run", help="Only this run's events (its thread's commits "
                                                             "with this run id).")] = None,
    last: Annotated[int | None, typer.Option(
        "-n", "--lines", min=0, metavar="N", help="Only the last N events (then new ones, with --follow).")] = None,
    from_: Annotated[str | None, typer.Option(
        "--from", metavar="EVENT_ID|SEQ", help="Start at this event (inclusive); a bare SEQ means SEQ:0.")] = None,
    follow: Annotated[bool, typer.Option("--follow/--no-follow", "-f",
                                         help="Keep printing new events until Ctrl-C.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per event per line.")] = False,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """Print events (id `seq:index`, thread, run, type, key fields) from the log."""
    start: Position | None = _guard(lambda: parse_event_id(from_)) if from_ else None
    if thread is not None:
        _guard(lambda: validate_id(thread, "thread_id"))
    if run is not None:
        _guard(lambda: validate_run_id(run))

    async def body(store: JetStreamEventStore) -> None:
        nonlocal start
        out = _out()
        names: dict[str, str] = {}
        end = await store.last_seq()
        if start is not None and start.seq > end:
            # as time travel past the end answers as of the end: start at the end (nothing of the
            # log as it is; new events with --follow), and say so
            Console(stderr=True, highlight=False, soft_wrap=True).print(Text(
                f"warning: --from {start} is after the end of the log (last seq {end}): starting at the end",
                style="yellow"))
            start = Position(end + 1, 0)
        after = start.seq - 1 if start else 0
        where = thread
        if run is not None:  # a run lives on one thread: follow that thread, keep the run's commits
            where = await _thread_of_run(store, run)
            if thread is not None and where != thread:
                return
        tail: deque[tuple[StoredCommit, Position, AnyEvent]] = deque(maxlen=last if last is not None else None)

        def emit(stored: StoredCommit, position: Position, event: AnyEvent) -> None:
            if as_json:
                _print_json(_event_json(stored, position, event))
            else:
                out.print(_event_line(stored, position, event, names))

        def selected(stored: StoredCommit) -> Iterator[tuple[Position, AnyEvent]]:
            if run is not None and stored.commit.run_id != run:
                return
            for position, event in stored.positioned():
                if start is None or position >= start:
                    learn_call_names(event, names)
                    yield position, event

        seen = after
        if last is not None or not follow:  # the log as it is now (all of it, or its last N events)
            async with aclosing(as_generator(read_to_end(store, where, after))) as commits:
                async for stored in commits:
                    seen = stored.seq
                    for position, event in selected(stored):
                        if last is None:
                            emit(stored, position, event)
                        else:
                            tail.append((stored, position, event))
            for item in tail:
                emit(*item)
        if follow:
            async with aclosing(as_generator(store.follow(where, seen))) as commits:
                async for stored in commits:
                    for position, event in selected(stored):
                        emit(stored, position, event)

    _run(_options(nats, creds, token, data_dir, timeout), body)


async def _thread_of_run(store: JetStreamEventStore, run_id: str) -> str:
    """The thread a run is on (from its first commit); `UnknownRun` if the log has none."""
    async with aclosing(as_generator(store.read_run(run_id))) as commits:
        async for first in commits:
            return first.commit.thread_id
    raise UnknownRun(run_id)


# -- listings -------------------------------------------------------------------------------------


SourceOpt = Annotated[str, typer.Option(
    "--source", help="log: fold the log now (exact, reads every commit); "
                     "views: the KV projections (fast, as fresh as the projection runner).")]


async def _views(store: JetStreamEventStore, source: str, thread_id: str | None = None) -> tuple[list[ThreadView], list[RunView]]:
    """Threads and runs from the log by default: the log is the truth and the KV views are only as
    up to date as a projection runner, which a one-shot CLI cannot assume is running."""
    if source == "views":
        kv = await KVViewStore.open(store.nc)
        runs = [r for r in await kv.list_runs() if thread_id is None or r.thread_id == thread_id]
        return await kv.list_threads(), runs
    async with aclosing(as_generator(read_to_end(store, thread_id))) as commits:
        views = fold_commits([c async for c in commits])
    return list(views.threads.values()), list(views.runs.values())


def _check_source(source: str) -> None:
    if source not in ("log", "views"):
        raise typer.BadParameter("expected log or views", param_hint="--source")


@app.command("threads")
def threads_cmd(
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000)] = 50,
    offset: Annotated[int, typer.Option("--offset", min=0)] = 0,
    resource_id: Annotated[str | None, typer.Option("--resource-id")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="A JSON array of thread views.")] = False,
    source: SourceOpt = "log",
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """List threads, newest first (deleted threads are hidden)."""
    _check_source(source)

    async def body(store: JetStreamEventStore) -> None:
        threads, _ = await _views(store, source)
        rows = [t for t in threads if not t.deleted and (resource_id is None or t.resource_id == resource_id)]
        rows.sort(key=lambda t: (t.created, t.thread_id), reverse=True)
        rows = rows[offset : offset + limit]
        if as_json:
            _print_json(msgspec.to_builtins(rows))
            return
        table = Table(title=f"threads ({len(rows)})", title_justify="left")
        for column in ("thread", "resource", "parent", "runs", "active run", "messages", "cost", "version", "updated"):
            table.add_column(column, overflow="fold")
        for t in rows:
            table.add_row(t.thread_id, t.resource_id or "-", t.parent_thread_id or "-", str(len(t.run_ids)),
                          t.active_run_id or "-", str(t.message_count), usd(t.cost), str(t.version), _time(t.updated))
        _out().print(table)

    _run(_options(nats, creds, token, data_dir, timeout), body)


@app.command("runs")
def runs_cmd(
    thread: Annotated[str | None, typer.Option("--thread", help="Only runs of this thread.")] = None,
    status: Annotated[str | None, typer.Option("--status", help="running, waiting or done.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000)] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="A JSON array of run views.")] = False,
    source: SourceOpt = "log",
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """List runs, newest first."""
    _check_source(source)
    if status is not None and status not in ("running", "waiting", "done"):
        raise typer.BadParameter("expected running, waiting or done", param_hint="--status")
    if thread is not None:
        _guard(lambda: validate_id(thread, "thread_id"))

    async def body(store: JetStreamEventStore) -> None:
        _, runs = await _views(store, source, thread)
        rows = [r for r in runs if status is None or r.status == status]
        rows.sort(key=lambda r: (r.created, r.run_id), reverse=True)
        rows = rows[:limit]
        if as_json:
            _print_json(msgspec.to_builtins(rows))
            return
        table = Table(title=f"runs ({len(rows)})", title_justify="left")
        for column in ("run", "thread", "agent", "status", "termination", "steps", "parent run", "tokens", "cost",
                       "updated"):
            table.add_column(column, overflow="fold")
        for r in rows:
            table.add_row(r.run_id, r.thread_id, r.agent_id or "-", r.status,
                          r.termination.type if r.termination else "-", str(r.steps), r.parent_run_id or "-",
                          str(r.usage.total_tokens), usd(r.cost), _time(r.updated))
        _out().print(table)

    _run(_options(nats, creds, token, data_dir, timeout), body)


# -- projections rebuild --------------------------------------------------------------------------


@projections_app.command("rebuild")
def projections_rebuild(
    as_json: Annotated[bool, typer.Option("--json", help="Print the rebuild result as JSON.")] = False,
    nats_url: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0, replicas: ReplicasOpt = None,
) -> None:
    """Rebuild the thread and run views from seq 1 into a fresh KV generation, then swap it in.

    Readers keep the old views until the swap; a runner in another process follows it on its
    next batch. The progress bar (stderr) is driven by the rebuild's progress callback."""

    async def body(store: JetStreamEventStore) -> None:
        err = Console(stderr=True)
        columns = (TextColumn("rebuilding views"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("seq"), TimeElapsedColumn())
        with Progress(*columns, console=err) as bar:
            task = bar.add_task("rebuild", total=None)

            def progress(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            result = await rebuild(store.nc, progress=progress, replicas=replicas)
            bar.update(task, completed=result.last_seq, total=result.last_seq)
        if as_json:
            _print_json(msgspec.to_builtins(result))
        else:
            _out().print(Text(
                f"rebuilt generation {result.generation}: {result.commits} commits, {result.events} events "
                f"-> {result.threads} threads, {result.runs} runs up to seq {result.last_seq}"
                + (f" ({result.skipped} undecodable commits skipped)" if result.skipped else "")
                + f" in {result.seconds:.2f}s"))

    _run(_options(nats_url, creds, token, data_dir, timeout, replicas), body, role="gateway")
