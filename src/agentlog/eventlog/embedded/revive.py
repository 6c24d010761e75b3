"""Bringing the embedded nats-server's JetStream back after a full disk, without a restart.

On a real ENOSPC, nats-server (measured with 2.15.1) latches the write error of the stream that
hit it ("critical write error" in its log): that stream answers none of its writes until
JetStream is restarted on it, even after space is back. The server can do that in place: a
config reload with `jetstream: disabled`, then one with the original config, stops and starts
JetStream with every stream, consumer and message intact, and the clients reconnect their
consumers by themselves. For the data dir's own server (`agentlog serve` with no `--nats`),
agentlog does that once writes have been going unanswered and the disk has room again
(`DiskWatch`); for a server of your own, the serve guide (docs/deployment/serve.md) says how to do it by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import nats.errors
from nats.aio.client import Client as NATS

if TYPE_CHECKING:
    from agentlog.eventlog.jetstream.store import JetStreamEventStore

log = logging.getLogger("agentlog.revive")

#: How often the watch looks, and the least time between two JetStream restarts.
CHECK_EVERY = 1.0
MIN_BETWEEN = 30.0


def server_pid(data_dir: Path) -> int | None:
    """The pid of the data dir's running nats-server, from the ports file it writes."""
    for path in sorted((data_dir / "run").glob("*.ports")):
        pid = path.stem.rpartition("_")[2]
        if pid.isdigit():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(pid), 0)
                return int(pid)
    return None


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


#: What nats-server logs once it has applied a config reload (JetStream stopped or started).
RELOADED = b"Reloaded server configuration"


async def _jetstream_enabled(nc: NATS) -> bool:
    try:
        await nc.request("$JS.API.INFO", b"", timeout=0.5)
        return True
    except nats.errors.NoRespondersError:
        return False
    except nats.errors.TimeoutError:
        return True  # a slow answer is not "disabled"


async def _until(nc: NATS, enabled: bool, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await _jetstream_enabled(nc) is enabled:
            return True
        await asyncio.sleep(0.05)  # pacing of the probe
    return False


def _log_size(data_dir: Path) -> int:
    try:
        return (data_dir / "nats-server.log").stat().st_size
    except OSError:
        return 0


async def _until_reloaded(data_dir: Path, offset: int, timeout: float) -> bool:
    """Until the server's log, past `offset`, says a config reload was applied. (JetStream's API
    does not tell: with JetStream off a request goes unanswered, as a slow one does.)"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), open(data_dir / "nats-server.log", "rb") as f:
            f.seek(offset)
            if RELOADED in f.read():
                return True
        await asyncio.sleep(0.05)  # pacing of the look
    return False


async def restart_jetstream(data_dir: Path, nc: NATS, timeout: float = 10.0) -> bool:
    """Reload the data dir's nats-server with JetStream off, then (once it logged that reload)
    with its config as it was. False if there is no server of the data dir to signal or it did
    not come back in time."""
    pid = server_pid(data_dir)
    config = data_dir / "nats-server.conf"
    if pid is None or not config.exists():
        return False
    original = config.read_text()
    disabled = [line for line in original.splitlines() if not line.startswith("jetstream ")]
    try:
        _write_private(config, "\n".join([*disabled, "jetstream: disabled"]) + "\n")
        offset = _log_size(data_dir)
        os.kill(pid, signal.SIGHUP)
        await _until_reloaded(data_dir, offset, timeout)
    finally:
        _write_private(config, original)
        os.kill(pid, signal.SIGHUP)
    return await _until(nc, True, timeout)


def write_error_latched(data_dir: Path, tail: int = 256 * 1024) -> bool:
    """Whether the data dir's nats-server logged a stream's critical write error since JetStream
    last started (the evidence that only a JetStream restart clears it, as opposed to a server
    that is merely slow)."""
    path = data_dir / "nats-server.log"
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail))
            text = f.read().decode(errors="replace")
    except OSError:
        return False
    latched = text.rfind("critical write error")
    return latched >= 0 and latched > text.rfind("Starting JetStream")


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


class DiskWatch:
    """While this process's writes go unanswered (`WriteHealth.unanswered`), the server logged a
    stream's critical write error since JetStream started (`write_error_latched`: not a server
    that is only slow) and the data dir's disk has `min_free` bytes again, restart JetStream in
    place (`restart_jetstream`), at most once per `MIN_BETWEEN` seconds."""

    def __init__(self, data_dir: Path, store: JetStreamEventStore, min_free: int | None = None) -> None:
        self.data_dir = data_dir
        self.store = store
        self.min_free = min_free if min_free is not None else max(2 * int(store.max_payload), 4 << 20)
        self.restarts = 0
        self._last = float("-inf")
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        self._stopping = False
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="agentlog-disk-watch")

    async def stop(self) -> None:
        # also a flag: a cancel can be lost in a nats-py call (agentlog.eventlog.cancel)
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None

    async def _watch(self) -> None:
        while not self._stopping:
            await asyncio.sleep(CHECK_EVERY)  # the watch's pace
            try:
                await self.check()
            except Exception:  # noqa: BLE001 - a failed attempt is logged; the next look may do better
                log.exception("restarting JetStream after a full disk failed")

    async def check(self) -> bool:
        """One look; True if it restarted JetStream."""
        writes = self.store.writes
        if not (writes.failing and writes.unanswered) or time.monotonic() - self._last < MIN_BETWEEN:
            return False
        if free_bytes(self.data_dir) < self.min_free or not write_error_latched(self.data_dir):
            return False
        self._last = time.monotonic()
        log.warning("writes go unanswered and the disk has room again: restarting JetStream on %s "
                    "(nats-server keeps a stream's write error after a full disk)", self.data_dir)
        done = await restart_jetstream(self.data_dir, self.store.nc)
        self.restarts += done
        return done


__all__ = ["DiskWatch", "free_bytes", "restart_jetstream", "server_pid", "write_error_latched"]
