"""Start the tests' `agentlog` processes by forking one that has already imported the CLI.

A test deployment (`topology.deploy`) starts `agentlog serve`, or `agentlog gateway` and
`agentlog worker`: the suite starts about two hundred of them, and most of each start is
importing the package and its dependencies (nats-py, aiohttp, pydantic, the adapters): ~0.8 s
of CPU for `serve` against ~0.15 s for the rest of its start, on a 2-core CI machine where the
suite is CPU-bound. So each pytest process keeps one *fork server*: a Python process, started
like the real command (same interpreter, `PYTHONPATH`, working directory), that imports what
`agentlog serve` imports and then waits. For each process a test asks for, it forks; the child
takes the test's stdin/stdout/stderr, argv, environment and working directory, and runs the
same entry point as `python -m agentlog` (`agentlog.cli.main`), so the process under test is
still a separate OS process running the real command, killed and restarted as users' are.

What differs from `python -m agentlog` is only that the modules were imported before the
environment was set: nothing in agentlog reads the environment at import (the commands read it
when they run), and the app module (`--app`) is imported after the fork, as usual. Tests that
are about a process start itself (configuration errors, data dirs, `python -m agentlog ...`)
run the real command line through `subprocess`, and `AGENTLOG_TEST_FORKSERVER=0` makes the
deployments do so too.

Protocol (a Unix socket per server): the client sends one JSON line `{"argv", "cwd", "env"}`
with three file descriptors (stdin, stdout, stderr) attached; the server answers
`{"pid": N}` on that connection, and `{"returncode": R}` when the child ends (`R` as
`subprocess.Popen.returncode`: negative for a signal), then closes it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from typing import IO, Any

#: What the fork server imports before it forks: the CLI, and what `serve`, `gateway` and
#: `worker` import when they start (agentlog/cli/assembly.py imports these inside functions; the
#: A2A, MCP-over-HTTP and telemetry ones bring their SDKs). A module of an extra that is not
#: installed is left out.
PRELOAD = (
    "agentlog.cli",
    "agentlog.cli.demo",
    "agentlog.cli.assembly",
    "agentlog.eventlog.embedded.datadir",
    "agentlog.gateway.adapters.a2a.mapping",
    "agentlog.gateway.adapters.a2a.push",
    "agentlog.gateway.adapters.a2a.routes",
    "agentlog.gateway.adapters.a2a.handler",
    "agentlog.gateway.adapters.mcp.streamable_http",
    "agentlog.gateway.adapters.nats_routes",
    "agentlog.gateway.adapters.routes",
    "agentlog.gateway.adapters.session",
    "agentlog.gateway.http",
    "agentlog.gateway.http.urls",
    "agentlog.gateway.http.write",
    "agentlog.gateway.operations.auth",
    "agentlog.projections.kv",
    "agentlog.projections.runner",
    "agentlog.runtime",
    "agentlog.runtime.digest",
    "agentlog.runtime.facade",
    "agentlog.runtime.live",
    "agentlog.runtime.snapshots.store",
    "agentlog.runtime.telemetry",
    "agentlog.runtime.workers.commands",
    "agentlog.runtime.workers.worker",
)
ENABLED_ENV = "AGENTLOG_TEST_FORKSERVER"
START_TIMEOUT = 60.0


def enabled() -> bool:
    return os.environ.get(ENABLED_ENV, "1") != "0"


# -- the client side (in the pytest process) -------------------------------------------------------


class ForkedProcess:
    """The `subprocess.Popen` surface the deployments use, for a child of the fork server."""

    def __init__(self, args: Sequence[str], pid: int, stdout: IO[bytes] | None, status: socket.socket,
                 received: bytes = b"") -> None:
        self.args = list(args)
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None
        self._status = status
        self._lock = threading.Lock()
        self._buffer = received  # what the server sent after the pid: its exit, if already over

    def poll(self) -> int | None:
        return self._collect(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._collect(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    async def wait_async(self) -> int:
        """`wait` for an event loop: the return code, without blocking the loop."""
        loop = asyncio.get_running_loop()
        while (code := self.poll()) is None:
            reported: asyncio.Future[None] = loop.create_future()
            fd = self._status.fileno()
            loop.add_reader(fd, _resolve, reported)
            try:
                await reported
            finally:
                loop.remove_reader(fd)
        return code

    def _collect(self, timeout: float | None) -> int | None:
        """The return code once the server reported it; waits up to `timeout` (None: forever)."""
        with self._lock:
            while self.returncode is None:
                readable, _, _ = select.select([self._status], [], [], timeout)
                if not readable:
                    return None
                chunk = self._status.recv(4096)
                self._buffer += chunk
                if b"\n" in self._buffer or not chunk:
                    line = self._buffer.split(b"\n", 1)[0]
                    self.returncode = int(json.loads(line)["returncode"]) if line else -signal.SIGKILL
                    self._status.close()
            return self.returncode


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class AsyncForkedProcess:
    """The `asyncio.subprocess.Process` surface the worker tests use, for a forked child."""

    def __init__(self, proc: ForkedProcess) -> None:
        self._proc = proc
        self.pid = proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.poll()

    async def wait(self) -> int:
        return await self._proc.wait_async()

    def kill(self) -> None:
        self._proc.kill()


class ForkServer:
    """One fork server process, started on first use, ended with this process."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._path = ""
        self._lock = threading.Lock()

    def _started(self, cwd: str) -> str:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                where = tempfile.mkdtemp(prefix="agentlog-fork-")
                atexit.register(shutil.rmtree, where, ignore_errors=True)
                self._path = os.path.join(where, "socket")
                # This process's environment, without $PYTHONPATH: each child sets its own.
                server_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "tests.support.forkserver", self._path], cwd=cwd, env=server_env,
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,  # stdin: EOF when this process ends
                )
                assert self._proc.stdout is not None
                readable, _, _ = select.select([self._proc.stdout], [], [], START_TIMEOUT)
                line = self._proc.stdout.readline() if readable else b""
                if line.strip() != b"ready":
                    self._proc.kill()
                    raise RuntimeError(f"the fork server did not start: {line!r}")
                atexit.register(self._proc.kill)
            return self._path

    def spawn(self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str], stderr: IO[bytes],
              stdout: IO[bytes] | None = None) -> ForkedProcess:
        """Run `agentlog <argv>` (the arguments after `python -m agentlog`) with stdin from
        /dev/null, stdout to `stdout` (default: a pipe, `ForkedProcess.stdout`), stderr to `stderr`."""
        path = self._started(cwd)
        read_end, write_end = os.pipe() if stdout is None else (-1, os.dup(stdout.fileno()))
        with open(os.devnull, "rb") as stdin:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(path)
                request = json.dumps({"argv": list(argv), "cwd": cwd, "env": dict(env)}).encode() + b"\n"
                socket.send_fds(conn, [request], [stdin.fileno(), write_end, stderr.fileno()])
            except BaseException:
                conn.close()
                if read_end >= 0:
                    os.close(read_end)
                raise
            finally:
                os.close(write_end)
        answer = b""
        while b"\n" not in answer:
            chunk = conn.recv(4096)
            if not chunk:
                if read_end >= 0:
                    os.close(read_end)
                conn.close()
                raise RuntimeError(f"the fork server did not start agentlog {' '.join(argv)}")
            answer += chunk
        line, rest = answer.split(b"\n", 1)
        return ForkedProcess(["agentlog", *argv], int(json.loads(line)["pid"]),
                             os.fdopen(read_end, "rb") if read_end >= 0 else None, conn, rest)


