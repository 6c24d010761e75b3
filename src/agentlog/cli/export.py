"""`agentlog export` (chosen runs into a portable recording file), `agentlog import` (a recording
into a log), and the body of `agentlog replay --verify --all` / `--file` (every run of a log or a
recording verified against the app, one summary table). Registered on `agentlog.cli.core.app`;
`agentlog.cli.replay` calls `verify_all_command`.

The work is `agentlog.runtime.replay.recorded` (imported in the command bodies, so the CLI starts
fast); the file format is `agentlog.eventlog.recording`. A recording is verified from memory: its
commits are the thread as the source log had it, with the source's sequences, so a divergence is
named by the event id (`seq:index`) the source log gives it, and no server is needed.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.table import Table
from rich.text import Text

import agentlog
from agentlog.cli import logging as agentlog_logging
from agentlog.cli.core import (
    AppMismatch,
    CredsOpt,
    DataDirOpt,
    NatsOpt,
    TimeoutOpt,
    TokenOpt,
    app,
    connection_options,
    guard,
    print_json,
    read_to_end,
    run_main,
    run_on_store,
    stdout_console,
    warn,
)
from agentlog.eventlog.embedded.server import DEFAULT_DATA_DIR
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.recording import Recording, read_recording, recording_lines
from agentlog.gateway.operations.app_loader import load_app, resolve_app
from agentlog.projections.timeline import UnknownRun

if TYPE_CHECKING:
    from agentlog.runtime.replay.recorded import RunSelection, VerifyAllReport

#: The app `--verify` uses without `--app`: the built-in demo app (what `serve` runs without one).
DEMO_APP = "agentlog.cli.demo:app"

# -- which runs (export, replay --verify --all) ---------------------------------------------------

RunOpt = Annotated[list[str] | None, typer.Option(
    "--run", metavar="RUN_ID", help="This run (repeatable; with the filters below, those of them that match).")]
AgentOpt = Annotated[str | None, typer.Option("--agent", metavar="AGENT_ID", help="Only runs of this agent.")]
StatusOpt = Annotated[Literal["running", "waiting", "done", "failed"] | None, typer.Option(
    "--status", help="Only runs in this status (failed: ended in an error or a block).")]
SinceOpt = Annotated[str | None, typer.Option(
    "--since", metavar="WHEN", help="Only runs created at or after WHEN: ISO 8601 (UTC unless it names a zone) "
                                    "or unix milliseconds.")]
UntilOpt = Annotated[str | None, typer.Option(
    "--until", metavar="WHEN", help="Only runs created before WHEN (as --since).")]


def parse_when(text: str, option: str) -> int:
    """Unix ms from `--since`/`--until`: digits are ms; else ISO 8601, UTC when no zone is given."""
    value = text.strip()
    if value.isdigit():
        return int(value)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not an ISO 8601 date/time or unix milliseconds",
                                 param_hint=option) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def run_selection(runs: list[str] | None, agent: str | None, status: str | None, since: str | None,
                  until: str | None) -> RunSelection:
    from agentlog.runtime.replay.recorded import RunSelection

    since_ms = parse_when(since, "--since") if since is not None else None
    until_ms = parse_when(until, "--until") if until is not None else None
    return guard(lambda: RunSelection(tuple(runs or ()), agent, status, since_ms, until_ms))  # type: ignore[arg-type]


@contextmanager
def known_runs() -> Iterator[None]:
    """A `--run` the log does not have: the CLI's usage error for an unknown run (exit 2)."""
    from agentlog.runtime.replay.recorded import UnknownSelectedRun

    try:
        yield
    except UnknownSelectedRun as exc:
        raise UnknownRun(str(exc.run_id)) from None


# -- export ---------------------------------------------------------------------------------------


def _write(path: str, recording: Recording) -> None:
    """The file at `path` (`-`: stdout), written whole or not at all (a temporary file renamed)."""
    lines = recording_lines(recording.header, recording.commits)
    if path == "-":
        out = sys.stdout.buffer
        for line in lines:
            out.write(line)
        out.flush()
        return
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent if str(target.parent) else ".")
    try:
        with os.fdopen(fd, "wb") as f:
            for line in lines:
                f.write(line)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@app.command("export")
