"""`agentlog dev --app module:attr`: `agentlog serve` that restarts when your code changes.

A small supervisor, no new dependency: it starts the embedded nats-server once (unless `--nats`
is given), runs `agentlog serve --app ... --nats <that server>` as a child process, and polls the
modification times of the Python files (and the config file) under the app's directory. On a
change it stops the child (SIGTERM, then SIGKILL after `--shutdown-timeout`) and starts a new one
on the same port; the log and the NATS server stay up, so runs, threads and waiting approvals
survive a reload (a run in flight is handed back to the command queue by the stopping server and
resumed by the new one). A child that fails to start (a syntax error in your module) is reported
and restarted on the next change. Ctrl-C stops the child, then the nats-server.

Why processes and not `importlib.reload`: a reload keeps stale objects (agents, tools, plugin
instances, module state) alive in the old server's tasks; a fresh process is exactly what
`agentlog serve` will run in production.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated

import structlog
import typer
from rich.text import Text

from agentlog.cli.core import (
    CredsOpt,
    DataDirOpt,
    HostOpt,
    NatsOpt,
    PortOpt,
    TimeoutOpt,
    TokenOpt,
    TokensOpt,
    app,
    connection_options,
    guard,
    run_main,
    stdout_console,
)
from agentlog.eventlog.embedded.datadir import SharedServer
from agentlog.eventlog.embedded.server import DEFAULT_DATA_DIR
from agentlog.gateway.operations.app_loader import AppModuleNotFound, InvalidAppSpec
from agentlog.gateway.operations.connection import ConnectionOptions, acquire_embedded

log = structlog.get_logger("agentlog.dev")

#: (mtime_ns, size) of each watched file: what a change is.
Snapshot = dict[Path, tuple[int, int]]

#: Directories never worth watching (virtualenvs, caches, the data dir's JetStream files).
SKIP_DIRS = frozenset({".venv", "venv", "__pycache__", ".git", ".agentlog", "node_modules", ".mypy_cache",
                       ".pytest_cache", ".hypothesis", "build", "dist"})


# -- what to watch (pure apart from reading the file system) -------------------------------------


def watch_roots(spec: str) -> list[Path]:
    """The directory of the app's module (its package's directory for a package), or of the
    config file. The module is located, not imported, with the current directory on sys.path
    as `load_app` does."""
    if spec.lower().endswith((".yaml", ".yml", ".json")):
        return [Path(spec).resolve().parent]
    module_name, sep, _attr = spec.partition(":")
    if not sep or not module_name:
        raise InvalidAppSpec(f"--app {spec!r}: expected module:attr or a .yaml/.json file")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        found = None
    if found is None or not found.origin:
        raise AppModuleNotFound(f"no module named {module_name!r} (from --app {spec})")
    return [Path(found.origin).resolve().parent]


def snapshot(roots: Iterable[Path], suffixes: tuple[str, ...] = (".py", ".yaml", ".yml", ".json")) -> Snapshot:
    """mtime and size of every watched file under `roots`; files that vanish meanwhile are skipped."""
    seen: Snapshot = {}
    for root in roots:
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")]
            for name in files:
                if name.endswith(suffixes):
                    path = Path(folder, name)
                    try:
                        st = path.stat()
                    except OSError:
                        continue
                    seen[path] = (st.st_mtime_ns, st.st_size)
    return seen


def changed(before: Mapping[Path, tuple[int, int]], after: Mapping[Path, tuple[int, int]]) -> list[Path]:
    """Files added, removed or modified between two snapshots, sorted (pure)."""
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


# -- the supervisor -------------------------------------------------------------------------------


class Supervisor:
    """Runs one `agentlog serve` child at a time; `restart()` replaces it."""

    def __init__(self, argv: list[str], shutdown_timeout: float) -> None:
        self.argv = argv
        self.shutdown_timeout = shutdown_timeout
        self.child: asyncio.subprocess.Process | None = None
        self.starts = 0

    async def start(self) -> None:
        self.starts += 1
        self.child = await asyncio.create_subprocess_exec(*self.argv, stdin=asyncio.subprocess.DEVNULL)
        log.debug("dev.child_started", pid=self.child.pid, starts=self.starts)

    async def stop(self) -> None:
        child, self.child = self.child, None
        if child is None or child.returncode is not None:
            return
        child.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(child.wait(), self.shutdown_timeout)
        except TimeoutError:
            child.kill()
            await child.wait()

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    @property
    def exited(self) -> int | None:
        return self.child.returncode if self.child is not None else None


async def supervise(spec: str, roots: list[Path], serve_args: list[str], options: ConnectionOptions,
                    poll: float, shutdown_timeout: float) -> None:
    """Hold NATS (the data dir's shared, locked-down embedded server unless given), then run the
    serve child; restart it on every change. Embedded: the child runs on the same data dir, so it
    finds the server through its address file and logs in with the dir's generated credentials
    (`agentlog.eventlog.embedded.datadir`); holding a share here keeps that server up across restarts."""
    embedded: SharedServer | None = None
    if options.embedded:
        embedded = await acquire_embedded(options)
        url = embedded.url
        where = ["--data-dir", str(options.data_dir)]
    else:
        url = ",".join(options.servers())
        where = ["--nats", url]
        if options.creds:
            where += ["--creds", str(options.creds)]
        if options.token:
            where += ["--token", options.token]
    argv = [sys.executable, "-c", "from agentlog.cli import main; main()", "serve", "--app", spec, *where,
            *serve_args]
    out = stdout_console()
    sup = Supervisor(argv, shutdown_timeout)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)  # SIGTERM stops the child and NATS too
    try:
        out.print(Text(f"agentlog dev: watching {', '.join(map(str, roots))} (NATS {url})", style="bold"))
        before = snapshot(roots)
        await sup.start()
        reported_exit = False
        while not stopping.is_set():
            try:  # the watcher's poll interval; returns at once on SIGTERM
                await asyncio.wait_for(stopping.wait(), poll)
                break
            except TimeoutError:
                pass
            if sup.exited is not None and not reported_exit:
                out.print(Text(f"agentlog dev: the server exited ({sup.exited}); waiting for a change",
                               style="bold red"))
                reported_exit = True
            after = snapshot(roots)
            diff = changed(before, after)
            if not diff:
                continue
            before = after
            names = ", ".join(p.name for p in diff[:5]) + (" ..." if len(diff) > 5 else "")
            out.print(Text(f"agentlog dev: {names} changed; restarting", style="bold yellow"))
            await sup.restart()
            reported_exit = False
    finally:
        # The handler stays until everything is stopped: a second SIGTERM (GNU timeout sends one
        # to the child and one to its process group) must not kill us half-way through.
        try:
            await sup.stop()
            if embedded is not None:
                await embedded.aclose()
        finally:
            loop.remove_signal_handler(signal.SIGTERM)


@app.command("dev")
def dev_cmd(
    app_spec: Annotated[str, typer.Option(
        "--app", "--config", metavar="MODULE:ATTR|FILE.yaml", help="The application to serve and watch.")],
    host: HostOpt = "127.0.0.1", port: PortOpt = 8480, tokens: TokensOpt = None,
    poll: Annotated[float, typer.Option("--poll", min=0.05, help="Seconds between file checks.")] = 0.5,
    watch: Annotated[list[Path] | None, typer.Option(
        "--watch", help="Also watch this directory (repeatable).")] = None,
    shutdown_timeout: Annotated[float, typer.Option(
        "--shutdown-timeout", min=0.0, help="Seconds a stopping server gets before it is killed.")] = 10.0,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """`serve` with auto-reload: restart the server when a Python file of the app changes."""
    roots = guard(lambda: watch_roots(app_spec)) + [p.resolve() for p in watch or ()]
    serve_args = ["--host", host, "--port", str(port), "--tokens", tokens or "", "--timeout", str(timeout),
                  "--shutdown-timeout", str(min(shutdown_timeout, 10.0))]
    options = connection_options(nats, creds, token, data_dir, timeout, use="start")
    run_main(lambda: supervise(app_spec, roots, serve_args, options, poll, shutdown_timeout))


__all__ = ["Supervisor", "changed", "snapshot", "supervise", "watch_roots"]