SERVER = ForkServer()


def run(argv: Sequence[str], *, cwd: str, env: Mapping[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """`agentlog <argv>` run to its end, as `subprocess.run([sys.executable, "-m", "agentlog",
    *argv], capture_output=True, text=True, ...)` would: forked from the fork server (its start
    costs ~0.1 s of CPU, not ~0.6 s), or the real command line when the fork server is off. For
    the tests of what a command does; a test of a process start itself runs the command line.
    `env` is the child's whole environment. Raises `subprocess.TimeoutExpired` (the child
    killed) past `timeout` seconds."""
    if not enabled():
        return subprocess.run([sys.executable, "-m", "agentlog", *argv], capture_output=True, text=True, cwd=cwd,
                              env=dict(env), timeout=timeout, stdin=subprocess.DEVNULL)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = SERVER.spawn(argv, cwd=cwd, env=env, stdout=out, stderr=err)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(["agentlog", *argv], code, out.read().decode(), err.read().decode())


# -- the server side (`python tests/support/forkserver.py SOCKET`) -------------------------------------------


def _serve(path: str) -> None:
    import importlib

    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    assert threading.active_count() == 1, "a thread started at import: it would not survive a fork"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup fd is what tells
    children: dict[int, socket.socket] = {}
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        readable, _, _ = select.select([listener, wake_read, sys.stdin], [], [])
        if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1):
            return  # the pytest process is gone
        if wake_read in readable:
            os.read(wake_read, 4096)
            _reap(children)
        if listener in readable:
            conn, _ = listener.accept()
            pid = _fork(conn, listener, wake_read, wake_write, *children.values())
            if pid is not None:
                children[pid] = conn
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            _reap(children)  # a child that ended before it was registered


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"returncode": code}).encode() + b"\n")
            conn.close()


def _fork(conn: socket.socket, *inherited: Any) -> int | None:
    """Read one request from `conn` and fork its child; the parent gets the child's pid (None
    for a request that could not be read)."""
    try:
        message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        request = json.loads(message.split(b"\n", 1)[0])
    except (OSError, ValueError):
        conn.close()
        return None
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        return pid
    code = 1
    try:
        conn.close()
        for item in inherited:
            item.close() if isinstance(item, socket.socket) else os.close(item)
        code = _child(request, fds)
    finally:
        os._exit(code)


def _child(request: dict[str, Any], fds: list[int]) -> int:
    """Become `python -m agentlog <argv>` in `cwd` with `env` and the three descriptors."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as the interpreter sets them at start
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # sys.path as `python -m` builds it: the working directory, then $PYTHONPATH (the server
    # itself runs without one), then the interpreter's own.
    extra = [entry for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:1] = [os.getcwd(), *extra]
    import agentlog.__main__
    from agentlog.cli import main

    sys.argv = [agentlog.__main__.__file__, *request["argv"]]  # as `python -m agentlog` sets it

    code: int = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:
        code = -signal.SIGINT  # the interpreter ends itself with SIGINT (below)
    except BaseException:  # noqa: BLE001 - reported as the interpreter would, then exit 1
        import traceback

        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # noqa: SLF001 - what interpreter shutdown runs
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if code == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


if __name__ == "__main__":
    _serve(sys.argv[1])
