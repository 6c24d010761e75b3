"""The `agentlog` command line (DESIGN 5.3): read-only tools over the log, the servers, and
(gateway/cli_runs.py, gateway/cli_dev.py) `run ...` to drive runs of a running server and `dev`.

Every command takes the same connection options (`--nats URL`, `--creds`, `--token`,
`--data-dir`, `--timeout`); without a URL the embedded nats-server runs for the duration of the
command. Every answer is computed from the log itself (the only source of truth), so the CLI
shows the same thing whichever process wrote the log and whether or not a projection runner is
running. `replay RUN --verify --app module:attr` runs user code: it re-executes the run with the
app's agents against the log (runtime.replay; tools answered from the log unless
`--reexecute-tools`) and exits 1 at the first difference. Errors are one red line `error [<code>]: <message>` on stderr, exit 1, or 2 for usage
errors (bad ids, unknown run); never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import logging
import os
import signal
import sys
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from contextlib import aclosing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import msgspec
import nats.errors
import structlog
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from eventlog.auth import Role
from eventlog.errors import AgentlogError, InvalidId, StoreUnavailable
from eventlog.events import AnyEvent, Position, StoredCommit
from eventlog.ids import validate_id, validate_run_id
from eventlog.jetstream import JetStreamEventStore
from eventlog.replicas import REPLICAS_ENV
from eventlog.server import DEFAULT_DATA_DIR
from eventlog.store import as_generator
from projections import RunView, ThreadView, fold_commits
from projections.kv import KVViewStore
from projections.rebuild import rebuild

from . import logging as agentlog_logging
from .app_loader import AppLoadError, load_app, resolve_app
from .connection import NATS_URL_ENV, ConnectionOptions, open_store
from .timeline import (
    InvalidEventId,
    ReplayReport,
    UnknownRun,
    build_replay,
    event_data,
    event_summary,
    learn_call_names,
    parse_event_id,
)

log = structlog.get_logger("agentlog.cli")

#: Errors caused by what the user typed: exit code 2, like click's own usage errors.
USAGE_ERRORS: tuple[type[AgentlogError], ...] = (InvalidId, InvalidEventId, UnknownRun, AppLoadError)

#: `-h` is `--help` on every command (click hands help option names down to subcommands).
HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}

app = typer.Typer(
    name="agentlog",
    help="agentlog: an event-sourced agent runtime on NATS JetStream.",
    no_args_is_help=True,
    context_settings=HELP_OPTIONS,
    add_completion=False,
    pretty_exceptions_enable=False,
)
events_app = typer.Typer(help="Read the event log.", no_args_is_help=True)
app.add_typer(events_app, name="events")
projections_app = typer.Typer(help="Maintain the KV views (projections) of the log.", no_args_is_help=True)
app.add_typer(projections_app, name="projections")


# -- shared options -------------------------------------------------------------------------------

# --nats/--creds/--token are accepted before the command (`agentlog --nats URL runs`, where the
# environment variables are read too) and after it (`agentlog runs --nats URL`, which wins).
_NATS_HELP = "NATS server URL(s), comma separated. Without it an embedded nats-server runs for this command."
_CREDS_HELP = "NATS .creds file."
_TOKEN_HELP = "NATS token."
NatsOpt = Annotated[str | None, typer.Option("--nats", metavar="URL", help=_NATS_HELP + f" [also: ${NATS_URL_ENV}]")]
CredsOpt = Annotated[Path | None, typer.Option(
    "--creds", exists=True, dir_okay=False, help=_CREDS_HELP + " [also: $AGENTLOG_NATS_CREDS]")]
TokenOpt = Annotated[str | None, typer.Option("--token", help=_TOKEN_HELP + " [also: $AGENTLOG_NATS_TOKEN]")]
DataDirOpt = Annotated[Path, typer.Option(
    "--data-dir", envvar="AGENTLOG_DATA_DIR", help="Data directory of the embedded nats-server.")]
TimeoutOpt = Annotated[float, typer.Option(
    "--timeout", min=0.1, help="Seconds to wait for NATS to connect / answer before failing.")]
ReplicasOpt = Annotated[int | None, typer.Option(
    "--replicas", envvar=REPLICAS_ENV, min=1, max=5,
    help="Replicas of the streams and KV buckets (a cluster: 3). New ones get it (default 1); existing "
         "ones are raised to it, never lowered.")]


@dataclass(frozen=True)
class GlobalOptions:
    """The connection options given before the command (or by environment variable)."""

    nats: str | None = None
    creds: Path | None = None
    token: str | None = None


#: Set by the root callback on every invocation (before any command body runs).
_global = GlobalOptions()


def _options(nats: str | None, creds: Path | None, token: str | None, data_dir: Path, timeout: float,
             replicas: int | None = None) -> ConnectionOptions:
    """The command's own options, else the global ones (which include the environment)."""
    given = _global
    return ConnectionOptions(nats_url=nats or given.nats, creds=creds or given.creds, token=token or given.token,
                             data_dir=data_dir, timeout=timeout, replicas=replicas)


