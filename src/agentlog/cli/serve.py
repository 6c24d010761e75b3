"""`agentlog serve | gateway | worker | demo`: the long-running processes (`agentlog.cli.assembly`
assembles them). `agentlog worker` is the one worker entry point. Registered on
`agentlog.cli.core.app`."""

from __future__ import annotations

import errno
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from agentlog.cli.core import (
    AckWaitOpt,
    AppNameOpt,
    AppOpt,
    ConcurrencyOpt,
    CredsOpt,
    DataDirOpt,
    HostOpt,
    NatsOpt,
    PortOpt,
    PublicUrlOpt,
    ReplicasOpt,
    ServeConcurrencyOpt,
    ShutdownOpt,
    TimeoutOpt,
    TokenOpt,
    TokensOpt,
    app,
    connection_options,
    guard,
    log,
    run_main,
    stdout_console,
)
from agentlog.eventlog.embedded.server import DEFAULT_DATA_DIR
from agentlog.eventlog.errors import AgentlogError
from agentlog.gateway.operations.app_loader import load_app
from agentlog.gateway.operations.connection import ConnectionOptions

# -- serve / gateway / worker / demo ------------------------------------------------------------

def _server_config(role: str, app_spec: str | None, host: str, port: int, tokens: str | None,
                   options: ConnectionOptions, concurrency: int | None = None, app_obj: Any = None,
                   ack_wait: float | None = None, shutdown_timeout: float | None = None,
                   max_deliver: int | None = None, metrics_port: int | None = None,
                   public_url: str | None = None, archive_after: float | None = None,
                   app_name: str | None = None, max_concurrent_requests: int | None = None) -> Any:
    from agentlog.cli.assembly import ServerConfig
    from agentlog.gateway.operations.services import Settings

    source = app_obj if app_obj is not None else (guard(lambda: load_app(app_spec)) if app_spec else None)
    return ServerConfig(role=role, app=source, app_spec=app_spec, host=host, port=port, tokens=tokens,  # type: ignore[arg-type]
                        connection=replace(options, embedded_use="start"), worker_concurrency=concurrency, worker_ack_wait=ack_wait,
                        worker_shutdown_timeout=shutdown_timeout, worker_max_deliver=max_deliver,
                        worker_metrics_port=metrics_port, public_url=public_url, archive_after=archive_after,
                        app_name=app_name,
                        settings=None if max_concurrent_requests is None else Settings(
                            max_concurrent_requests=max_concurrent_requests))


