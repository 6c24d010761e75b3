"""`agentlog events tail`, `threads`, `thread show|messages`, `profile show`, `runs` and `projections rebuild`:
reads of the log and maintenance of its views (DESIGN 5.3). Registered on `agentlog.cli.core.app`.

They read the log over NATS: the server's (`--nats`), or the data dir's, whose embedded server
they start for the command when none runs there; a data dir without a log is never created
(`NoServer` names what was looked for). With `--url` (or `$AGENTLOG_URL`) they read a server's
HTTP API instead, from anywhere: `threads` and `runs` its views (`GET /v1/threads`, `GET
/v1/runs`), `thread show` the thread's view, runs and state, `thread messages` and `events tail`
the log as the API serves it (`/messages`, the SSE event streams)."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing, asynccontextmanager
from typing import Annotated, Any, Literal

import msgspec
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from agentlog.cli.core import (
    ApiTokenOpt,
    CredsOpt,
    DataDirOpt,
    NatsOpt,
    ReplicasOpt,
    TimeoutOpt,
    TokenOpt,
    UrlOpt,
    app,
    connection_options,
    events_app,
    format_time,
    guard,
    print_json,
    profile_app,
    projections_app,
    read_to_end,
    run_main,
    run_on_store,
    status_text,
    stdout_console,
    thread_app,
    usd,
    warn,
)
from agentlog.client import AsyncClient, ClientError, StreamEvent
from agentlog.eventlog.embedded.server import DEFAULT_DATA_DIR
from agentlog.eventlog.errors import AgentlogError
from agentlog.eventlog.events import AnyEvent, Message, Position, StoredCommit
from agentlog.eventlog.ids import validate_id, validate_run_id
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.store import as_generator
from agentlog.gateway.operations.models import MAX_LIMIT
from agentlog.projections import RunView, ThreadView, fold_commits
from agentlog.projections.fold import fold_messages
from agentlog.projections.kv import KVViewStore
from agentlog.projections.profile import fold_profile
from agentlog.projections.rebuild import rebuild
from agentlog.projections.timeline import (
    UnknownRun,
    event_data,
    event_summary,
    learn_call_names,
    parse_event_id,
    within,
)
from agentlog.projections.timetravel import state_at
from agentlog.projections.views import calls_in_doubt

# -- events tail ----------------------------------------------------------------------------------


def _event_line(stored: StoredCommit, position: Position, event: AnyEvent, names: dict[str, str]) -> Text:
    commit = stored.commit
    line = Text()
    line.append(f"{position!s:>8}", style="cyan")
    line.append(f"  {commit.thread_id}  {commit.run_id or '-'}  ")
    line.append(type(event).__name__, style="bold")
    line.append("  " + event_summary(event, names))
    return line


def event_json(stored: StoredCommit, position: Position, event: AnyEvent) -> dict[str, Any]:
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
    url: UrlOpt = None, api_token: ApiTokenOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """Print events (id `seq:index`, thread, run, type, key fields) from the log. With --url: the
    event stream of the --thread or --run given (the API streams one thread or run)."""
    start: Position | None = guard(lambda: parse_event_id(from_)) if from_ else None
    if thread is not None:
        guard(lambda: validate_id(thread, "thread_id"))
    if run is not None:
        guard(lambda: validate_run_id(run))
    if url:
        if thread is None and run is None:
            raise typer.BadParameter("the HTTP API streams one thread or one run: give --thread or --run "
                                     "(or read the whole log over NATS: --nats / --data-dir)", param_hint="--url")
        run_main(lambda: _tail_over_http(url, api_token, timeout, thread, run, start, last, follow, as_json))
        return

    async def body(store: JetStreamEventStore) -> None:
        nonlocal start
        out = stdout_console()
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
            where = await thread_of_run(store, run)
            if thread is not None and where != thread:
                return
        tail: deque[tuple[StoredCommit, Position, AnyEvent]] = deque(maxlen=last if last is not None else None)

        def emit(stored: StoredCommit, position: Position, event: AnyEvent) -> None:
            if as_json:
                print_json(event_json(stored, position, event))
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

    run_on_store(connection_options(nats, creds, token, data_dir, timeout), body, url_option=True)


async def _tail_over_http(url: str, api_token: str | None, timeout: float, thread: str | None, run: str | None,
                          start: Position | None, last: int | None, follow: bool, as_json: bool) -> None:
    """`events tail --url`: the run's (or else the thread's) SSE stream from `start`, printed as
    the log's lines are; `--json` lines are the stream's events (`StreamEvent.to_json`). The
    events so far are one read of the stream; `--follow` then streams on after the last of them."""
    out = stdout_console()
    names: dict[str, str] = {}

    def emit(item: StreamEvent) -> None:
        if as_json:
            print_json(item.to_json())
            return
        event: AnyEvent = msgspec.convert(item.event, AnyEvent)
        learn_call_names(event, names)
        line = Text()
        line.append(f"{item.id:>8}", style="cyan")
        line.append(f"  {item.thread_id}  {item.run_id or '-'}  ")
        line.append(item.type, style="bold")
        line.append("  " + event_summary(event, names))
        out.print(line)

    async with http_api(url, api_token, timeout) as client:

        def stream(after: str | None, live: bool) -> Any:
            if run is not None:
                return client.runs.stream(run, after=after, follow=live)
            return client.threads.stream(thread or "", after=after, follow=live)

        after = _before_event(start)
        if last is not None or not follow:  # the log as it is now (all of it, or its last N events)
            tail: deque[StreamEvent] = deque(maxlen=last)
            async with aclosing(stream(after, False)) as events:
                async for item in events:
                    if thread is not None and item.thread_id != thread:
                        return  # --run on another thread than --thread: nothing
                    after = item.id
                    tail.append(item) if last is not None else emit(item)
            for item in tail:
                emit(item)
        if follow:
            async with aclosing(stream(after, True)) as events:
                async for item in events:
                    if thread is not None and item.thread_id != thread:
                        return
                    emit(item)


def _before_event(start: Position | None) -> str | None:
    """The exclusive `after` cursor of the API's streams for the inclusive `--from start`."""
    if start is None or start == Position(1, 0):
        return None
    if start.index:
        return str(Position(start.seq, start.index - 1))
    return str(Position(start.seq - 1, _LAST_INDEX))