# -- logging, output, errors ----------------------------------------------------------------------


def configure_logging(level: str) -> None:
    """Logging for every command: `gateway.logging.configure` (stderr; stdout stays clean for
    data and --json)."""
    try:
        agentlog_logging.configure(level)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--log-level") from None


def _out() -> Console:
    """stdout console. soft_wrap: timeline lines are never cut or re-wrapped. When piped (no
    terminal, no $COLUMNS) tables get 200 columns instead of rich's 80, so ids stay unfolded."""
    piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(soft_wrap=True, highlight=False, width=200 if piped else None)


def _fail(exc: AgentlogError) -> NoReturn:
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    err.print(Text(f"error [{exc.code}]: {exc}", style="bold red"))
    usage = isinstance(exc, (*USAGE_ERRORS, AppMismatch)) or getattr(exc, "usage_error", False)
    raise typer.Exit(2 if usage else 1)


def _print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def _run(options: ConnectionOptions, body: Callable[[JetStreamEventStore], Awaitable[None]],
         role: Role = "readonly") -> None:
    """Run `body` against the store (logged in as `role` on the embedded server); map errors to one
    line and an exit code; Ctrl-C exits 0."""

    async def main() -> None:
        async with open_store(options, role) as store:
            await body(store)

    _run_main(main)


async def _stoppable(main: Callable[[], Awaitable[int | None]]) -> int | None:
    """`main()`, cancelled by SIGTERM like Ctrl-C: its cleanup (leaving the embedded nats-server,
    which stops it when this was its last user) runs instead of the process dying on the spot and
    leaving the server behind. Commands that wait for signals themselves (`serve`) take SIGTERM
    over while they do."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None

    def terminate() -> None:  # once: a second SIGTERM must not cut the cleanup short
        loop.add_signal_handler(signal.SIGTERM, lambda: None)
        task.cancel()

    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGTERM, terminate)
    try:
        return await main()
    except asyncio.CancelledError:
        log.debug("terminated")
        raise KeyboardInterrupt from None
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGTERM)


def _run_main(main: Callable[[], Awaitable[int | None]]) -> None:
    """asyncio.run(main()) with the CLI's error mapping; an int result is the exit code."""
    try:
        code = asyncio.run(_stoppable(main))
        if code:
            raise typer.Exit(code)
    except KeyboardInterrupt:
        log.debug("interrupted")
        raise typer.Exit(0) from None
    except BrokenPipeError:  # `agentlog events tail | head`: the reader left, nothing to report
        raise typer.Exit(0) from None
    except AgentlogError as exc:
        _fail(exc)
    except (nats.errors.Error, TimeoutError) as exc:  # raw nats-py calls (KV) outside the store
        _fail(StoreUnavailable(f"NATS did not answer: {type(exc).__name__}: {exc}"))
    except typer.Exit:
        raise
    except Exception as exc:  # a bug: one line for the user, the traceback at debug level
        log.debug("unexpected error", exc_info=True)
        err = Console(stderr=True, highlight=False, soft_wrap=True)
        err.print(Text(f"error [internal]: {type(exc).__name__}: {exc} (--log-level debug shows the traceback)",
                       style="bold red"))
        raise typer.Exit(1) from None


