"""A real JetStream cluster on loopback: N nats-server processes with routes between them.

For tests and the reliability benchmark of replication (R3 streams, a killed stream leader), and
as a ready dev helper. Each node is an `EmbeddedNatsServer` (its own data dir, client port and
ports-file readiness check) with a `cluster {}` block naming every other node as a route. The
cluster is usable once it can place a stream on every node (a meta leader is elected and counts
every peer online), which `start()` waits for.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import nats
import nats.errors

from agentlog.eventlog.embedded.server import EmbeddedNatsServer, free_port
from agentlog.eventlog.errors import StoreUnavailable

CLUSTER_NAME = "agentlog"


class LocalCluster:
    """`size` nodes named n1..nN under `base_dir` (one dir each), loopback only."""

    def __init__(self, base_dir: str | os.PathLike[str], size: int = 3, *, extra_config: list[str] | None = None,
                 login: tuple[str, str] | None = None) -> None:
        """`extra_config`: more config lines for every node (e.g. `include ./accounts.conf`, the
        file put in each node's dir `base_dir/n1`.. before `start`); `login`: the user and password
        `start` checks JetStream as, when that config requires one (a user allowed to create streams)."""
        self.base_dir = Path(base_dir)
        self.login = login
        route_ports = [free_port() for _ in range(size)]
        routes = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in route_ports)
        self.nodes = [
            EmbeddedNatsServer(
                self.base_dir / f"n{i + 1}", server_name=f"n{i + 1}",
                extra_config=[
                    f'cluster {{ name: "{CLUSTER_NAME}", listen: "127.0.0.1:{port}", routes: [{routes}] }}',
                    *(extra_config or []),
                ],
            )
            for i, port in enumerate(route_ports)
        ]

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    @property
    def url(self) -> str:
        """All client URLs, comma separated (the form `--nats` takes)."""
        return ",".join(self.urls)

    def node(self, server_name: str) -> EmbeddedNatsServer:
        for node in self.nodes:
            if node.server_name == server_name:
                return node
        raise KeyError(server_name)

    async def start(self, timeout: float = 30.0) -> None:
        """Start every node, then wait (bounded) until JetStream answers through the cluster."""
        await asyncio.gather(*(node.astart(timeout) for node in self.nodes))
        if self.login is None:
            await self.wait_jetstream(timeout)
        else:
            await self.wait_jetstream(timeout, user=self.login[0], password=self.login[1])

    async def wait_jetstream(self, timeout: float = 30.0, **connect: object) -> None:
        """Wait until the cluster can place a stream on every node: a meta leader answering
        `$JS.API.INFO` is not enough, as right after start the leader may still count a peer
        offline and refuse an R{size} stream ("no suitable peers for placement", err 10005)."""
        deadline = time.monotonic() + timeout
        nc = await nats.connect(self.urls, connect_timeout=2, **connect)
        try:
            while not await self._places_on_every_node(nc):
                if time.monotonic() > deadline:
                    raise StoreUnavailable(f"JetStream cluster at {self.url} not ready in {timeout}s")
                await asyncio.sleep(0.1)
        finally:
            await nc.close()

    async def _places_on_every_node(self, nc: nats.NATS) -> bool:
        """Create (then delete) a tiny in-memory stream with one replica per node."""
        probe = "_AGENTLOG_CLUSTER_PROBE"
        config = {"name": probe, "subjects": ["_agentlog.cluster.probe"], "storage": "memory",
                  "num_replicas": len(self.nodes), "max_msgs": 1}
        try:
            reply = await nc.request(f"$JS.API.STREAM.CREATE.{probe}", json.dumps(config).encode(), timeout=2.0)
            if "error" in json.loads(reply.data):
                return False
            await nc.request(f"$JS.API.STREAM.DELETE.{probe}", b"", timeout=2.0)
            return True
        except (TimeoutError, nats.errors.Error):
            return False

    async def stop(self) -> None:
        await asyncio.gather(*(node.astop() for node in self.nodes), return_exceptions=True)

    async def __aenter__(self) -> LocalCluster:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def stream_leader(nc: nats.NATS, stream: str, timeout: float = 10.0) -> str:
    """The server name of `stream`'s current cluster leader (waits, bounded, while none is elected)."""
    js = nc.jetstream(timeout=2.0)
    deadline = time.monotonic() + timeout
    while True:
        try:
            info = await js.stream_info(stream)
            if info.cluster is not None and info.cluster.leader:
                return info.cluster.leader
        except (TimeoutError, nats.errors.Error):
            pass
        if time.monotonic() > deadline:
            raise StoreUnavailable(f"stream {stream} has no leader after {timeout}s")
        await asyncio.sleep(0.1)


__all__ = ["CLUSTER_NAME", "LocalCluster", "stream_leader"]
