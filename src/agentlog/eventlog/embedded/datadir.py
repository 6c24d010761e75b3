"""One embedded nats-server per data dir, shared by every agentlog process on that dir.

Two nats-servers on one JetStream store dir corrupt it (two processes appending to the same block
files): `agentlog serve` twice on `./.agentlog`, or `agentlog runs` next to a running `serve`,
would lose accepted runs. So the data dir has three files (all under it, nothing global):

* `server.lock` (flock, exclusive): held by the process that starts the server *and inherited by
  the nats-server child*, so it is held exactly while that server may be running, even if the
  process that started it was SIGKILLed. A free lock means no server: the next process takes it
  over (a stale lock cannot exist: the kernel drops a flock with its last holder).
* `server.json` (`{"url", "pid"}`, written after the server is up): how a second process finds the
  running server. It connects there (with the data dir's credentials, `agentlog.eventlog.roles`) instead of
  starting its own.
* `users.lock` (flock, shared): held by every process using the server. The last one to leave (it
  gets the lock exclusively) stops the server, whether it started it or not; a process that leaves
  while others still use the server leaves it running for them.

The server itself starts with the data dir's generated credentials (`agentlog.eventlog.roles`), never open.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from agentlog.eventlog.embedded.server import STORE_DIR, EmbeddedNatsServer
from agentlog.eventlog.errors import StoreUnavailable
from agentlog.eventlog.roles import Credentials, load_or_create_credentials

log = logging.getLogger(__name__)

SERVER_LOCK = "server.lock"
USERS_LOCK = "users.lock"
SERVER_FILE = "server.json"
_POLL = 0.05

#: Called once by the process that started the server, before anyone else is told its URL.
OnStarted = Callable[[str, Credentials], Awaitable[None]]


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _try_flock(fd: int, mode: int) -> bool:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise


def read_server_file(data_dir: Path) -> dict[str, object] | None:
    try:
        doc = json.loads((data_dir / SERVER_FILE).read_text())
        return doc if isinstance(doc, dict) and isinstance(doc.get("url"), str) else None
    except (OSError, ValueError):
        return None


def _answers(url: str) -> bool:
    host, _, port = url.rpartition("//")[2].rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except (OSError, ValueError):
        return False


def _is_our_server(pid: int, data_dir: Path) -> bool:
    """pid is a nats-server running this data dir's config (not a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return str(data_dir / "nats-server.conf").encode() in cmdline


class SharedServer:
    """This process's use of the data dir's server. `url` and `credentials` to connect;
    `close()` when done (stops the server if this was its last user)."""

    def __init__(self, data_dir: Path, url: str, credentials: Credentials, users_fd: int,
                 server: EmbeddedNatsServer | None, lock_fd: int | None) -> None:
        self.data_dir = data_dir
        self.url = url
        self.credentials = credentials
        self.server = server  # set when this process started it
        self._users_fd: int | None = users_fd
        self._lock_fd = lock_fd

    @property
    def owner(self) -> bool:
        return self.server is not None

    @property
    def running(self) -> bool:
        """This process still uses the server and it is up."""
        if self._users_fd is None:
            return False
        return self.server.running if self.server is not None else _answers(self.url)

    def close(self, timeout: float = 10.0) -> None:
        users_fd, self._users_fd = self._users_fd, None
        if users_fd is None:
            return
        try:
            if _try_flock(users_fd, fcntl.LOCK_EX):  # nobody else uses the server: stop it
                self._stop_server(timeout)
            elif self.server is not None:
                log.info("leaving the embedded nats-server running for the other processes on %s", self.data_dir)
                self.server.detach()
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
            os.close(users_fd)

    def _stop_server(self, timeout: float) -> None:
        if self.server is not None:
            self.server.stop(timeout)
        else:  # started by a process that is gone (or left it to us): stop it by its pid
            doc = read_server_file(self.data_dir) or {}
            pid = doc.get("pid")
            if isinstance(pid, int) and _is_our_server(pid, self.data_dir):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + timeout
                while _is_our_server(pid, self.data_dir) and time.monotonic() < deadline:
                    time.sleep(_POLL)
                if _is_our_server(pid, self.data_dir):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        (self.data_dir / SERVER_FILE).unlink(missing_ok=True)

    async def aclose(self, timeout: float = 10.0) -> None:
        await asyncio.to_thread(self.close, timeout)


