"""The `agentlog` command line (DESIGN 5.3): read-only tools over the log, the servers, and
(src/agentlog/cli/runs.py, src/agentlog/cli/dev.py) `run ...` to drive runs of a running server and `dev`.

Every command takes the same connection options (`--nats URL`, `--creds`, `--token`,
`--data-dir`, `--timeout`); without a URL a command uses the data dir's embedded nats-server:
the one running there, else (for reads of the log, on a data dir that has one) started for the
duration of the command. No command but the servers creates a data dir; a command with nothing to
talk to says what it looked for (`agentlog.gateway.operations.connection.NoServer`). Every answer is computed from the log itself (the only source of truth), so the CLI
shows the same thing whichever process wrote the log and whether or not a projection runner is
running. `replay RUN --verify --app module:attr` runs user code: it re-executes the run with the
app's agents against the log (agentlog.runtime.replay.verify; tools answered from the log unless
`--reexecute-tools`) and exits 1 at the first difference. Errors are one red line `error [<code>]: <message>` on stderr, exit 1, or 2 for usage
errors (bad ids, unknown run); never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import nats.errors
import structlog
import typer
from rich.console import Console
from rich.text import Text

import agentlog
from agentlog.cli import logging as agentlog_logging
from agentlog.eventlog.errors import AgentlogError, InvalidId, StoreUnavailable
from agentlog.eventlog.events import StoredCommit
from agentlog.eventlog.jetstream.replicas import REPLICAS_ENV
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.roles import Role
from agentlog.eventlog.store import as_generator
from agentlog.gateway.operations.app_loader import AppLoadError
from agentlog.gateway.operations.connection import (
    NATS_URL_ENV,
    ConnectionOptions,
    EmbeddedUse,
    NoServer,
    open_store,
)
from agentlog.projections.timeline import (
    InvalidEventId,
    UnknownRun,
)

log = structlog.get_logger("agentlog.cli")

#: Errors caused by what the user typed: exit code 2, like click's own usage errors.
USAGE_ERRORS: tuple[type[AgentlogError], ...] = (InvalidId, InvalidEventId, UnknownRun, AppLoadError)

class AppMismatch(AgentlogError):
    """The app given to --verify cannot replay this run (no such agent, no such tool)."""

    code = "app_mismatch"


#: `-h` is `--help` on every command (click hands help option names down to subcommands).
HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}
#: Plain (click) help rather than typer's rich panels: those print a type placeholder on every
#: flag (`--json <bool>`) and arguments as `{run_id}`; click's shows flags bare and choices as
#: `--status [running|waiting|done|failed]`. Every command group is made with it (`group`).
PLAIN_HELP: dict[str, Any] = {"rich_markup_mode": None}


def group(help: str) -> typer.Typer:
    """A command group (`agentlog events ...`), with the CLI's help settings."""
    return typer.Typer(help=help, no_args_is_help=True, **PLAIN_HELP)


app = typer.Typer(
    name="agentlog",
    help="agentlog: an event-sourced agent runtime on NATS JetStream.",
    no_args_is_help=True,
    context_settings=HELP_OPTIONS,
    add_completion=False,
    pretty_exceptions_enable=False,
    **PLAIN_HELP,
)
events_app = group("Read the event log.")
app.add_typer(events_app, name="events")
thread_app = group("One thread from the log: its view, runs and state (show), or its messages; fork it.")
app.add_typer(thread_app, name="thread")
profile_app = group("One profile: the typed state shared by the threads of a resource_id (show).")
app.add_typer(profile_app, name="profile")
projections_app = group("Maintain the KV views (projections) of the log.")
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
#: Environment variable naming the HTTP API of the server the client commands talk to.
URL_ENV = "AGENTLOG_URL"
UrlOpt = Annotated[str | None, typer.Option(
    "--url", envvar=URL_ENV, metavar="HTTP_URL",
    help="Talk to the HTTP API at this URL instead of the NATS API (e.g. http://127.0.0.1:8480).")]
