"""Replica counts of the streams and KV buckets agentlog creates (DESIGN 2.3 "replicas configurable").

The rule, in one place for the events stream, the command work queue and every KV bucket:

* a new stream is created with the replicas asked for (`--replicas` / `AGENTLOG_REPLICAS`), 1 when
  nothing was asked;
* an existing stream is *never* lowered: every agentlog process ensures its streams at start, and a
  process started with the default (or a lower number) must not silently turn an operator's R3
  back into R1 (that loses the redundancy without anybody noticing). What was kept is logged;
  lowering is an operator decision (`nats stream edit`);
* an existing stream is raised when a higher number is asked for explicitly.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from agentlog.eventlog.errors import StoreUnavailable
from agentlog.eventlog.jetstream.api import ERR_NO_SUITABLE_PEERS

T = TypeVar("T")

log = logging.getLogger(__name__)

#: Environment variable for the replica count when `--replicas` is not given.
REPLICAS_ENV = "AGENTLOG_REPLICAS"

#: How long a create is tried again while placement is refused, before the refusal stands.
PLACEMENT_WAIT = 15.0


class PlacementRefused(StoreUnavailable):
    """JetStream refused to create a stream because its meta leader counts fewer peers online than
    the replicas asked for (`ERR_NO_SUITABLE_PEERS`). A cluster says so for a while after a node
    (re)starts, and when a busy node misses heartbeats: the same create succeeds a moment later.
    Raised once that has lasted `PLACEMENT_WAIT`: a node is down or still joining; safe to retry
    once the cluster has its peers."""

    err_code = ERR_NO_SUITABLE_PEERS


async def placed(create: Callable[[], Awaitable[T]], what: str, timeout: float = PLACEMENT_WAIT) -> T:
    """`create()`, tried again with backoff while JetStream refuses placement (an error with
    `err_code` 10005: a `PlacementRefused`, or nats-py's `APIError`), for at most `timeout`
    seconds; any other outcome is returned or raised at once."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        try:
            return await create()
        except Exception as exc:
            refused = getattr(exc, "err_code", None) == ERR_NO_SUITABLE_PEERS
            if not refused or time.monotonic() + delay > deadline:
                raise
            log.info("%s: no suitable peers for placement yet (a node starting or busy): trying again", what)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)


def replicas_target(existing: int | None, requested: int | None) -> int | None:
    """The replica count to set, or None to leave the stream as it is.

    `existing` is None when the stream does not exist yet (create it); `requested` is None when
    nobody asked for a number."""
    if existing is None:
        return requested or 1
    if requested is not None and requested > existing:
        return requested
    return None


def log_kept(stream: str, existing: int, requested: int | None) -> None:
    """Say so when a lower replica count was asked for and the stream's own was kept."""
    if requested is not None and requested < existing:
        log.warning("stream %s keeps its %d replicas (asked for %d): agentlog never lowers replicas; "
                    "lower them on purpose with `nats stream edit`", stream, existing, requested)


async def raise_replicas(js: Any, stream: str, requested: int | None) -> int:
    """Raise an existing stream's replicas to `requested` when that is higher (nats-py
    JetStreamContext; used for the command stream and KV buckets). Returns the count in effect."""
    info = await js.stream_info(stream)
    existing = int(info.config.num_replicas or 1)
    target = replicas_target(existing, requested)
    if target is None:
        log_kept(stream, existing, requested)
        return existing
    info.config.num_replicas = target
    await js.update_stream(info.config)
    log.info("stream %s replicas raised from %d to %d", stream, existing, target)

    async def peers() -> tuple[bool, list[bool]]:
        cluster = (await js.stream_info(stream)).cluster
        return bool(cluster and cluster.leader), [bool(p.current) for p in (cluster.replicas or [])] if cluster else []

    await wait_replicated(stream, target, peers)
    return target


#: (has a leader, `current` of each follower) of a stream.
PeerState = Callable[[], Awaitable[tuple[bool, list[bool]]]]


async def wait_replicated(stream: str, target: int, peers: PeerState, timeout: float = 15.0) -> None:
    """After raising replicas, wait (bounded) until the stream has a leader and `target - 1`
    current followers: right after the update the new peers are still catching up, and the
    server refuses new consumers meanwhile ("insufficient resources"). Gives up with a warning."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leader, followers = await peers()
        if leader and len(followers) >= target - 1 and all(followers):
            return
        await asyncio.sleep(0.1)
    log.warning("stream %s: %d replicas not all current after %.0fs", stream, target, timeout)


__all__ = ["PLACEMENT_WAIT", "REPLICAS_ENV", "PeerState", "PlacementRefused", "log_kept", "placed",
           "raise_replicas", "replicas_target", "wait_replicated"]