#: An event index no commit reaches: `<seq>:<this>` is after every event of commit `seq`.
_LAST_INDEX = 2**31 - 1


@asynccontextmanager
async def http_api(url: str, api_token: str | None, timeout: float) -> AsyncIterator[AsyncClient]:
    """The HTTP API client of the `--url` reads; what it raises becomes `ApiRequestFailed`, which
    names the URL (and keeps the API's code and its usage/exit class)."""
    try:
        async with AsyncClient(url, token=api_token, timeout=max(timeout, 30.0)) as client:
            yield client
    except ClientError as exc:
        raise ApiRequestFailed(exc, url) from None


async def thread_of_run(store: JetStreamEventStore, run_id: str) -> str:
    """The thread a run is on (from its first commit); `UnknownRun` if the log has none."""
    async with aclosing(as_generator(store.read_run(run_id))) as commits:
        async for first in commits:
            return first.commit.thread_id
    raise UnknownRun(run_id)


# -- listings -------------------------------------------------------------------------------------


Source = Literal["log", "views"]
OrderOpt = Annotated[Literal["desc", "asc"], typer.Option(
    "--order", help="desc: newest first (the API's default too); asc: oldest first.")]
SourceOpt = Annotated[Source, typer.Option(
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


@app.command("threads")
def threads_cmd(
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000)] = 50,
    offset: Annotated[int, typer.Option("--offset", min=0)] = 0,
    resource_id: Annotated[str | None, typer.Option("--resource-id")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="A JSON array of thread views.")] = False,
    source: SourceOpt = "log", order: OrderOpt = "desc", url: UrlOpt = None, api_token: ApiTokenOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """List threads, newest first (deleted threads are hidden)."""

    def show(threads: list[ThreadView]) -> None:
        rows = [t for t in threads if not t.deleted and (resource_id is None or t.resource_id == resource_id)]
        rows.sort(key=lambda t: (t.created, t.thread_id), reverse=order == "desc")
        rows = rows[offset : offset + limit]
        if as_json:
            print_json(msgspec.to_builtins(rows))
            return
        table = Table(title=f"threads ({len(rows)})", title_justify="left")
        for column in ("thread", "resource", "parent", "runs", "active run", "messages", "cost", "version", "updated"):
            table.add_column(column, overflow="fold")
        for t in rows:
            table.add_row(t.thread_id, t.resource_id or "-", t.parent_thread_id or "-", str(len(t.run_ids)),
                          t.active_run_id or "-", str(t.message_count), usd(t.cost), str(t.version), format_time(t.updated))
        stdout_console().print(table)

    if url:
        run_main(lambda: _listed_over_http(url, api_token, timeout, "threads", ThreadView, show,
                                           resource_id=resource_id))
        return

    async def body(store: JetStreamEventStore) -> None:
        threads, _ = await _views(store, source)
        show(threads)

    run_on_store(connection_options(nats, creds, token, data_dir, timeout), body, url_option=True)