def _banner(server: Any) -> None:
    """The addresses a user needs, once the server listens."""
    table = Table(title=f"agentlog {server.config.role}", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    if server.http_url:
        table.add_row("HTTP", server.http_url)
        table.add_row("inspector", f"{server.http_url}/ui")
        table.add_row("API docs", f"{server.http_url}/docs  (spec: /openapi.json)")
        table.add_row("health", f"{server.http_url}/health")
    embedded = server.embedded
    if embedded is None:
        table.add_row("NATS", server.nats_url)
    else:
        joined = "" if embedded.owner else "; joined the one already running there"
        table.add_row("NATS", f"{server.nats_url}  (embedded, data in {server.config.connection.data_dir}{joined})")
    if server.metrics_url:
        table.add_row("metrics", server.metrics_url)
    table.add_row("app", server.config.resolved_app_name())
    table.add_row("parts", ", ".join(server.parts) or "-")
    stdout_console().print(table)
    if embedded is not None and not embedded.owner:
        stdout_console().print(Text(
            f"Another agentlog process already runs the nats-server of {embedded.data_dir}: this {server.config.role} "
            f"joined it (one log, shared; it stops when the last process using it stops).", style="yellow"))
    stdout_console().print(Text("Ctrl-C stops it (in order: HTTP, worker, runs, views, NATS).", style="dim"))


def _serve_role(role: str, app_spec: str | None, host: str, port: int, tokens: str | None,
                options: ConnectionOptions, concurrency: int | None, ack_wait: float | None = None,
                shutdown_timeout: float | None = None, max_deliver: int | None = None,
                metrics_port: int | None = None, ready_file: Path | None = None,
                public_url: str | None = None, archive_after: float | None = None,
                app_name: str | None = None, max_concurrent_requests: int | None = None) -> None:
    from agentlog.cli.assembly import run_until_stopped
    from agentlog.gateway.http.urls import public_base_url

    config = _server_config(role, app_spec, host, port, tokens, options, concurrency,
                            ack_wait=ack_wait, shutdown_timeout=shutdown_timeout, max_deliver=max_deliver,
                            metrics_port=metrics_port, public_url=guard(lambda: public_base_url(public_url)),
                            archive_after=archive_after, app_name=app_name,
                            max_concurrent_requests=max_concurrent_requests)

    def ready(server: Any) -> None:
        _banner(server)
        if ready_file is not None:
            ready_file.write_text(str(os.getpid()))

    async def main() -> None:
        try:
            await run_until_stopped(config, on_ready=ready)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or not port:
                raise
            from agentlog.eventlog.embedded.datadir import busy

            shared = options.embedded and busy(options.data_dir)
            raise PortBusy(host, port, options.data_dir.resolve() if shared else None) from None

    run_main(main)


class PortBusy(AgentlogError):
    """The HTTP port is taken (often another `agentlog serve`): say which, and how to get a free one."""

    code = "port_busy"
    usage_error = True

    def __init__(self, host: str, port: int, shared_data_dir: Path | None = None) -> None:
        who = (f"another agentlog process runs on the data dir {shared_data_dir}: this one would have joined it"
               if shared_data_dir is not None else "another agentlog serve?")
        super().__init__(f"{host}:{port} is already in use ({who}); pick another with "
                         f"--port N, or --port 0 for any free port (the banner prints the one it got)")


ArchiveAfterOpt = Annotated[float | None, typer.Option(
    "--archive-after", envvar="AGENTLOG_ARCHIVE_AFTER", metavar="DAYS", min=0.0,
    help="Retention policy: every hour (AGENTLOG_ARCHIVE_INTERVAL seconds) archive finished threads older than "
         "DAYS, as `agentlog retention` does.")]


MaxConcurrentOpt = Annotated[int | None, typer.Option(
    "--max-concurrent-requests", envvar="AGENTLOG_MAX_CONCURRENT_REQUESTS", metavar="N", min=1,
    help="HTTP requests served at once (an open SSE stream counts); more are answered 503 `overloaded` with "
         "Retry-After. Never applies to /health, /health/live, /metrics. Default: no limit.")]


@app.command("serve")
def serve_cmd(
    app_spec: AppOpt = None, host: HostOpt = "127.0.0.1", port: PortOpt = 8480, tokens: TokensOpt = None,
    concurrency: ServeConcurrencyOpt = None, ack_wait: AckWaitOpt = None, shutdown_timeout: ShutdownOpt = None,
    public_url: PublicUrlOpt = None,
    archive_after: ArchiveAfterOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0, replicas: ReplicasOpt = None,
    app_name: AppNameOpt = None, max_concurrent_requests: MaxConcurrentOpt = None,
) -> None:
    """Gateway + worker in one process: HTTP API, NATS service, projections and the runtime.
    Every run goes through the durable command queue, so a stopped or killed process strands none."""
    _serve_role("serve", app_spec, host, port, tokens, connection_options(nats, creds, token, data_dir, timeout, replicas),
                concurrency, ack_wait, shutdown_timeout, public_url=public_url, archive_after=archive_after,
                app_name=app_name, max_concurrent_requests=max_concurrent_requests)


@app.command("gateway")
def gateway_cmd(
    app_spec: AppOpt = None, host: HostOpt = "127.0.0.1", port: PortOpt = 8480, tokens: TokensOpt = None,
    public_url: PublicUrlOpt = None,
    archive_after: ArchiveAfterOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0, replicas: ReplicasOpt = None,
    app_name: AppNameOpt = None, max_concurrent_requests: MaxConcurrentOpt = None,
) -> None:
    """The gateway alone (HTTP + NATS service); commands are queued for `agentlog worker`s (of
    `--app-name` for new runs, of the app each run records for the rest)."""
    _serve_role("gateway", app_spec, host, port, tokens, connection_options(nats, creds, token, data_dir, timeout, replicas), 1,
                public_url=public_url, archive_after=archive_after, app_name=app_name,
                max_concurrent_requests=max_concurrent_requests)


@app.command("worker")
def worker_cmd(
    app_spec: AppOpt = None, concurrency: ConcurrencyOpt = None,
    ack_wait: AckWaitOpt = None, shutdown_timeout: ShutdownOpt = None,
    max_deliver: Annotated[int, typer.Option(
        "--max-deliver", help="Failed deliveries of a command before it is dead-lettered to agentlog.dlq.<thread> "
                              "(0: never).")] = 25,  # agentlog.runtime.workers.worker.DEFAULT_MAX_DELIVER
    metrics_port: Annotated[int | None, typer.Option(
        "--metrics-port", min=0, max=65535,
        help="Serve Prometheus /metrics (the worker's commands and load; tokens, tool calls, model latency) "
             "on 127.0.0.1:PORT.")] = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0, replicas: ReplicasOpt = None,
    ready_file: Annotated[Path | None, typer.Option(
        "--ready-file", hidden=True, help="Write the pid to this file once consuming (for tests and benchmarks).")] = None,
    app_name: AppNameOpt = None,
) -> None:
    """A worker alone: takes commands from the JetStream work queue (agentlog.runtime.workers.worker.Worker).
    The one worker entry point (`python -m agentlog worker` is the same)."""
    _serve_role("worker", app_spec, "127.0.0.1", 0, None, connection_options(nats, creds, token, data_dir, timeout, replicas),
                concurrency, ack_wait, shutdown_timeout, max_deliver, metrics_port, ready_file=ready_file,
                app_name=app_name)


#: The demo's app name: its runs go to its own worker even on a NATS another app serves.
DEMO_APP_NAME = "demo"


def _demo_data_dir(default: Path) -> Path:
    """The default data dir, unless a process (a `serve`) runs on it: then `<default>-demo`, or
    a new temporary dir if that one is busy too. Sharing the running server would mix the demo's
    data with that process's."""
    from agentlog.eventlog.embedded.datadir import busy

    if not busy(default):
        return default
    sibling = default.with_name(default.name + "-demo")
    chosen = sibling if not busy(sibling) else Path(tempfile.mkdtemp(prefix="agentlog-demo-"))
    stdout_console().print(Text(f"{default} is in use by another agentlog process: the demo keeps its data in {chosen}",
                      style="yellow"))
    return chosen


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
    the finished run. Its runs are app `demo`'s (only the demo's worker drives them); without
    --data-dir, when another process runs on the default data dir, it uses its own."""
    if nats is None and data_dir == DEFAULT_DATA_DIR and not os.environ.get("AGENTLOG_DATA_DIR"):
        data_dir = _demo_data_dir(data_dir)
    options = connection_options(nats, creds, token, data_dir, timeout, replicas)

    async def main() -> int:
        from agentlog.cli.assembly import serve
        from agentlog.cli.demo import app_with_mcp as demo_factory
        from agentlog.cli.demo import run_demo
        from agentlog.gateway.operations.auth import resolve_tokens

        config = _server_config("serve", None, host, port, tokens, options, app_obj=demo_factory,
                                app_name=DEMO_APP_NAME)
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
                                  console=stdout_console(), token=api_token)
        finally:
            await server_cm.__aexit__(None, None, None)

    run_main(main)
