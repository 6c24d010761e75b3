"""Opening the NATS connection the store runs on, and the connection-level helpers.

`open_connection` bounds the first connect (nats-py would retry forever), fails a refused login
at once with `NotAuthorized`, and routes "permissions violation" errors to the store that owns the
connection (`DENIED_HOOKS`); `flush_subscriptions` makes a fresh SUB provably known to the
server. Split from the store (`agentlog.eventlog.jetstream.store`) because none of it is about the log.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import ssl
import weakref
from pathlib import Path
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client as NATS

from agentlog.eventlog.errors import NotAuthorized, StoreUnavailable
from agentlog.eventlog.jetstream.headers import LeanHeadersClient

log = logging.getLogger(__name__)


async def _quiet_error_cb(exc: Exception) -> None:
    """nats-py prints async errors to stderr by default; reconnect noise belongs in logs."""
    log.debug("nats: %s", exc)


#: Connection -> its store's handler of denied publishes (see `open_connection`'s error callback).
DENIED_HOOKS: weakref.WeakKeyDictionary[NATS, weakref.WeakMethod[Any]] = weakref.WeakKeyDictionary()
_DENIED = re.compile(r"permissions violation for publish to \W?([^\s\"']+)", re.I)


async def open_connection(
    servers: list[str],
    *,
    creds: str | os.PathLike[str] | None,
    nkey_seed: str | os.PathLike[str] | None,
    token: str | None,
    user: str | None,
    password: str | None,
    tls: ssl.SSLContext | None,
    tls_hostname: str | None,
    name: str,
    connect_timeout: float,
    reconnect_wait: float,
    inbox_prefix: str | None = None,
) -> NATS:
    """The bounded connect with typed login errors: the store's connection, and a plain one for
    callers without a store (`agentlog nats req|sub`)."""
    options: dict[str, Any] = {
        "servers": servers,
        "name": name,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": reconnect_wait,
        "connect_timeout": max(1, int(min(connect_timeout, 5))),
        "error_cb": _quiet_error_cb,
    }
    if creds is not None:
        options["user_credentials"] = str(creds)
    if nkey_seed is not None:
        seed = str(nkey_seed)
        options["nkeys_seed" if Path(seed).is_file() else "nkeys_seed_str"] = seed
    if token is not None:
        options["token"] = token
    if user is not None:
        options["user"] = user
    if password is not None:
        options["password"] = password
    if tls is not None:
        options["tls"] = tls
    if tls_hostname is not None:
        options["tls_hostname"] = tls_hostname
    if inbox_prefix is not None:
        options["inbox_prefix"] = inbox_prefix
    nc = LeanHeadersClient()
    # nats-py retries a refused login like a network error (forever, with max_reconnect_attempts
    # -1): notice the refusal in the error callback and fail at once with a typed error.
    refused: asyncio.Future[Exception] = asyncio.get_running_loop().create_future()

    async def error_cb(exc: Exception) -> None:
        await _quiet_error_cb(exc)
        if _AUTH_REFUSED.search(str(exc)) and not refused.done():
            refused.set_result(exc)
        denied = _DENIED.search(str(exc))
        hook = DENIED_HOOKS.get(nc)
        handler = hook() if hook is not None else None
        if denied and handler is not None:
            handler(denied.group(1))

    options["error_cb"] = error_cb
    connecting = asyncio.ensure_future(nc.connect(**options))
    try:
        # With max_reconnect_attempts=-1 nats-py retries the first connect forever: bound it.
        racing: set[asyncio.Future[Any]] = {connecting, refused}
        done, _ = await asyncio.wait(racing, timeout=connect_timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        if connecting in done:
            connecting.result()
        elif refused in done:
            raise NotAuthorized(f"NATS at {', '.join(servers)} refused the login: {refused.result()}; "
                                "give the credentials of a user allowed to connect (--creds, --token, or the "
                                "data dir's generated credentials)")
        else:
            raise TimeoutError()
    except (TimeoutError, OSError, nats.errors.Error, NotAuthorized) as exc:
        connecting.cancel()
        try:
            await nc.close()
        except Exception:  # noqa: BLE001
            pass
        if isinstance(exc, NotAuthorized):
            raise
        raise StoreUnavailable(
            f"cannot connect to NATS at {', '.join(servers)} within {connect_timeout:g}s: "
            f"{str(exc) or type(exc).__name__}"
        ) from None
    return nc

_AUTH_REFUSED = re.compile(r"authorization violation|authentication (expired|revoked)|user authentication", re.I)


async def flush_subscriptions(nc: NATS, timeout: float = 10.0) -> None:
    """Return once every subscription made so far on `nc` is known to the server.

    A single `nc.flush()` does not promise that: nats-py writes its PING straight to the socket,
    ahead of commands (such as a fresh SUB) still queued for its flusher task, so the PONG can
    come back before the SUB was sent, and a request from another connection in that window gets
    "no responders". The first flush lets the flusher write the queue; the second PING is then
    written after it, so its PONG proves the server has processed the SUB.
    """
    await nc.flush(timeout)  # type: ignore[arg-type]  # nats-py annotates int; it takes seconds as float
    await nc.flush(timeout)  # type: ignore[arg-type]
