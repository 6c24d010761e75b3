"""`agentlog retention`: archive finished threads older than N days into the Object Store and
remove them from the events stream (`agentlog.eventlog.jetstream.retention`); every run stays replayable.
Registered on `agentlog.cli.core.app`."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from agentlog.cli.core import (
    CredsOpt,
    DataDirOpt,
    NatsOpt,
    ReplicasOpt,
    TimeoutOpt,
    TokenOpt,
    app,
    connection_options,
    print_json,
    run_on_store,
    stdout_console,
)
from agentlog.eventlog.embedded.server import DEFAULT_DATA_DIR
from agentlog.eventlog.jetstream.retention import DAY_MS, archive_due
from agentlog.eventlog.jetstream.store import JetStreamEventStore


@app.command("retention")
def retention_cmd(
    older_than: Annotated[float, typer.Option(
        "--older-than", metavar="DAYS", min=0.0,
        help="Archive threads whose runs have all finished and whose last commit is older than this.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what is due; change nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per thread.")] = False,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0, replicas: ReplicasOpt = None,
) -> None:
    """Archive finished threads older than --older-than days: their commits go into one checksummed
    Object Store object per thread (bucket agentlog_archive) and leave the stream. Replay, time
    travel, timelines and the inspector read them from there. Logs in as `archiver`."""

    async def body(store: JetStreamEventStore) -> None:
        outcomes = await archive_due(store, int(older_than * DAY_MS), dry_run=dry_run, replicas=replicas)
        if as_json:
            for outcome in outcomes:
                print_json(outcome.as_dict())
            return
        table = Table(title=f"retention ({len(outcomes)} threads{', dry run' if dry_run else ''})",
                      title_justify="left")
        for column in ("thread", "result", "commits", "removed from stream", "reason"):
            table.add_column(column, overflow="fold")
        for o in outcomes:
            table.add_row(o.thread_id, o.result, str(o.commits), str(o.removed), o.reason or "-")
        stdout_console().print(table)

    run_on_store(connection_options(nats, creds, token, data_dir, timeout, replicas), body, role="archiver")