def export_cmd(
    output: Annotated[str, typer.Option(
        "--output", "-o", metavar="FILE", help="Where to write the recording ('-': stdout).")] = "-",
    run: RunOpt = None, agent: AgentOpt = None, status: StatusOpt = None, since: SinceOpt = None,
    until: UntilOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print what was written as one JSON object.")] = False,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """Write chosen runs (all, or by --run, --agent, --status, --since/--until) with everything
    `replay --verify` needs into one portable JSON Lines file: a header (format and schema
    version, the recording app's digest, the filters), then the commits of their threads up to
    each run's end, with their sub-agent and parent runs and large payloads inline."""
    if as_json and output == "-":
        raise typer.BadParameter("--json prints a summary; write the recording to a file with --output",
                                 param_hint="--json")
    selection = run_selection(run, agent, status, since, until)

    async def body(store: JetStreamEventStore) -> None:
        from agentlog.runtime.replay.recorded import export_runs

        with known_runs():
            recording = await export_runs(store, selection, log=read_to_end(store),
                                          agentlog_version=agentlog.__version__)
        _write(output, recording)
        header = recording.header
        summary = {"output": output, "runs": header.runs, "runs_in_file": len(recording.run_ids()),
                   "threads": len(recording.threads()), "commits": header.commits, "app_digest": header.app_digest}
        if not header.runs:
            warn("no run matched: the recording holds no run")
        if as_json:
            print_json(summary)
        elif header.runs:
            where = "stdout" if output == "-" else output
            sys.stderr.write(f"exported {len(header.runs)} run(s) ({summary['runs_in_file']} with their threads' "
                             f"other runs, sub-agents and parents), {summary['threads']} thread(s), "
                             f"{header.commits} commits to {where}\n")

    run_on_store(connection_options(nats, creds, token, data_dir, timeout), body)


# -- import ---------------------------------------------------------------------------------------


def load_recording(path: Path) -> Recording:
    """Read and check a whole recording file (`-`: stdin) before anything is done with it."""
    data = sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
    return read_recording(data)


@app.command("import")
def import_cmd(
    file: Annotated[Path, typer.Argument(help="A recording written by `agentlog export` ('-': stdin).",
                                         allow_dash=True)],
    as_json: Annotated[bool, typer.Option("--json", help="What was imported as one JSON object.")] = False,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """Load a recording into the log, keeping its thread, run and commit ids. Idempotent: commits
    the log already has are skipped. A thread the log holds with other content, a file of a newer
    agentlog, or a corrupt line: refused with nothing written."""
    if str(file) != "-" and not file.is_file():
        raise typer.BadParameter(f"no such file: {file}", param_hint="FILE")
    recording = guard(lambda: load_recording(file))

    async def body(store: JetStreamEventStore) -> None:
        from agentlog.runtime.replay.recorded import import_runs

        report = await import_runs(store, recording)
        if as_json:
            print_json(report.to_json())
            return
        stdout_console().print(Text(
            f"imported {len(report.runs)} run(s) on {report.threads} thread(s): {report.written} commit(s) "
            f"written, {report.present} already in the log", style="bold green"))

    run_on_store(connection_options(nats, creds, token, data_dir, timeout), body, role="gateway")


# -- replay --verify --all / --file ---------------------------------------------------------------


def tools_answered_from_log(user_app: Any, spec: str, reexecute: list[str], keep_from_log: list[str]) -> list[str]:
    """The tools replay answers from the log: all but those `--reexecute-tools` names ('*': all),
    plus those `--tools-from-log` keeps. `AppMismatch` for a name the app has no tool of."""
    names = {t.name for t in user_app.tools}
    for option, given in (("--reexecute-tools", reexecute), ("--tools-from-log", keep_from_log)):
        unknown = [n for n in given if n != "*" and n not in names]
        if unknown:
            raise AppMismatch(f"{option} names tools {spec} does not have: {', '.join(unknown)}")
    rerun = names if "*" in reexecute else set(reexecute)
    return sorted(names - (rerun - set(keep_from_log)))


@contextmanager
def replay_logs_quiet() -> Iterator[None]:
    """The replayed loop logs as if it ran (e.g. a diverging tool shows up as `run.model_error`
    warnings): noise beside the report, so only `--log-level debug` shows them."""
    if agentlog_logging.current_level() <= logging.DEBUG:
        yield
        return
    with agentlog_logging.quiet():
        yield


def render_verify_all(report: VerifyAllReport, spec: str) -> None:
    """The summary table, the app line, then each diverged run's first differing event."""
    out = stdout_console()
    table = Table(title=f"replay --verify: {report.summary()} ({report.source})", title_justify="left")
    for column in ("run", "agent", "result", "commits", "first difference / reason"):
        table.add_column(column, overflow="fold")
    styles = {"verified": "green", "diverged": "bold red", "skipped": "yellow"}
    for v in report.runs:
        r = v.report
        commits = f"{r.commits_verified}/{r.commits_recorded}" if r is not None else "-"
        d = v.divergence
        if d is not None:
            what = (f"{d.position}: expected {type(d.expected).__name__ if d.expected else 'nothing'}, "
                    f"got {type(d.actual).__name__ if d.actual else 'nothing'}" + (f" ({d.detail})" if d.detail else ""))
        else:
            what = v.reason or "-"
        table.add_row(v.run_id, v.agent_id or "-", Text(v.outcome, style=styles[v.outcome]), commits, what)
    out.print(table)
    changed = report.app_changed
    recorded = ", ".join(sorted({a.digest for a in report.recorded_apps if a.digest})) or "not recorded"
    state = {None: "", True: " (changed since recording)", False: " (unchanged)"}[changed]
    out.print(Text(f"app: {spec} digest {report.app_digest}{state}; recorded with: {recorded}"))
    for v in report.of("diverged"):
        out.print(Text(v.explain(), style="red"))


def verify_all_command(
    *, file: Path | None, selection: RunSelection, app_spec: str | None, reexecute: list[str],
    keep_from_log: list[str], as_json: bool, strict: bool,
    nats: str | None, creds: Path | None, token: str | None, data_dir: Path, timeout: float,
) -> None:
    """`replay --verify --all` (the live log, `selection` over it) or `--file` (a recording,
    `selection` over its runs): verify each run; exit 1 if any diverged (or, with `strict`, was
    skipped)."""
    spec = app_spec or DEMO_APP
    if app_spec is None:
        warn(f"no --app: verifying with {spec}, the built-in demo app (`agentlog serve` without --app); "
             f"pass --app MODULE:ATTR for your own")
    source = guard(lambda: load_app(spec))

    async def verify(store: Any, recording: Recording | None) -> int:
        from agentlog.runtime.replay.recorded import recording_runs, selected_runs, verify_all

        user_app = resolve_app(source, store, spec)
        from_log = tools_answered_from_log(user_app, spec, reexecute, keep_from_log)
        target: Any
        with known_runs():
            if recording is not None:
                chosen, target, name = recording_runs(recording, selection), recording, str(file)
            else:
                chosen, target, name = await selected_runs(store, selection, read_to_end(store)), store, "log"
        with replay_logs_quiet():
            report = await verify_all(target, user_app, list(chosen.runs), tools_from_log=from_log, source_name=name)
        if as_json:
            print_json(report.to_json())
        else:
            render_verify_all(report, spec)
        failed = not report.ok or (strict and report.counts["skipped"] > 0)
        return 1 if failed else 0

    if file is not None:
        recording = guard(lambda: load_recording(file))

        async def from_file() -> int:
            from agentlog.eventlog.memory import MemoryEventStore

            # verified from the recording in memory; the store is only what a factory app is given
            return await verify(MemoryEventStore(), recording)

        run_main(from_file)
        return

    async def live(store: JetStreamEventStore) -> None:
        code = await verify(store, None)
        if code:
            raise typer.Exit(code)

    run_on_store(connection_options(nats, creds, token, data_dir, timeout), live)
