"""`agentlog mcp --app X`: the app's agents as an MCP server on stdio (agentlog.gateway.adapters.mcp.agent_tools),
for MCP hosts that start their servers as subprocesses (editors, desktop assistants); and
`agentlog acp --app X [--agent ID]`: one agent over the Agent Client Protocol on stdio
(agentlog.gateway.adapters.acp.agent), for editors that drive agents.

The process is a worker for the app plus the MCP session: calls go through the durable command
queue like the gateway's (its own worker takes them, or any other worker of the deployment when
`--nats` points at one), so a run outlives the MCP host that started it. stdout carries the MCP
protocol only: logs go to stderr and no banner is printed.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from agentlog.cli.core import (
    AppOpt,
    CredsOpt,
    DataDirOpt,
    NatsOpt,
    ReplicasOpt,
    TimeoutOpt,
    TokenOpt,
    app,
    connection_options,
    guard,
    run_main,
)
from agentlog.eventlog.embedded.server import DEFAULT_DATA_DIR
from agentlog.gateway.operations.connection import ConnectionOptions


async def serve_stdio(source: Any, options: ConnectionOptions, app_spec: str | None) -> None:
    """Run the app's worker and the MCP server on this process's stdin/stdout until stdin ends."""
    from mcp.server.stdio import stdio_server

    from agentlog.cli.assembly import ServerConfig, serve
    from agentlog.gateway.adapters import session
    from agentlog.gateway.adapters.mcp.agent_tools import build_server
    from agentlog.gateway.operations import dispatch
    from agentlog.runtime import agent_catalog

    config = ServerConfig(role="worker", app=source, app_spec=app_spec, connection=options, nats_service=False)
    async with serve(config) as server:
        assert server.store is not None and server.runtime is not None  # a worker's
        specs = server.runtime.agents
        dispatcher = dispatch.QueueDispatcher(server.store.nc, server.store, agents=[s.id for s in specs],
                                              descriptions={s.id: s.description for s in specs},
                                              snapshots=server.snapshots, app_name=config.resolved_app_name())
        catalog = agent_catalog(server.runtime)
        mcp = build_server(session.backend_of(server.store, dispatcher), lambda: catalog, who=lambda _ctx: None)
        async with stdio_server() as (read, write):
            await mcp.run(read, write, mcp.create_initialization_options())


async def serve_acp(source: Any, options: ConnectionOptions, app_spec: str | None, agent: str | None) -> None:
    """Run the app's worker and one agent as an ACP agent on this process's stdin/stdout."""
    try:
        from acp import run_agent
    except ImportError as exc:
        from agentlog.runtime.models.extras import MissingExtra

        raise MissingExtra("acp", "agentlog acp", exc) from None

    from agentlog import __version__
    from agentlog.cli.assembly import ServerConfig, serve
    from agentlog.gateway.adapters import session
    from agentlog.gateway.adapters.acp.agent import AgentlogAcpAgent
    from agentlog.gateway.operations import dispatch
    from agentlog.gateway.operations.dispatch import AgentNotFound

    config = ServerConfig(role="worker", app=source, app_spec=app_spec, connection=options, nats_service=False)
    async with serve(config) as server:
        assert server.store is not None and server.runtime is not None  # a worker's
        specs = server.runtime.agents
        ids = [s.id for s in specs]
        chosen = agent or (ids[0] if ids else "")
        if chosen not in ids:
            raise AgentNotFound(f"unknown agent {chosen!r} (the app has: {', '.join(ids)})")
        dispatcher = dispatch.QueueDispatcher(server.store.nc, server.store, agents=ids,
                                              snapshots=server.snapshots, app_name=config.resolved_app_name())
        acp_agent: Any = AgentlogAcpAgent(session.backend_of(server.store, dispatcher), chosen, version=__version__)
        await run_agent(acp_agent)  # the package's `Agent` protocol, implemented structurally


@app.command("acp")
def acp_cmd(
    app_spec: AppOpt = None,
    agent: Annotated[str | None, typer.Option("--agent", help="The agent to serve (default: the app's first).")] = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0, replicas: ReplicasOpt = None,
) -> None:
    """One agent of the app over the Agent Client Protocol on stdio (editors); permission
    requests are the run's approvals. Runs a worker for the app in this process."""
    from agentlog.gateway.operations.app_loader import load_app

    source = guard(lambda: load_app(app_spec)) if app_spec else None
    run_main(lambda: serve_acp(source, connection_options(nats, creds, token, data_dir, timeout, replicas, use="start"), app_spec, agent))


@app.command("mcp")
def mcp_cmd(
    app_spec: AppOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0, replicas: ReplicasOpt = None,
) -> None:
    """The app's agents as an MCP server on stdio (each agent a tool; approvals as elicitation).
    Runs a worker for the app in this process."""
    from agentlog.gateway.operations.app_loader import load_app

    source = guard(lambda: load_app(app_spec)) if app_spec else None
    run_main(lambda: serve_stdio(source, connection_options(nats, creds, token, data_dir, timeout, replicas, use="start"), app_spec))
