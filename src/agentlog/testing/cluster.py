"""A real JetStream cluster on loopback: N nats-server processes with routes between them.

For tests and the reliability benchmark of replication (R3 streams, a killed stream leader), and
as a ready dev helper. Each node is an `EmbeddedNatsServer` (its own data dir, client port and
ports-file readiness check) with a `cluster {}` block. Route ports are never picked for a node
that others then route to before it holds them: the first node starts alone (routed to itself,
which the server skips; JetStream wants a route configured), on a port picked for it and picked
again if that was taken in between; every other node listens on a port the server picks (`-1`)
and routes to the nodes already running, at the ports they reported in their ports files. The
routes the servers gossip join them all. `start_node` (re)starts one node the same way. The
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
#: Ports the first node tries for its route listener (each picked afresh) before giving up.
PORT_ATTEMPTS = 5


def _port_taken_in_log(node: EmbeddedNatsServer, listen: str) -> bool:
    """Did the node's last start fail because its route port `listen` (host:port) was taken?"""
    try:
        log = (node.data_dir / "nats-server.log").read_text(errors="replace")
    except OSError:
        return False
    return any("address already in use" in line and listen in line for line in log.splitlines()[-50:])


class LocalCluster:
    """`size` nodes named n1..nN under `base_dir` (one dir each), loopback only."""

    def __init__(self, base_dir: str | os.PathLike[str], size: int = 3, *, extra_config: list[str] | None = None,
                 login: tuple[str, str] | None = None) -> None:
        """`extra_config`: more config lines for every node (e.g. `include ./accounts.conf`, the
        file put in each node's dir `base_dir/n1`.. before `start`); `login`: the user and password
        `start` checks JetStream as, when that config requires one (a user allowed to create streams)."""
        self.base_dir = Path(base_dir)
        self.login = login
        self._extra_config = list(extra_config or [])
        self.nodes = [EmbeddedNatsServer(self.base_dir / f"n{i + 1}", server_name=f"n{i + 1}") for i in range(size)]
        #: By node name: the route URL its server reported when it last started (`start_node`).
        self._routes: dict[str, str] = {}

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
        """Start every node (the first alone, the others routed to it), then wait (bounded) until
        JetStream answers through the cluster."""
        first, *others = self.nodes
        await self.start_node(first.server_name, timeout)
        await asyncio.gather(*(self.start_node(node.server_name, timeout) for node in others))
        if self.login is None:
            await self.wait_jetstream(timeout)
        else:
            await self.wait_jetstream(timeout, user=self.login[0], password=self.login[1])

    async def start_node(self, server_name: str, timeout: float = 30.0) -> None:
        """Start one node (again, after a stop or a kill), routed to every node running (module doc)."""
        node = self.node(server_name)
        routes = [url for name, url in self._routes.items() if name != server_name and self.node(name).running]
        for _attempt in range(PORT_ATTEMPTS):
            if routes:
                listen = "127.0.0.1:-1"
            else:  # alone: a route to itself, on a port nobody else was told of yet
                listen = f"127.0.0.1:{free_port()}"
                routes = [f"nats-route://{listen}"]
            quoted = ", ".join(f'"{url}"' for url in routes)
            node.extra_config = [
                f'cluster {{ name: "{CLUSTER_NAME}", listen: "{listen}", routes: [{quoted}] }}',
                *self._extra_config,
            ]
            try:
                await node.astart(timeout)
                break
            except StoreUnavailable:
                if not listen.endswith(":-1") and _port_taken_in_log(node, listen):
                    routes = []
                    continue  # lost the picked route port to another process before the server bound it
                raise
        else:
            raise StoreUnavailable(f"nats-server {server_name}: no free route port in {PORT_ATTEMPTS} tries")
        reported = [url for url in node.listening("cluster") if url.startswith("nats://127.0.0.1:")]
        if not reported:
            raise StoreUnavailable(f"nats-server {server_name} reported no route listener on 127.0.0.1")
        self._routes[server_name] = "nats-route://" + reported[0].removeprefix("nats://")

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
