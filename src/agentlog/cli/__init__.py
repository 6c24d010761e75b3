"""The `agentlog` command line (DESIGN 5.3): `agentlog.cli:main` is the console script.

`core` holds the typer app, the shared connection options and error handling; each command
group registers itself on that app from its own module, imported here (in the order of
`agentlog --help`) so that `app` has every command once the package is imported: `reads`
(events, threads, runs, projections), `replay` (replay, trace), `export` (export, import), `retention`, `serve` (serve, gateway, worker,
demo), `runs` (`agentlog run ...`), `dev`, `mcp` (the MCP stdio server),
`nats_requests` (`agentlog nats req|sub`). The command modules import `core`, never each other's
registration, so the package has no import cycle (import-linter checks it).
"""

import gc

# Importing the commands (and with them nats-py, aiohttp, pydantic, rich) allocates tens of
# thousands of long-lived objects, and the cyclic collector walked them again and again while they
# were made: ~15% of the CPU of an `agentlog` start. None of them is garbage, so collection waits
# until the imports are done (and `main` freezes them out of later collections).
_collecting = gc.isenabled()
gc.disable()
try:
    # The order of `agentlog --help`:
    # isort: off
    from agentlog.cli import core
    from agentlog.cli import reads as _reads  # noqa: F401 - each registers its commands on `app`
    from agentlog.cli import replay as _replay  # noqa: F401
    from agentlog.cli import export as _export  # noqa: F401
    from agentlog.cli import retention as _retention  # noqa: F401
    from agentlog.cli import serve as _serve  # noqa: F401
    from agentlog.cli import runs as _runs  # noqa: F401
    from agentlog.cli import dev as _dev  # noqa: F401
    from agentlog.cli import mcp as _mcp  # noqa: F401
    from agentlog.cli import nats_requests as _nats_requests  # noqa: F401
    # isort: on
    from agentlog.cli.core import app
finally:
    if _collecting:
        gc.enable()


def main() -> None:
    """Console-script entry point (`agentlog`). The objects made so far (modules, classes,
    schemas) live as long as the process: `gc.freeze` keeps every later collection from walking
    them again."""
    gc.freeze()
    app(prog_name="agentlog")


__all__ = ["app", "core", "main"]