async def _listed_over_http(url: str, api_token: str | None, timeout: float, kind: Literal["runs", "threads"],
                            view: type[Any], show: Any, **filters: str | None) -> None:
    """Every page of `GET /v1/<kind>` (with `filters`) as views, handed to `show`: the listing of
    the server at `url`, from its views (the log's answer is over NATS, `--source log`)."""
    items: list[Any] = []
    async with http_api(url, api_token, timeout) as client:
        listing: Any = client.runs.list if kind == "runs" else client.threads.list
        while True:
            page = await listing(limit=MAX_LIMIT, offset=len(items), **filters)
            items += page[kind]
            if not page[kind] or len(items) >= int(page.get("total") or 0):
                break
    show([msgspec.convert(item, view) for item in items])


class ApiRequestFailed(AgentlogError):
    """`--url` given, and the server there did not answer the read: nothing answered, or the API
    refused (its own code then, e.g. `unauthorized` or `thread_not_found`, and exit 2 for a 4xx
    like the `run` commands)."""

    code = "api_request_failed"

    def __init__(self, error: ClientError, url: str) -> None:
        text = str(error)
        super().__init__(text if url in text else f"{text} (the API at {url})")
        self.code = error.code or self.code
        self.usage_error = error.status is not None and 400 <= error.status < 500


@app.command("runs")
def runs_cmd(
    thread: Annotated[str | None, typer.Option("--thread", help="Only runs of this thread.")] = None,
    status: Annotated[Literal["running", "waiting", "done", "failed"] | None, typer.Option(
        "--status", help="Only runs in this status (failed: ended in an error or a block).")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000)] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="A JSON array of run views.")] = False,
    source: SourceOpt = "log", order: OrderOpt = "desc", url: UrlOpt = None, api_token: ApiTokenOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """List runs, newest first."""
    if thread is not None:
        guard(lambda: validate_id(thread, "thread_id"))

    def show(runs: list[RunView]) -> None:
        rows = [r for r in runs if status is None or r.status == status]
        rows.sort(key=lambda r: (r.created, r.run_id), reverse=order == "desc")
        rows = rows[:limit]
        if as_json:
            print_json(msgspec.to_builtins(rows))
            return
        table = Table(title=f"runs ({len(rows)})", title_justify="left")
        for column in ("run", "thread", "agent", "status", "termination", "steps", "parent run", "tokens", "cost",
                       "updated"):
            table.add_column(column, overflow="fold")
        for r in rows:
            state = status_text(r.status)
            if doubted := calls_in_doubt(r):
                state.append(f" (in doubt: {', '.join(doubted)})", style="bold red")
            table.add_row(r.run_id, r.thread_id, r.agent_id or "-", state,
                          r.termination.type if r.termination else "-", str(r.steps), r.parent_run_id or "-",
                          str(r.usage.total_tokens), usd(r.cost), format_time(r.updated))
        stdout_console().print(table)

    if url:
        run_main(lambda: _listed_over_http(url, api_token, timeout, "runs", RunView, show, thread_id=thread,
                                           status=status))
        return

    async def body(store: JetStreamEventStore) -> None:
        _, runs = await _views(store, source, thread)
        show(runs)

    run_on_store(connection_options(nats, creds, token, data_dir, timeout), body, url_option=True)


# -- thread show / messages -----------------------------------------------------------------------


class UnknownThread(AgentlogError, LookupError):
    """The log has no commit of this thread (the API's code for it)."""

    code = "thread_not_found"
    usage_error = True

    def __init__(self, thread_id: str) -> None:
        super().__init__(f"thread {thread_id!r} not found in the log")


async def _thread_commits(store: JetStreamEventStore, thread_id: str) -> list[StoredCommit]:
    commits = [c async for c in store.read_thread(thread_id)]
    if not commits:
        raise UnknownThread(thread_id)
    return commits


ThreadArg = Annotated[str, typer.Argument(help="The thread id.")]


