"""`agentlog replay` (with `--verify`: re-execute a run against its log) and `agentlog trace`
(a run's OpenTelemetry spans, derived from the log). Registered on `agentlog.cli.core.app`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from agentlog.cli.core import (
    ApiTokenOpt,
    AppMismatch,
    CredsOpt,
    DataDirOpt,
    NatsOpt,
    TimeoutOpt,
    TokenOpt,
    UrlOpt,
    app,
    connection_options,
    guard,
    print_json,
    run_main,
    run_on_store,
    stdout_console,
    warn,
)
from agentlog.cli.export import (
    AgentOpt,
    RunOpt,
    SinceOpt,
    StatusOpt,
    UntilOpt,
    replay_logs_quiet,
    run_selection,
    tools_answered_from_log,
    verify_all_command,
)
from agentlog.cli.reads import http_api, thread_of_run
from agentlog.eventlog.embedded.server import DEFAULT_DATA_DIR
from agentlog.eventlog.events import Position, StoredCommit
from agentlog.eventlog.ids import validate_run_id
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.gateway.operations.app_loader import load_app, resolve_app
from agentlog.projections.timeline import (
    UnknownRun,
    build_replay,
    last_position,
    learn_call_names,
    parse_event_id,
)

# -- replay ---------------------------------------------------------------------------------------


def _render_replay(doc: dict[str, Any]) -> None:
    """The replay report as text, from its JSON form (`ReplayReport.to_json`, which the API's
    `GET /v1/runs/{id}/timeline` also answers): one rendering whichever source read it."""
    out = stdout_console()
    lineage = doc["lineage"]
    head = Text()
    head.append(f"run {doc['run_id']}", style="bold")
    head.append(f"  thread {doc['thread_id']}  agent {lineage.get('agent_id') or '-'}  origin {lineage.get('origin') or '-'}")
    out.print(head)
    out.print(Text(f"lineage: parent run {lineage.get('parent_run_id') or '-'}  parent thread "
                   f"{lineage.get('parent_thread_id') or '-'}  continued by {', '.join(lineage.get('continued_by') or ()) or '-'}"))
    as_of = f"as of {doc['to']}" if doc.get("to") else "end of log"
    status = "not started" if doc["status"] == "not_started" else doc["status"]
    out.print(Text(f"status: {status} ({as_of})"))
    if doc.get("warning") is not None:
        out.print(Text(f"warning: {doc['warning']['message']}", style="yellow"))
    for group in doc["steps"]:
        out.print(Text(f"── {group['label']} ──", style="bold magenta"))
        for item in group["events"]:
            line = Text("  ")
            line.append(f"{item['id']:>8}", style="cyan")
            line.append(f"  {item['type']:<20}", style="bold")
            line.append(f" {item['summary']}")
            out.print(line)
        if group["state_diff"]:
            out.print(Text("  state diff:", style="yellow"))
            for op in group["state_diff"]:
                value = f" {json.dumps(op['value'], ensure_ascii=False)}" if "value" in op else ""
                source = f" from {op['from']}" if "from" in op else ""
                out.print(Text(f"    {op['op']} {op['path']}{source}{value}"))
    t, usage = doc.get("termination"), doc.get("usage") or {}
    if t is not None:
        detail = "".join(f" {k}={t[k]}" for k in ("code", "detail") if t.get(k))
        out.print(Text(f"termination: {t['type']}{detail}  usage: in={usage.get('input_tokens', 0)} "
                       f"out={usage.get('output_tokens', 0)}", style="bold green"))
    else:
        out.print(Text(f"termination: none ({as_of})", style="bold"))
    out.print(Text(f"state ({as_of}):", style="bold"))
    out.print(Text(json.dumps(doc["state"], ensure_ascii=False, indent=2, sort_keys=True)))


def _replay_doc(timeline: dict[str, Any]) -> dict[str, Any]:
    """The replay report of a `GET /v1/runs/{id}/timeline` answer: without what the inspector adds
    (`spans`, each event's own `state_diff`), so `replay --json` prints one document either way."""
    doc = {k: v for k, v in timeline.items() if k != "spans"}
    doc["steps"] = [{**group, "events": [{k: v for k, v in e.items() if k != "state_diff"} for e in group["events"]]}
                    for group in timeline["steps"]]
    return doc


def _render_verified(report: Any) -> None:
    """One green line: what was verified and how the run ended."""
    t = report.termination
    end = f"termination {t.type}" + (f" ({t.code})" if t and t.code else "") if t else f"status {report.status}"
    tools = f"{report.tools_executed} tool run(s) re-executed, {report.tools_from_log} answered from the log"
    stdout_console().print(Text(
        f"verified run {report.run_id}: {report.commits_verified} commits, {report.events_verified} events "
        f"match the log ({report.external_commits} external); {end}; {report.inferences} inference(s), {tools}",
        style="bold green"))


def _render_divergence(report: Any) -> None:
    """The diverging event: where (`seq:index`), the recorded event, the replayed one, why."""
    from agentlog.runtime.replay.verify import describe

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
    run_id: Annotated[str | None, typer.Argument(help="The run to show (none with --all / --file).")] = None,
    to: Annotated[str | None, typer.Option(
        "--to", metavar="EVENT_ID", help="Stop the timeline at this event (seq:index) and show the state as of it.")] = None,
    verify: Annotated[bool, typer.Option(
        "--verify", help="Re-execute the run with --app's agents and tools and check every commit against the "
                         "log; exit 1 at the first difference.")] = False,
    app_spec: Annotated[str | None, typer.Option(
        "--app", metavar="MODULE:ATTR", help="The application for --verify: an App, a Runtime, or factory(store). "
                                             "Default: the built-in demo app (the one `serve` and `demo` run); "
                                             "the app used is printed.")] = None,
    reexecute: Annotated[list[str] | None, typer.Option(
        "--reexecute-tools", metavar="NAME",
        help="With --verify: run this tool for real instead of answering it from its recorded results "
             "(the default for every tool, so no side effect repeats); repeatable, '*' for every tool.")] = None,
    keep_from_log: Annotated[list[str] | None, typer.Option(
        "--tools-from-log", metavar="NAME",
        help="With --verify: answer this tool from the log even under --reexecute-tools '*' (repeatable).")] = None,
    all_runs: Annotated[bool, typer.Option(
        "--all", help="With --verify: every run of the log (or those --run/--agent/--status/--since/--until "
                      "choose), one summary table; exit 1 if any diverged.")] = False,
    file: Annotated[Path | None, typer.Option(
        "--file", metavar="FILE", exists=True, dir_okay=False,
        help="With --verify: every run of this recording (`agentlog export`), verified from the file alone.")] = None,
    strict: Annotated[bool, typer.Option(
        "--strict", help="With --all / --file: a skipped run (e.g. its agent is gone from the app) fails too.")] = False,
    run: RunOpt = None, agent: AgentOpt = None, status: StatusOpt = None, since: SinceOpt = None,
    until: UntilOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One machine-readable JSON document.")] = False,
    url: UrlOpt = None, api_token: ApiTokenOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """Debug one run from the log alone: lineage, timeline by step, state diffs, termination.
    With --verify: prove the app still makes exactly the recorded run (exit 1 if not); with
    --verify --all or --file: every run of the log or of a recording, in one summary table."""
    if verify and url:
        raise typer.BadParameter("--verify runs your app in this process against the log: it reads the log "
                                 "over NATS (--nats, or the data dir), not --url", param_hint="--url")
    many = all_runs or file is not None
    filtered = bool(run or agent or status or since or until)
    if many or filtered or strict:
        if not verify or not many:
            raise typer.BadParameter("--all, --file, --strict and the run filters go with --verify --all or "
                                     "--verify --file", param_hint="--all/--file")
        if run_id is not None or to is not None:
            raise typer.BadParameter("--all / --file verify many runs: drop the RUN_ID and --to "
                                     "(choose runs with --run)", param_hint="RUN_ID")
        if all_runs and file is not None:
            raise typer.BadParameter("either the live log (--all) or a recording (--file)", param_hint="--all/--file")
        verify_all_command(
            file=file, selection=run_selection(run, agent, status, since, until), app_spec=app_spec,
            reexecute=list(reexecute or ()), keep_from_log=list(keep_from_log or ()), as_json=as_json,
            strict=strict, nats=nats, creds=creds, token=token, data_dir=data_dir, timeout=timeout)
        return
    if run_id is None:
        raise typer.BadParameter("missing RUN_ID (or --verify --all / --verify --file)", param_hint="RUN_ID")
    guard(lambda: validate_run_id(run_id))
    position: Position | None = guard(lambda: parse_event_id(to)) if to else None
    if verify:
        if to is not None:
            raise typer.BadParameter("--verify checks the whole run; drop --to", param_hint="--to")

        source = guard(lambda: load_app(app_spec)) if app_spec is not None else None

        async def verify_body(store: JetStreamEventStore) -> None:
            spec, loaded = app_spec, source
            if spec is None:
                spec = await default_app(store, run_id)
                warn(f"no --app: verifying with {spec}, the built-in demo app (`agentlog serve` without --app); "
                     f"pass --app MODULE:ATTR for your own")
                loaded = load_app(spec)
            await _verify(store, run_id, spec, loaded, list(reexecute or ()), list(keep_from_log or ()), as_json)

        run_on_store(connection_options(nats, creds, token, data_dir, timeout), verify_body)
        return
    if app_spec is not None or reexecute or keep_from_log:
        raise typer.BadParameter("only with --verify", param_hint="--app/--reexecute-tools/--tools-from-log")
    if url:
        run_main(lambda: _replay_over_http(url, api_token, timeout, run_id, position, as_json))
        return

    async def body(store: JetStreamEventStore) -> None:
        thread_commits = [c async for c in store.read_thread(await thread_of_run(store, run_id))]
        if position is not None:
            outside = outside_run(thread_commits, run_id, position)
            if outside:
                warn(outside)
        report = build_replay(run_id, thread_commits, position)
        _print_replay(report.to_json(), as_json)

    run_on_store(connection_options(nats, creds, token, data_dir, timeout), body, url_option=True)


def _print_replay(doc: dict[str, Any], as_json: bool) -> None:
    print_json(doc) if as_json else _render_replay(doc)


async def _replay_over_http(url: str, api_token: str | None, timeout: float, run_id: str,
                            position: Position | None, as_json: bool) -> None:
    """`replay RUN --url`: the run's timeline as the API folds it from the log."""
    async with http_api(url, api_token, timeout) as client:
        timeline = await client.request("GET", f"/v1/runs/{run_id}/timeline",
                                        params={"to": str(position)} if position else None)
    _print_replay(_replay_doc(timeline), as_json)


def outside_run(thread_commits: list[StoredCommit], run_id: str, position: Position) -> str | None:
    """A warning when `--to` is not within the run's events: before its first one the timeline
    is empty, after its last one it is the whole run, neither of which is what `--to` asks.
    (Past the end of the thread the report carries its own warning: `timeline.within`.)"""
    events = [p for c in thread_commits if c.commit.run_id == run_id for p, _e in c.positioned()]
    end = last_position(thread_commits)
    if not events or events[0] <= position <= events[-1] or (end is not None and position > end):
        return None
    where = "before its first" if position < events[0] else "after its last"
    return (f"--to {position} is outside run {run_id!r}: {where} event (the run's events are "
            f"{events[0]} .. {events[-1]})")


#: The demo's MCP tool: a run that called it was made by `agentlog demo` (`demo:app_with_mcp`).
_DEMO_MCP_TOOL = "mcp__notes__release_notes"


async def default_app(store: JetStreamEventStore, run_id: str) -> str:
    """The app to verify with when none is given: the built-in demo app `agentlog serve` runs
    without --app, or, for a run of `agentlog demo` (which called the demo's MCP tool), that one."""
    names: dict[str, str] = {}
    async for stored in store.read_run(run_id):
        for event in stored.commit.events:
            learn_call_names(event, names)
    return "agentlog.cli.demo:app_with_mcp" if _DEMO_MCP_TOOL in names.values() else "agentlog.cli.demo:app"


# -- trace (agentlog.cli.trace) ------------------------------------------------------------------------


@app.command("trace")
def trace_cmd(
    run_id: Annotated[str, typer.Argument(help="The run whose spans to derive from the log.")],
    as_json: Annotated[bool, typer.Option("--json", help="The spans as one JSON document.")] = False,
    otlp: Annotated[str | None, typer.Option(
        "--otlp", metavar="URL", envvar="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        help="Export the spans over OTLP/HTTP to this traces endpoint.")] = None,
    url: UrlOpt = None, api_token: ApiTokenOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """A run's OpenTelemetry spans (run > step > chat / execute_tool), derived from the log."""
    from agentlog.cli.trace import trace

    guard(lambda: validate_run_id(run_id))
    if url:
        if otlp:
            raise typer.BadParameter("--otlp exports spans made from the log's commits: read the log over NATS "
                                     "(--nats, or the data dir), not --url", param_hint="--otlp")
        run_main(lambda: _trace_over_http(url, api_token, timeout, run_id, as_json))
        return

    async def body(store: JetStreamEventStore) -> None:
        await trace(store, run_id, as_json=as_json, otlp=otlp, console=stdout_console(), emit_json=print_json)

    run_on_store(connection_options(nats, creds, token, data_dir, timeout), body, url_option=True)


async def _trace_over_http(url: str, api_token: str | None, timeout: float, run_id: str, as_json: bool) -> None:
    """`trace RUN --url`: the `spans` of the run's timeline (the same records, computed by the server)."""
    from agentlog.cli.trace import render_tree
    from agentlog.runtime.telemetry import SpanRecord

    async with http_api(url, api_token, timeout) as client:
        spans = (await client.request("GET", f"/v1/runs/{run_id}/timeline"))["spans"]
    if as_json:
        print_json({"run_id": run_id, "exported": False, "spans": spans})
        return
    stdout_console().print(render_tree([
        SpanRecord(key=s["key"], parent=s["parent"], name=s["name"], start_ms=s["start_ms"], end_ms=s["end_ms"],
                   error=s["error"], attributes=s["attributes"]) for s in spans]))


async def _verify(store: JetStreamEventStore, run_id: str, spec: str, source: Any,
                  reexecute: list[str], keep_from_log: list[str], as_json: bool) -> None:
    """Verified replay (agentlog.runtime.replay.verify) of one run; exit 1 with the diverging event if it differs.

    `runtime` is imported here, not at the top, so the CLI starts fast; its loggers log to
    stderr whatever the import order (`agentlog.cli.logging`)."""
    from agentlog.runtime.agents.spec import UnknownAgent
    from agentlog.runtime.replay.verify import UnknownReplayRun
    from agentlog.runtime.toolkits.subagents import verify_tree

    user_app = resolve_app(source, store, spec)
    from_log = tools_answered_from_log(user_app, spec, reexecute, keep_from_log)
    try:
        with replay_logs_quiet():
            # the run and its sub-agent runs (agentlog.runtime.toolkits.subagents), parents first
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
        print_json(doc)
    else:
        for r in reports:
            _render_verified(r) if r.ok else _render_divergence(r)
    if not all(r.ok for r in reports):
        raise typer.Exit(1)
