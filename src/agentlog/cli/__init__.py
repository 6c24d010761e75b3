"""The `agentlog` command line (DESIGN 5.3): `agentlog.cli:main` is the console script.

`core` holds the typer app, the shared connection options and error handling; each command
group registers itself on that app from its own module (`log_cmds`: events, threads, runs,
projections; `replay`: replay, trace; `serve`: serve, gateway, worker, demo; `runs`: run ...;
`dev`: dev), imported here so that `app` has every command.
"""

from . import core
from .core import app, main

__all__ = ["app", "core", "main"]