def _guard(check: Callable[[], Any]) -> Any:
    """Validate an argument before any server is started or contacted."""
    try:
        return check()
    except AgentlogError as exc:
        _fail(exc)


async def read_to_end(
    store: JetStreamEventStore, thread_id: str | None = None, after: int = 0,
) -> AsyncGenerator[StoredCommit, None]:
    """Commits with seq > `after` up to the end of the log as it is now (all threads, or one)."""
    if thread_id is not None:
        async for stored in store.read_thread(thread_id, after):
            yield stored
        return
    last = await store.last_seq()
    if last <= after:
        return
    async with aclosing(as_generator(store.follow(None, after))) as commits:
        async for stored in commits:
            yield stored
            if stored.seq >= last:
                return


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S") if ms else "-"


def _version(value: bool) -> None:
    if value:
        try:
            version = importlib.metadata.version("agentlog")
        except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
            version = "unknown"
        sys.stdout.write(f"agentlog {version}\n")
        raise typer.Exit(0)


@app.callback()
def _main(
    log_level: Annotated[str, typer.Option("--log-level", envvar="AGENTLOG_LOG_LEVEL",
                                           help="debug, info, warning, error.")] = "warning",
    nats: Annotated[str | None, typer.Option("--nats", envvar=NATS_URL_ENV, metavar="URL", help=_NATS_HELP)] = None,
    creds: Annotated[Path | None, typer.Option("--creds", envvar="AGENTLOG_NATS_CREDS", exists=True,
                                                  dir_okay=False, help=_CREDS_HELP)] = None,
    token: Annotated[str | None, typer.Option("--token", envvar="AGENTLOG_NATS_TOKEN", help=_TOKEN_HELP)] = None,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Global options go before the command; a command's own --nats/--creds/--token win."""
    global _global
    configure_logging(log_level)
    _global = GlobalOptions(nats, creds, token)


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
    after = start.seq - 1 if start else 0

    async def body(store: JetStreamEventStore) -> None:
        out = _out()
        names: dict[str, str] = {}
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
            async with aclosing(read_to_end(store, where, after)) as commits:
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
    async with aclosing(read_to_end(store, thread_id)) as commits:
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
        for column in ("thread", "resource", "parent", "runs", "active run", "messages", "version", "updated"):
            table.add_column(column, overflow="fold")
        for t in rows:
            table.add_row(t.thread_id, t.resource_id or "-", t.parent_thread_id or "-", str(len(t.run_ids)),
                          t.active_run_id or "-", str(t.message_count), str(t.version), _time(t.updated))
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
        for column in ("run", "thread", "agent", "status", "termination", "steps", "parent run", "tokens", "updated"):
            table.add_column(column, overflow="fold")
        for r in rows:
            table.add_row(r.run_id, r.thread_id, r.agent_id or "-", r.status,
                          r.termination.type if r.termination else "-", str(r.steps), r.parent_run_id or "-",
                          str(r.usage.total_tokens), _time(r.updated))
        _out().print(table)

    _run(_options(nats, creds, token, data_dir, timeout), body)


# -- replay ---------------------------------------------------------------------------------------


def _render_replay(report: ReplayReport) -> None:
    out = _out()
    run, now = report.run, report.run_as_of
    head = Text()
    head.append(f"run {run.run_id}", style="bold")
    head.append(f"  thread {run.thread_id}  agent {run.agent_id or '-'}  origin {run.origin or '-'}")
    out.print(head)
    out.print(Text(f"lineage: parent run {run.parent_run_id or '-'}  parent thread {run.parent_thread_id or '-'}"
                   f"  continued by {', '.join(report.continued_by) or '-'}"))
    as_of = f"as of {report.to}" if report.to else "end of log"
    out.print(Text(f"status: {now.status if now else 'not started'} ({as_of})"))
    for group in report.groups:
        out.print(Text(f"── {group.label} ──", style="bold magenta"))
        for item in group.events:
            line = Text("  ")
            line.append(f"{item.position!s:>8}", style="cyan")
            line.append(f"  {type(item.event).__name__:<20}", style="bold")
            line.append(f" {item.summary}")
            out.print(line)
        if group.state_diff:
            out.print(Text("  state diff:", style="yellow"))
            for op in group.state_diff:
                value = f" {json.dumps(op['value'], ensure_ascii=False)}" if "value" in op else ""
                source = f" from {op['from']}" if "from" in op else ""
                out.print(Text(f"    {op['op']} {op['path']}{source}{value}"))
    if now is not None and now.termination is not None:
        t = now.termination
        detail = "".join(f" {k}={v}" for k, v in (("code", t.code), ("detail", t.detail)) if v)
        out.print(Text(f"termination: {t.type}{detail}  usage: in={now.usage.input_tokens} "
                       f"out={now.usage.output_tokens}", style="bold green"))
    else:
        out.print(Text(f"termination: none ({as_of})", style="bold"))
    out.print(Text(f"state ({as_of}):", style="bold"))
    out.print(Text(json.dumps(report.state, ensure_ascii=False, indent=2, sort_keys=True)))


def _render_verified(report: Any) -> None:
    """One green line: what was verified and how the run ended."""
    t = report.termination
    end = f"termination {t.type}" + (f" ({t.code})" if t and t.code else "") if t else f"status {report.status}"
    tools = f"{report.tools_executed} tool run(s) re-executed, {report.tools_from_log} answered from the log"
    _out().print(Text(
        f"verified run {report.run_id}: {report.commits_verified} commits, {report.events_verified} events "
        f"match the log ({report.external_commits} external); {end}; {report.inferences} inference(s), {tools}",
        style="bold green"))


def _render_divergence(report: Any) -> None:
    """The diverging event: where (`seq:index`), the recorded event, the replayed one, why."""
    from runtime.replay import describe

    d = report.divergence
    assert d is not None
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    err.print(Text(f"replay of run {report.run_id} diverged at {d.position} after {report.commits_verified} of "
                   f"{report.commits_recorded} verified commits", style="bold red"))
    for label, event in (("expected (log)", d.expected), ("actual (replay)", d.actual)):
        line = Text(f"  {label:<16} ")
        if event is None:
            line.append("nothing", style="dim")
        else:
            line.append(type(event).__name__, style="bold")
            line.append(" " + describe(event, limit=2000))
        err.print(line)
    if d.detail:
        err.print(Text(f"  detail           {d.detail}"))


@app.command("replay")
def replay_cmd(
    run_id: Annotated[str, typer.Argument(help="The run to show.")],
    to: Annotated[str | None, typer.Option(
        "--to", metavar="EVENT_ID", help="Stop the timeline at this event (seq:index) and show the state as of it.")] = None,
    verify: Annotated[bool, typer.Option(
        "--verify", help="Re-execute the run with --app's agents and tools and check every commit against the "
                         "log; exit 1 at the first difference.")] = False,
    app_spec: Annotated[str | None, typer.Option(
        "--app", metavar="MODULE:ATTR", help="The application for --verify: an App, a Runtime, or factory(store).")] = None,
    reexecute: Annotated[list[str] | None, typer.Option(
        "--reexecute-tools", metavar="NAME",
        help="With --verify: run this tool for real instead of answering it from its recorded results "
             "(the default for every tool, so no side effect repeats); repeatable, '*' for every tool.")] = None,
    keep_from_log: Annotated[list[str] | None, typer.Option(
        "--tools-from-log", metavar="NAME",
        help="With --verify: answer this tool from the log even under --reexecute-tools '*' (repeatable).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One machine-readable JSON document.")] = False,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """Debug one run from the log alone: lineage, timeline by step, state diffs, termination.
    With --verify: prove the app still makes exactly the recorded run (exit 1 if not)."""
    _guard(lambda: validate_run_id(run_id))
    position: Position | None = _guard(lambda: parse_event_id(to)) if to else None
    if verify:
        if to is not None:
            raise typer.BadParameter("--verify checks the whole run; drop --to", param_hint="--to")
        if app_spec is None:
            raise typer.BadParameter("--verify needs the app that made the run", param_hint="--app")
        source = _guard(lambda: load_app(app_spec))
        _run(_options(nats, creds, token, data_dir, timeout),
             lambda store: _verify(store, run_id, app_spec, source, list(reexecute or ()),
                                   list(keep_from_log or ()), as_json))
        return
    if app_spec is not None or reexecute or keep_from_log:
        raise typer.BadParameter("only with --verify", param_hint="--app/--reexecute-tools/--tools-from-log")

    async def body(store: JetStreamEventStore) -> None:
        thread_commits = [c async for c in store.read_thread(await _thread_of_run(store, run_id))]
        report = build_replay(run_id, thread_commits, position)
        if as_json:
            _print_json(report.to_json())
        else:
            _render_replay(report)

    _run(_options(nats, creds, token, data_dir, timeout), body)


# -- trace (gateway.trace) ------------------------------------------------------------------------


@app.command("trace")
def trace_cmd(
    run_id: Annotated[str, typer.Argument(help="The run whose spans to derive from the log.")],
    as_json: Annotated[bool, typer.Option("--json", help="The spans as one JSON document.")] = False,
    otlp: Annotated[str | None, typer.Option(
        "--otlp", metavar="URL", envvar="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        help="Export the spans over OTLP/HTTP to this traces endpoint.")] = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """A run's OpenTelemetry spans (run > step > chat / execute_tool), derived from the log."""
    from .trace import trace

    _guard(lambda: validate_run_id(run_id))

    async def body(store: JetStreamEventStore) -> None:
        await trace(store, run_id, as_json=as_json, otlp=otlp, console=_out(), emit_json=_print_json)

    _run(_options(nats, creds, token, data_dir, timeout), body)


class AppMismatch(AgentlogError):
    """The app given to --verify cannot replay this run (no such agent, no such tool)."""

    code = "app_mismatch"


async def _verify(store: JetStreamEventStore, run_id: str, spec: str, source: Any,
                  reexecute: list[str], keep_from_log: list[str], as_json: bool) -> None:
    """Verified replay (runtime.replay) of one run; exit 1 with the diverging event if it differs.

    `runtime` is imported here, not at the top, so the CLI starts fast; its loggers log to
    stderr whatever the import order (`gateway.logging`)."""
    from runtime.agent import UnknownAgent
    from runtime.replay import UnknownReplayRun
    from runtime.subagents import verify_tree

    user_app = resolve_app(source, store, spec)
    names = {t.name for t in user_app.tools}
    for option, given in (("--reexecute-tools", reexecute), ("--tools-from-log", keep_from_log)):
        unknown = [n for n in given if n != "*" and n not in names]
        if unknown:
            raise AppMismatch(f"{option} names tools {spec} does not have: {', '.join(unknown)}")
    rerun = names if "*" in reexecute else set(reexecute)
    from_log = sorted(names - (rerun - set(keep_from_log)))
    try:
        with _replay_logs_quiet():
            # the run and its sub-agent runs (runtime.subagents), parents first
            reports = await verify_tree(store, run_id, user_app, tools_from_log=from_log, raise_on_divergence=False)
    except UnknownReplayRun:
        raise UnknownRun(run_id) from None
    except UnknownAgent as exc:  # the log's agent is not in the app
        raise AppMismatch(f"{spec} cannot replay run {run_id!r}: {exc}") from None
    report, children = reports[0], reports[1:]
    if as_json:
        doc = report.to_json()
        if children:
            doc["children"] = [r.to_json() for r in children]
            doc["ok"] = all(r.ok for r in reports)
        _print_json(doc)
    else:
        for r in reports:
            _render_verified(r) if r.ok else _render_divergence(r)
    if not all(r.ok for r in reports):
        raise typer.Exit(1)


@contextmanager
def _replay_logs_quiet() -> Iterator[None]:
    """The replayed loop logs as if it ran (e.g. a diverging tool shows up as `run.model_error`
    warnings): noise beside the report, so only `--log-level debug` shows them."""
    if agentlog_logging.current_level() <= logging.DEBUG:
        yield
        return
    with agentlog_logging.quiet():
        yield


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


# -- serve / gateway / worker / demo ------------------------------------------------------------

HostOpt = Annotated[str, typer.Option("--host", envvar="AGENTLOG_HOST", help="HTTP listen address.")]
PortOpt = Annotated[int, typer.Option("--port", envvar="AGENTLOG_PORT", min=0, max=65535,
                                      help="HTTP port (0: any free port).")]
AppOpt = Annotated[str | None, typer.Option(
    "--app", "--config", metavar="MODULE:ATTR|FILE.yaml",
    help="The application: an App, a Runtime, or factory(store), or a YAML/JSON agent configuration file. "
         "Default: the built-in demo agent.")]
TokensOpt = Annotated[str | None, typer.Option(
    "--tokens", envvar="AGENTLOG_TOKENS", help="API bearer tokens 'tok1,tok2:tenant' (empty: no auth).")]
ConcurrencyOpt = Annotated[int, typer.Option("--concurrency", min=1, help="Commands a worker runs at once.")]
ServeConcurrencyOpt = Annotated[int | None, typer.Option(
    "--concurrency", min=1, help="Runs this process drives at once (default 64).")]
AckWaitOpt = Annotated[float | None, typer.Option(
    "--ack-wait", envvar="AGENTLOG_WORKER_ACK_WAIT", min=0.1,
    help="Command lease in seconds: a dead worker's runs are redelivered after it (default 30).")]
ShutdownOpt = Annotated[float | None, typer.Option(
    "--shutdown-timeout", envvar="AGENTLOG_SHUTDOWN_TIMEOUT", min=0.0,
    help="On SIGTERM, seconds to let runs finish before handing them back to the queue (default 10).")]


def _server_config(role: str, app_spec: str | None, host: str, port: int, tokens: str | None,
                   options: ConnectionOptions, concurrency: int | None = None, app_obj: Any = None,
                   ack_wait: float | None = None, shutdown_timeout: float | None = None,
                   max_deliver: int | None = None, metrics_port: int | None = None) -> Any:
    from .server import ServerConfig

    source = app_obj if app_obj is not None else (_guard(lambda: load_app(app_spec)) if app_spec else None)
    return ServerConfig(role=role, app=source, app_spec=app_spec, host=host, port=port, tokens=tokens,  # type: ignore[arg-type]
                        connection=options, worker_concurrency=concurrency, worker_ack_wait=ack_wait,
                        worker_shutdown_timeout=shutdown_timeout, worker_max_deliver=max_deliver,
                        worker_metrics_port=metrics_port)


def _banner(server: Any) -> None:
    """The addresses a user needs, once the server listens."""
    table = Table(title=f"agentlog {server.config.role}", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    if server.http_url:
        table.add_row("HTTP", server.http_url)
        table.add_row("API docs", f"{server.http_url}/openapi.json")
        table.add_row("health", f"{server.http_url}/health")
    table.add_row("NATS", server.nats_url + ("  (embedded, data in " + str(server.config.connection.data_dir)
                                             + ")" if server.embedded is not None else ""))
    table.add_row("parts", ", ".join(server.parts) or "-")
    _out().print(table)
    _out().print(Text("Ctrl-C stops it (in order: HTTP, worker, runs, views, NATS).", style="dim"))


def _serve_role(role: str, app_spec: str | None, host: str, port: int, tokens: str | None,
                options: ConnectionOptions, concurrency: int | None, ack_wait: float | None = None,
                shutdown_timeout: float | None = None, max_deliver: int | None = None,
                metrics_port: int | None = None) -> None:
    from .server import run_until_stopped

    config = _server_config(role, app_spec, host, port, tokens, options, concurrency,
                            ack_wait=ack_wait, shutdown_timeout=shutdown_timeout, max_deliver=max_deliver,
                            metrics_port=metrics_port)
    _run_main(lambda: run_until_stopped(config, on_ready=_banner))


@app.command("serve")
def serve_cmd(
    app_spec: AppOpt = None, host: HostOpt = "127.0.0.1", port: PortOpt = 8480, tokens: TokensOpt = None,
    concurrency: ServeConcurrencyOpt = None, ack_wait: AckWaitOpt = None, shutdown_timeout: ShutdownOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0, replicas: ReplicasOpt = None,
) -> None:
    """Gateway + worker in one process: HTTP API, NATS service, projections and the runtime.
    Every run goes through the durable command queue, so a stopped or killed process strands none."""
    _serve_role("serve", app_spec, host, port, tokens, _options(nats, creds, token, data_dir, timeout, replicas),
                concurrency, ack_wait, shutdown_timeout)


@app.command("gateway")
def gateway_cmd(
    app_spec: AppOpt = None, host: HostOpt = "127.0.0.1", port: PortOpt = 8480, tokens: TokensOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0, replicas: ReplicasOpt = None,
) -> None:
    """The gateway alone (HTTP + NATS service); commands are queued for `agentlog worker`s."""
    _serve_role("gateway", app_spec, host, port, tokens, _options(nats, creds, token, data_dir, timeout, replicas), 1)


@app.command("worker")
def worker_cmd(
    app_spec: AppOpt = None, concurrency: ConcurrencyOpt = 4,
    ack_wait: AckWaitOpt = None, shutdown_timeout: ShutdownOpt = None,
    max_deliver: Annotated[int, typer.Option(
        "--max-deliver", help="Failed deliveries of a command before it is dead-lettered to agentlog.dlq.<thread> "
                              "(0: never).")] = 25,  # runtime.worker.DEFAULT_MAX_DELIVER
    metrics_port: Annotated[int | None, typer.Option(
        "--metrics-port", min=0, max=65535,
        help="Serve Prometheus /metrics (tokens, tool calls, model latency) on 127.0.0.1:PORT.")] = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0, replicas: ReplicasOpt = None,
) -> None:
    """A worker alone: takes commands from the JetStream work queue (runtime.worker.Worker)."""
    _serve_role("worker", app_spec, "127.0.0.1", 0, None, _options(nats, creds, token, data_dir, timeout, replicas),
                concurrency, ack_wait, shutdown_timeout, max_deliver, metrics_port)


@app.command("demo")
def demo_cmd(
    auto_approve: Annotated[bool, typer.Option("--auto-approve", help="Approve the run over HTTP yourself "
                                                                      "(prints the curl first). For CI.")] = False,
    keep_running: Annotated[bool, typer.Option("--keep-running", help="Keep the server up after the run.")] = False,
    host: HostOpt = "127.0.0.1", port: PortOpt = 8480, tokens: TokensOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0, replicas: ReplicasOpt = None,
) -> None:
    """Start a server with a demo agent whose deploy waits for your approval (a curl), then show
    the finished run."""
    options = _options(nats, creds, token, data_dir, timeout, replicas)

    async def main() -> int:
        from .demo import app_with_mcp as demo_factory
        from .demo import run_demo
        from .http.auth import resolve_tokens
        from .server import serve

        config = _server_config("serve", None, host, port, tokens, options, app_obj=demo_factory)
        try:
            server_cm = serve(config)
            server = await server_cm.__aenter__()
        except OSError as exc:  # the port is taken (another serve?): any free port will do
            if port == 0:
                raise
            log.debug("port taken, using a free one", port=port, error=str(exc))
            server_cm = serve(config.__class__(**{**config.__dict__, "port": 0}))
            server = await server_cm.__aenter__()
        try:
            api_token = next(iter(resolve_tokens(tokens)), None)
            return await run_demo(server, auto_approve=auto_approve, keep_running=keep_running,
                                  console=_out(), token=api_token)
        finally:
            await server_cm.__aexit__(None, None, None)

    _run_main(main)


# `agentlog run ...` (gateway/cli_runs.py) and `agentlog dev` (gateway/cli_dev.py) register
# themselves on `app`; imported last, as they use the options and helpers above.
from . import cli_dev as _cli_dev  # noqa: E402,F401
from . import cli_runs as _cli_runs  # noqa: E402,F401


def main() -> None:
    """Console-script entry point (`agentlog`)."""
    app(prog_name="agentlog")


if __name__ == "__main__":
    main()