ApiTokenOpt = Annotated[str | None, typer.Option(
    "--api-token", envvar="AGENTLOG_API_TOKEN", help="The API's bearer token, when the server has --tokens.")]
ReplicasOpt = Annotated[int | None, typer.Option(
    "--replicas", envvar=REPLICAS_ENV, min=1, max=5,
    help="Replicas of the streams and KV buckets (a cluster: 3). New ones get it (default 1); existing "
         "ones are raised to it, never lowered.")]


# the servers (serve, gateway, worker, demo, dev)
HostOpt = Annotated[str, typer.Option("--host", envvar="AGENTLOG_HOST", help="HTTP listen address.")]
PortOpt = Annotated[int, typer.Option("--port", envvar="AGENTLOG_PORT", min=0, max=65535,
                                      help="HTTP port (0: any free port).")]
AppOpt = Annotated[str | None, typer.Option(
    "--app", "--config", metavar="MODULE:ATTR|FILE.yaml",
    help="The application: an App, a Runtime, or factory(store), or a YAML/JSON agent configuration file. "
         "Default: the built-in demo agent.")]
AppNameOpt = Annotated[str | None, typer.Option(
    "--app-name", envvar="AGENTLOG_APP_NAME", metavar="NAME",
    help="The app's name: workers take only the commands of their app, and a gateway queues new runs "
         "for its app's workers (letters, digits, '_', '-'). Several apps on one NATS need one each. "
         "Default: 'default'.")]
PublicUrlOpt = Annotated[str | None, typer.Option(
    "--public-url", envvar="AGENTLOG_PUBLIC_URL", metavar="URL",
    help="The gateway's address as clients reach it (http(s)://host:port/prefix), behind a proxy or "
         "bound to 0.0.0.0: the base of the URLs it publishes (A2A agent cards). Default: the listen address.")]
TokensOpt = Annotated[str | None, typer.Option(
    "--tokens", envvar="AGENTLOG_TOKENS", help="API bearer tokens 'tok1,tok2:tenant' (empty: no auth).")]
ConcurrencyOpt = Annotated[int | None, typer.Option(
    "--concurrency", min=1, help="Commands a worker runs at once (default 64).")]
ServeConcurrencyOpt = Annotated[int | None, typer.Option(
    "--concurrency", min=1, help="Runs this process drives at once (default 64).")]
AckWaitOpt = Annotated[float | None, typer.Option(
    "--ack-wait", envvar="AGENTLOG_WORKER_ACK_WAIT", min=0.1,
    help="Command lease in seconds: a dead worker's runs are redelivered after it (default 30).")]
ShutdownOpt = Annotated[float | None, typer.Option(
    "--shutdown-timeout", envvar="AGENTLOG_SHUTDOWN_TIMEOUT", min=0.0,
    help="On SIGTERM, seconds to let runs finish before handing them back to the queue (default 10).")]


@dataclass(frozen=True)
class GlobalOptions:
    """The connection options given before the command (or by environment variable)."""

    nats: str | None = None
    creds: Path | None = None
    token: str | None = None


#: Set by the root callback on every invocation (before any command body runs).
_global = GlobalOptions()


def connection_options(nats: str | None, creds: Path | None, token: str | None, data_dir: Path, timeout: float,
                       replicas: int | None = None, use: EmbeddedUse = "existing") -> ConnectionOptions:
    """The command's own options, else the global ones (which include the environment). `use`:
    what the command may do with the data dir's embedded server (`EmbeddedUse`): a read of the log
    starts it only on a data dir that has a log (the default), a server process passes `start`,
    a client of a running server's API `running`."""
    given = _global
    return ConnectionOptions(nats_url=nats or given.nats, creds=creds or given.creds, token=token or given.token,
                             data_dir=data_dir, timeout=timeout, replicas=replicas, embedded_use=use)


