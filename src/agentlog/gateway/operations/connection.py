"""How an agentlog process (a CLI command, `serve`, `gateway`, `worker`) reaches the log.

With a NATS URL it connects to the user's server or cluster (with the `--creds`/`--token` given);
without one it uses the data dir's embedded nats-server (DESIGN 2.4) through `agentlog.eventlog.embedded.datadir`:
shared if another agentlog process runs it, and always with the data dir's generated credentials
(`agentlog.eventlog.roles`), logging in as the role the process needs (`readonly` for the CLI's
read commands). Whether this process may start that server is `ConnectionOptions.embedded_use`:
the servers (`serve`, `gateway`, `worker`) create the data dir and start it; the CLI's reads of
the log start it only on a data dir that has a log; the CLI's API commands never start it (with
no server running, nothing would answer them). A client that finds nothing gets `NoServer`,
naming what it looked for, and leaves the disk as it was. Every path gets the same bounded
connect, the same typed `StoreUnavailable` on failure, and the same clean shutdown (the embedded
server is stopped by its last user, even when a command is cancelled by Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import nats.errors
import structlog
from nats.aio.client import Client as NATS

from agentlog.eventlog.embedded.datadir import NoServerRunning, SharedServer, acquire, has_log
from agentlog.eventlog.embedded.server import DEFAULT_DATA_DIR
from agentlog.eventlog.errors import StoreUnavailable
from agentlog.eventlog.jetstream.connection import open_connection
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.roles import CLIENT_INBOX, Credentials, Login, Role

log = structlog.get_logger("agentlog.connection")

#: Environment variable naming the NATS server(s) when `--nats` is not given.
NATS_URL_ENV = "AGENTLOG_NATS_URL"
#: Environment variable naming the data dir when `--data-dir` is not given.
DATA_DIR_ENV = "AGENTLOG_DATA_DIR"

#: What a process may do with the data dir's embedded server: `start` it (creating the data dir)
#: when none runs, as the servers do; start it only on a data dir that `existing`ly has a log, as
#: the CLI's reads of the log do; or only use one already `running`, as the CLI's API commands do.
EmbeddedUse = Literal["start", "existing", "running"]


class NoServer(StoreUnavailable):
    """Nothing to talk to: no NATS URL, and the data dir has no server running (or no log, for a
    read). Nothing was created or started. The message says what was looked for and where
    (`looked_for`, each `(option, what was found)`), so a command run from the wrong directory
    says so instead of reading an empty log."""

    code = "no_server"

    def __init__(self, looked_for: list[tuple[str, str]], wanted: str) -> None:
        self.looked_for, self.wanted = looked_for, wanted
        tried = "; ".join(f"{where} ({found})" for where, found in looked_for)
        super().__init__(f"no {wanted} found. Looked for: {tried}. Start one with `agentlog serve` (it creates "
                         f"its data dir), or point this command at one with the options above")

    def also(self, option: str, found: str) -> NoServer:
        """The same, having also looked at `option` (a transport the command tried first)."""
        return NoServer([(option, found), *self.looked_for], self.wanted)


@dataclass(frozen=True)
class ConnectionOptions:
    """Where the log is. `nats_url=None` means "the embedded server of `data_dir`".

    `timeout` bounds the connect and every request, so a dead server gives a clear error in
    seconds instead of a hang.
    """

    nats_url: str | None = None
    creds: Path | None = None
    token: str | None = None
    data_dir: Path = DEFAULT_DATA_DIR
    timeout: float = 5.0
    #: Replicas of the streams and KV buckets this process creates, or raises existing ones to
    #: (None: 1 for new ones; existing ones are never lowered, see `agentlog.eventlog.jetstream.replicas`).
    replicas: int | None = None
    #: Without a URL: may this process start the data dir's server (`EmbeddedUse`)?
    embedded_use: EmbeddedUse = "start"

    @property
    def embedded(self) -> bool:
        return not self.nats_url

    def servers(self) -> list[str]:
        """The URL option may name several servers, comma separated (a cluster)."""
        assert self.nats_url
        return [part.strip() for part in self.nats_url.split(",") if part.strip()]


async def prepare_layout(replicas: int | None, url: str, credentials: Credentials) -> None:
    """Run by the process that starts the embedded server: create the streams and KV buckets
    (as `serve`), so processes with narrower roles (`readonly`) find them in place."""
    from agentlog.projections.kv import KVViewStore
    from agentlog.runtime.workers import ensure_runtime_streams

    store = await JetStreamEventStore.connect(url, name="agentlog-setup", replicas=replicas,
                                              **credentials.login("serve"))
    try:
        await ensure_runtime_streams(store.nc.jetstream(), replicas=replicas)
        await KVViewStore.open(store.nc, replicas=replicas)
    finally:
        await store.close()


def _no_server(options: ConnectionOptions, found: str) -> NoServer:
    where = options.data_dir.resolve()
    looked = [(f"--nats / ${NATS_URL_ENV}", "not set"), (f"--data-dir / ${DATA_DIR_ENV} = {where}", found)]
    return NoServer(looked, "agentlog server" if options.embedded_use == "running" else "agentlog server or log to read")


async def acquire_embedded(options: ConnectionOptions) -> SharedServer:
    """This process's share of the data dir's embedded server: started (with `prepare_layout`)
    if no other agentlog process runs it and `options.embedded_use` allows; else `NoServer`."""
    use = options.embedded_use
    if use != "start" and not has_log(options.data_dir):
        what = "no such directory" if not options.data_dir.exists() else "no log in it: no server has run there"
        raise _no_server(options, what)
    try:
        return await acquire(options.data_dir, timeout=max(options.timeout, 10.0), start=use != "running",
                             on_started=lambda url, creds: prepare_layout(options.replicas, url, creds))
    except NoServerRunning:
        raise _no_server(options, "it has a log, but no agentlog server is running on it") from None


async def connect(options: ConnectionOptions, role: Role, name: str) -> tuple[JetStreamEventStore, SharedServer | None]:
    """A connected store and, in embedded mode, this process's share of the data dir's server
    (`aclose()` it after closing the store)."""
    shared: SharedServer | None = None
    login: Login = {}
    if options.embedded:
        shared = await acquire_embedded(options)
        log.debug("embedded nats-server", data_dir=str(shared.data_dir), url=shared.url, owner=shared.owner,
                  role=role)
        servers, login = [shared.url], shared.credentials.login(role)
    else:
        servers = options.servers()
    try:
        log.debug("connecting", servers=servers)
        store = await JetStreamEventStore.connect(
            servers, creds=options.creds, token=options.token, name=name,
            connect_timeout=options.timeout, request_timeout=options.timeout, replicas=options.replicas,
            # readonly may not touch stream config; the server's starter has set the streams up
            setup_stream=not (shared is not None and role == "readonly"), **login)
    except BaseException:
        if shared is not None:
            await shared.aclose()
        raise
    return store, shared


@asynccontextmanager
async def open_store(options: ConnectionOptions, role: Role = "readonly") -> AsyncIterator[JetStreamEventStore]:
    """Yield a connected `JetStreamEventStore`; close it (and leave the embedded server) on exit."""
    store, shared = await connect(options, role, "agentlog-cli")
    try:
        yield store
    finally:
        await store.close()
        if shared is not None:
            log.debug("leaving the embedded nats-server")
            await shared.aclose()


@asynccontextmanager
async def open_nats(options: ConnectionOptions, user: Role, password: str | None = None,
                    name: str = "agentlog-cli") -> AsyncIterator[NATS]:
    """A plain NATS connection (no store, no JetStream setup), for protocol-level clients of the
    API such as `agentlog nats req|sub`, logged in as `user`.

    On the data dir's embedded server the password is the data dir's generated one for `user`
    (`passwords.<user>` in its credentials.json) unless `password` is given; on a server named by
    URL, `user`/`password` are sent only when a password is given (otherwise the URL's own
    `user:password@`, `--creds` or `--token` log in). Inboxes use the `client` role's prefix, the
    only one that login may receive on, and within every other role's `_INBOX.>`.
    """
    shared: SharedServer | None = None
    login: Login = {}
    if options.embedded:
        shared = await acquire_embedded(options)
        servers = [shared.url]
        login = {"user": user, "password": password or shared.credentials.passwords[user]}
    else:
        servers = options.servers()
        if password is not None:
            login = {"user": user, "password": password}
    try:
        nc = await open_connection(servers, creds=options.creds, nkey_seed=None, token=options.token,
                                   tls=None, tls_hostname=None, name=name, connect_timeout=options.timeout,
                                   reconnect_wait=0.5, inbox_prefix=CLIENT_INBOX,
                                   user=login.get("user"), password=login.get("password"))
    except BaseException:
        if shared is not None:
            await shared.aclose()
        raise
    try:
        yield nc
    finally:
        # bounded: a command ended by Ctrl-C must exit even if the server stopped answering
        with contextlib.suppress(OSError, nats.errors.Error, TimeoutError):
            async with asyncio.timeout(options.timeout):
                await nc.close()
        if shared is not None:
            await shared.aclose()