def busy(data_dir: str | os.PathLike[str]) -> bool:
    """Does a nats-server run on this data dir (its `server.lock` is held)? Only a hint: it may
    start or stop right after."""
    directory = Path(data_dir)
    if not (directory / SERVER_LOCK).exists():
        return False
    fd = _open(directory / SERVER_LOCK)
    try:
        return not _try_flock(fd, fcntl.LOCK_EX)
    finally:
        os.close(fd)  # closing drops a lock we took


class NoServerRunning(StoreUnavailable):
    """`acquire(..., start=False)` found no server running on the data dir (nothing was started
    or created)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        super().__init__(f"no nats-server runs on the data dir {data_dir}")


def has_log(data_dir: str | os.PathLike[str]) -> bool:
    """Has a server ever run on this data dir (its JetStream store exists)?"""
    return (Path(data_dir) / STORE_DIR).is_dir()


async def acquire(data_dir: str | os.PathLike[str], *, timeout: float = 10.0,
                  on_started: OnStarted | None = None, start: bool = True) -> SharedServer:
    """Use the data dir's running server, or start it (with its credentials) if none runs.
    `start=False`: only use a running one; with none, `NoServerRunning`, and nothing on disk is
    created or changed (a client has nothing to talk to on a stopped data dir)."""
    directory = Path(data_dir).resolve()
    if not start and not busy(directory):
        raise NoServerRunning(directory)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    credentials = load_or_create_credentials(directory)
    deadline = time.monotonic() + timeout
    users_fd = _open(directory / USERS_LOCK)
    try:
        while not _try_flock(users_fd, fcntl.LOCK_SH):  # the last user is stopping the server
            await _wait(deadline, directory, "the previous server to stop")
        while True:
            lock_fd = _open(directory / SERVER_LOCK)
            if _try_flock(lock_fd, fcntl.LOCK_EX):
                if not start:  # it stopped since `busy`: nothing to join
                    os.close(lock_fd)
                    raise NoServerRunning(directory)
                try:
                    server = await _start(directory, credentials, lock_fd, timeout, on_started)
                except BaseException:
                    os.close(lock_fd)
                    raise
                return SharedServer(directory, server.url, credentials, users_fd, server, lock_fd)
            os.close(lock_fd)
            doc = read_server_file(directory)
            if doc is not None and _answers(str(doc["url"])):
                log.info("using the running nats-server of %s at %s", directory, doc["url"])
                return SharedServer(directory, str(doc["url"]), credentials, users_fd, None, None)
            await _wait(deadline, directory, "the running server to publish its address")
    except BaseException:
        os.close(users_fd)
        raise


async def _wait(deadline: float, directory: Path, what: str) -> None:
    if time.monotonic() > deadline:
        raise StoreUnavailable(f"data dir {directory} is locked by another agentlog process; gave up waiting "
                               f"for {what}")
    await asyncio.sleep(_POLL)


async def _start(directory: Path, credentials: Credentials, lock_fd: int, timeout: float,
                 on_started: OnStarted | None) -> EmbeddedNatsServer:
    (directory / SERVER_FILE).unlink(missing_ok=True)  # from a server that is gone
    server = EmbeddedNatsServer(directory, extra_config=[credentials.authorization_config()], pass_fds=(lock_fd,))
    await server.astart(timeout=max(timeout, 10.0))
    try:
        if on_started is not None:
            await on_started(server.url, credentials)
        tmp = directory / f".{SERVER_FILE}.{os.getpid()}"
        tmp.write_text(json.dumps({"url": server.url, "pid": server.pid}))
        os.replace(tmp, directory / SERVER_FILE)
    except BaseException:
        await server.astop()
        raise
    log.info("started the embedded nats-server of %s at %s", directory, server.url)
    return server


__all__ = ["SERVER_FILE", "SERVER_LOCK", "NoServerRunning", "SharedServer", "USERS_LOCK", "acquire", "busy", "has_log",
           "read_server_file"]
