"""How a CLI command (or any short-lived tool) reaches the log.

With a NATS URL it connects to the user's server or cluster; without one it starts the embedded
nats-server (DESIGN 2.4) on the data directory for exactly as long as the command runs. Both paths
go through one async context manager so every command gets the same bounded connect, the same
typed `StoreUnavailable` on failure, and the same clean shutdown (the embedded server is stopped
even when the command is cancelled by Ctrl-C).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import structlog

from eventlog.jetstream import JetStreamEventStore
from eventlog.server import DEFAULT_DATA_DIR, EmbeddedNatsServer

log = structlog.get_logger("agentlog.connection")

#: Environment variable naming the NATS server(s) when `--nats` is not given.
NATS_URL_ENV = "AGENTLOG_NATS_URL"


@dataclass(frozen=True)
class ConnectionOptions:
    """Where the log is. `nats_url=None` means "start the embedded server on `data_dir`".

    `timeout` bounds the connect and every request, so a dead server gives a clear error in
    seconds instead of a hang.
    """

    nats_url: str | None = None
    creds: Path | None = None
    token: str | None = None
    data_dir: Path = DEFAULT_DATA_DIR
    timeout: float = 5.0
    #: Replicas of the streams and KV buckets this process creates, or raises existing ones to
    #: (None: 1 for new ones; existing ones are never lowered, see `eventlog.replicas`).
    replicas: int | None = None

    @property
    def embedded(self) -> bool:
        return not self.nats_url

    def servers(self) -> list[str]:
        """The URL option may name several servers, comma separated (a cluster)."""
        assert self.nats_url
        return [part.strip() for part in self.nats_url.split(",") if part.strip()]


@asynccontextmanager
async def open_store(options: ConnectionOptions) -> AsyncIterator[JetStreamEventStore]:
    """Yield a connected `JetStreamEventStore`; close it (and stop an embedded server) on exit."""
    server: EmbeddedNatsServer | None = None
    if options.embedded:
        server = EmbeddedNatsServer(options.data_dir)
        log.debug("starting embedded nats-server", data_dir=str(server.data_dir), url=server.url)
        await server.astart(timeout=max(options.timeout, 10.0))
        servers = [server.url]
    else:
        servers = options.servers()
    try:
        log.debug("connecting", servers=servers)
        store = await JetStreamEventStore.connect(
            servers,
            creds=options.creds,
            token=options.token,
            name="agentlog-cli",
            connect_timeout=options.timeout,
            request_timeout=options.timeout,
            replicas=options.replicas,
        )
        try:
            yield store
        finally:
            await store.close()
    finally:
        if server is not None:
            log.debug("stopping embedded nats-server")
            await server.astop()