# -- logging, output, errors ----------------------------------------------------------------------


def configure_logging(level: str) -> None:
    """Logging for every command: `agentlog.cli.logging.configure` (stderr; stdout stays clean for
    data and --json)."""
    try:
        agentlog_logging.configure(level)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--log-level") from None


def stdout_console() -> Console:
    """stdout console. soft_wrap: timeline lines are never cut or re-wrapped. When piped (no
    terminal, no $COLUMNS) tables get 200 columns instead of rich's 80, so ids stay unfolded."""
    piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(soft_wrap=True, highlight=False, width=200 if piped else None)


def _fail(exc: AgentlogError) -> NoReturn:
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    err.print(Text(f"error [{exc.code}]: {exc}", style="bold red"))
    usage = isinstance(exc, (*USAGE_ERRORS, AppMismatch)) or getattr(exc, "usage_error", False)
    raise typer.Exit(2 if usage else 1)


def warn(message: str) -> None:
    """One yellow `warning: ...` line on stderr (stdout stays data, even with --json)."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    err.print(Text(f"warning: {message}", style="yellow"))


def print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def run_on_store(options: ConnectionOptions, body: Callable[[JetStreamEventStore], Awaitable[None]],
                 role: Role = "readonly", url_option: bool = False) -> None:
    """Run `body` against the store (logged in as `role` on the embedded server); map errors to one
    line and an exit code; Ctrl-C exits 0. `url_option`: the command also has `--url`, which a
    `NoServer` error then names among what was looked for."""

    async def main() -> None:
        try:
            async with open_store(options, role) as store:
                await body(store)
        except NoServer as exc:
            raise (exc.also(f"--url / ${URL_ENV}", "not set") if url_option else exc) from None

    run_main(main)


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


def run_main(main: Callable[[], Awaitable[int | None]]) -> None:
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


def guard(check: Callable[[], Any]) -> Any:
    """Validate an argument before any server is started or contacted."""
    try:
        return check()
    except AgentlogError as exc:
        _fail(exc)


async def read_to_end(store: JetStreamEventStore, thread_id: str | None = None, after: int = 0) -> AsyncIterator[StoredCommit]:
    """Commits with seq > `after` up to the end of the log as it is now (all threads, or one)."""
    if thread_id is not None:
        async for stored in store.read_thread(thread_id, after):
            yield stored
        return
    last = await store.last_seq()
    if last <= after:
        return
    async with aclosing(as_generator(store.follow(None, after))) as commits:
        # archived threads are in the stream as their markers: put their commits back
        filled = store.archive.fill_log(_until(commits, last)) if after == 0 else _until(commits, last)
        async with aclosing(as_generator(filled)) as stream:
            async for stored in stream:
                yield stored


async def _until(commits: AsyncIterator[StoredCommit], last: int) -> AsyncIterator[StoredCommit]:
    async for stored in commits:
        yield stored
        if stored.seq >= last:
            return


def format_time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S") if ms else "-"


#: How a run status is coloured in tables (a failed run stands out: red).
STATUS_STYLES = {"running": "blue", "waiting": "yellow", "done": "green", "failed": "bold red"}


def status_text(status: str) -> Text:
    """A run status for a table cell, coloured by `STATUS_STYLES`."""
    return Text(status, style=STATUS_STYLES.get(status, ""))


def usd(cost: float | None) -> str:
    """A recorded cost for a table cell: `$0.004213`, or `-` when nothing was priced."""
    return "-" if cost is None else f"${cost:.6f}"


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"agentlog {agentlog.__version__}\n")  # the installed distribution's (importlib.metadata)
        raise typer.Exit(0)


@app.callback()
def _main(
    log_level: Annotated[str, typer.Option("--log-level", envvar="AGENTLOG_LOG_LEVEL",
                                           metavar="<debug|info|warning|error>", help="What goes to stderr.")
                         ] = "warning",
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
