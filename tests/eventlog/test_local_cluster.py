"""`agentlog.testing.cluster.LocalCluster` on real nats-servers: no node is routed to a port the
node did not report holding, the first node's picked route port is picked again when another
process took it first, and a killed node (the first one included) started again rejoins."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from agentlog.eventlog.embedded.server import free_port
from agentlog.testing import cluster as cluster_module
from agentlog.testing.cluster import LocalCluster

pytestmark = pytest.mark.asyncio


def _port(route: str) -> int:
    return int(route.rpartition(":")[2])


async def test_the_first_nodes_route_port_is_picked_again_when_another_process_took_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        held = taken.getsockname()[1]
        picks = iter([held])
        monkeypatch.setattr(cluster_module, "free_port", lambda: next(picks, None) or free_port())
        async with LocalCluster(tmp_path / "cluster", 3) as cluster:  # start() places an R3 stream
            routes = {name: _port(url) for name, url in cluster._routes.items()}
            assert held not in routes.values()
            assert len(set(routes.values())) == 3, routes


@pytest.mark.early  # many seconds (the meta group takes the node back): started first (tests/conftest.py)
async def test_a_killed_node_started_again_rejoins_the_cluster(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path / "cluster", 3) as cluster:
        first = cluster.nodes[0]
        first.kill()
        await cluster.start_node(first.server_name)
        # a stream placed on every node: the restarted node is a peer again
        await cluster.wait_jetstream(timeout=30)
        config = (first.data_dir / "nats-server.conf").read_text()
        for other in cluster.nodes[1:]:
            assert cluster._routes[other.server_name] in config