@thread_app.command("show")
def thread_show(
    thread_id: ThreadArg,
    at: Annotated[str | None, typer.Option(
        "--at", metavar="EVENT_ID", help="The state as of this event (seq:index) instead of now.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document: thread, runs, state.")] = False,
    url: UrlOpt = None, api_token: ApiTokenOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """One thread from the log: its view, its runs, and its state (now, or --at an event)."""
    guard(lambda: validate_id(thread_id, "thread_id"))
    position: Position | None = guard(lambda: parse_event_id(at)) if at else None

    if url:
        async def over_http() -> None:
            # one thread and one run at a time: the API answers those as fresh as the log
            async with http_api(url, api_token, timeout) as client:
                thread = msgspec.convert(await client.threads.get(thread_id), ThreadView)
                runs = [msgspec.convert(await client.runs.get(r), RunView) for r in thread.run_ids]
                state_doc = await client.threads.state(thread_id, at=str(position)) if position else None
            if state_doc is None:
                _print_thread(thread, runs, None, thread.state, None, as_json)
            else:
                _print_thread(thread, runs, Position.parse(state_doc["at"]), state_doc["state"],
                              state_doc.get("warning"), as_json)

        run_main(over_http)
        return

    async def body(store: JetStreamEventStore) -> None:
        commits = await _thread_commits(store, thread_id)
        views = fold_commits(commits)
        thread = views.threads.get(thread_id) or ThreadView(thread_id=thread_id)
        runs = [r for r in views.runs.values() if r.thread_id == thread_id]
        # past the thread's end: as of its last event, with the API's warning (`state?at=`)
        at, warning = within(commits, position) if position is not None else (None, None)
        state = state_at(commits, thread_id, at) if at is not None else thread.state
        _print_thread(thread, runs, at, state, warning, as_json)

    run_on_store(connection_options(nats, creds, token, data_dir, timeout), body, url_option=True)


def _print_thread(thread: ThreadView, runs: list[RunView], at: Position | None, state: Any,
                  warning: dict[str, str] | None, as_json: bool) -> None:
    """`thread show`'s output, whichever source read it: the view, its runs oldest first, and the
    state (as of `at`, with the API's warning when `at` was past the thread's end)."""
    runs = sorted(runs, key=lambda r: (r.created, r.run_id))
    if warning:
        warn(warning["message"])
    if as_json:
        doc = {"thread": msgspec.to_builtins(thread), "runs": msgspec.to_builtins(runs),
               "at": str(at) if at else None, "state": state}
        print_json({**doc, "warning": warning} if warning else doc)
        return
    out = stdout_console()
    head = Table(title=f"thread {thread.thread_id}", title_justify="left", show_header=False)
    head.add_column(style="bold")
    head.add_column(overflow="fold")
    for label, value in (
        ("resource", thread.resource_id or "-"), ("parent thread", thread.parent_thread_id or "-"),
        ("metadata", msgspec.json.encode(thread.metadata).decode() if thread.metadata else "-"),
        ("messages", str(thread.message_count)), ("version", str(thread.version)),
        ("active run", thread.active_run_id or "-"), ("deleted", "yes" if thread.deleted else "no"),
        ("created", format_time(thread.created)), ("updated", format_time(thread.updated)),
    ):
        head.add_row(label, value)
    out.print(head)
    if runs:
        table = Table(title=f"runs ({len(runs)})", title_justify="left")
        for column in ("run", "agent", "status", "termination", "parent run", "updated"):
            table.add_column(column, overflow="fold")
        for r in runs:
            table.add_row(r.run_id, r.agent_id or "-", status_text(r.status),
                          r.termination.type if r.termination else "-",
                          r.parent_run_id or "-", format_time(r.updated))
        out.print(table)
    out.print(Text(f"state ({f'as of {at}' if at else 'now'}):", style="bold"))
    out.print(Text(json.dumps(state, ensure_ascii=False, indent=2, sort_keys=True)))


@profile_app.command("show")
def profile_show(
    profile_id: Annotated[str, typer.Argument(help="The profile id: a thread's resource_id.")],
    at: Annotated[int | None, typer.Option(
        "--at", metavar="SEQ", min=1, help="The profile as of this sequence of its stream instead of now.")] = None,
    history: Annotated[bool, typer.Option("--history", help="Also list the profile's writes.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document, as GET /v1/profiles/{id}/state.")] = False,
    url: UrlOpt = None, api_token: ApiTokenOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """One profile from its stream: its typed state (now, or --at a sequence), and its writes."""
    if url:
        async def over_http() -> None:
            async with http_api(url, api_token, timeout) as client:
                _print_profile(await client.profiles.state(profile_id, at=at, history=history), history, as_json)

        run_main(over_http)
        return

    async def body(store: JetStreamEventStore) -> None:
        commits = [c async for c in store.read_profile(profile_id)]
        view = fold_profile(profile_id, commits, at=at)
        doc = {**msgspec.to_builtins(view), "at": at}
        if history:
            doc["history"] = [{"seq": c.seq, "ts": c.commit.ts, "thread_id": c.commit.thread_id,
                               "run_id": c.commit.run_id, "call_id": c.commit.call_id,
                               "writes": [msgspec.to_builtins(e) for e in c.commit.events]}
                              for c in commits if at is None or c.seq <= at]
        _print_profile(doc, history, as_json)

    run_on_store(connection_options(nats, creds, token, data_dir, timeout), body, url_option=True)


def _print_profile(doc: dict[str, Any], history: bool, as_json: bool) -> None:
    """`profile show`'s output from the profile's JSON document (`GET /v1/profiles/{id}/state`)."""
    if as_json:
        print_json(doc)
        return
    at = doc.get("at")
    out = stdout_console()
    out.print(Text(f"profile {doc['profile_id']} (version {doc.get('version', 0)}, {doc.get('writes', 0)} writes"
                   f"{f', as of {at}' if at else ''}):", style="bold"))
    out.print(Text(json.dumps(doc.get("state") or {}, ensure_ascii=False, indent=2, sort_keys=True)))
    writes = doc.get("history") or []
    if history and writes:
        table = Table(title=f"writes ({len(writes)})", title_justify="left")
        for column in ("seq", "time", "key", "ops", "thread", "run"):
            table.add_column(column, overflow="fold")
        for c in writes:
            for e in c["writes"]:
                table.add_row(str(c["seq"]), format_time(c["ts"]), e["key"],
                              json.dumps(e["ops"], separators=(",", ":"), ensure_ascii=False),
                              c.get("thread_id") or "-", c.get("run_id") or "-")
        out.print(table)


@thread_app.command("messages")
def thread_messages(
    thread_id: ThreadArg,
    run: Annotated[str | None, typer.Option("--run", help="Only the messages this run appended.")] = None,
    after: Annotated[str | None, typer.Option(
        "--after", metavar="EVENT_ID", help="Only messages after this event (seq:index).")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="A JSON array of {event_id, run_id, message}.")] = False,
    url: UrlOpt = None, api_token: ApiTokenOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """A thread's messages in log order, each with the event id that appended it."""
    guard(lambda: validate_id(thread_id, "thread_id"))
    if run is not None:
        guard(lambda: validate_run_id(run))
    start: Position | None = guard(lambda: parse_event_id(after)) if after else None

    if url:
        run_main(lambda: _messages_over_http(url, api_token, timeout, thread_id, run, start, as_json))
        return

    async def body(store: JetStreamEventStore) -> None:
        items: list[dict[str, Any]] = []
        for stored in await _thread_commits(store, thread_id):
            if run is not None and stored.commit.run_id != run:
                continue
            for position, event in stored.positioned():
                appended = fold_messages((), event)  # the fold decides what appends a message
                if appended and (start is None or position > start):
                    items.append({"event_id": str(position), "run_id": stored.commit.run_id,
                                  "message": appended[-1]})
        _print_messages(items, as_json)

    run_on_store(connection_options(nats, creds, token, data_dir, timeout), body, url_option=True)


async def _messages_over_http(url: str, api_token: str | None, timeout: float, thread_id: str, run: str | None,
                              start: Position | None, as_json: bool) -> None:
    """`thread messages --url`: every page of `GET /v1/threads/{id}/messages`."""
    items: list[dict[str, Any]] = []
    after = str(start) if start is not None else None
    async with http_api(url, api_token, timeout) as client:
        while True:
            page = await client.threads.messages(thread_id, after=after, limit=MAX_LIMIT, run_id=run)
            items += [{**item, "message": msgspec.convert(item["message"], Message)} for item in page["messages"]]
            after = page.get("next_after")
            if not page["messages"] or not after:
                break
    _print_messages(items, as_json)


def _print_messages(items: list[dict[str, Any]], as_json: bool) -> None:
    """`thread messages`' output: `{event_id, run_id, message}` per message, in log order."""
    if as_json:
        print_json(msgspec.to_builtins(items))
        return
    out = stdout_console()
    for item in items:
        message = item["message"]
        line = Text(f"{item['event_id']:>8}", style="cyan")
        line.append(f"  {message.role:<9}", style="bold")
        calls = ", ".join(c.name for c in message.tool_calls or ())
        text = message.content or (f"(calls {calls})" if calls else "(stored by reference)"
                                   if message.content_ref else "")
        line.append(" " + text)
        out.print(line)


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
            print_json(msgspec.to_builtins(result))
        else:
            stdout_console().print(Text(
                f"rebuilt generation {result.generation}: {result.commits} commits, {result.events} events "
                f"-> {result.threads} threads, {result.runs} runs up to seq {result.last_seq}"
                + (f" ({result.skipped} undecodable commits skipped)" if result.skipped else "")
                + f" in {result.seconds:.2f}s"))

    run_on_store(connection_options(nats_url, creds, token, data_dir, timeout, replicas), body, role="gateway")
