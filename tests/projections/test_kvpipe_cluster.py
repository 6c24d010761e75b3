"""Fenced (chained) KV writes on a 3-node cluster (`agentlog.projections.kvpipe`): each put of a
chain expects the put before it as its stream's last message while that one may still be in
flight, through a node that is not the stream's leader; the leader must take every chain whole."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import pytest
from nats.js.api import KeyValueConfig

from agentlog.projections.kvpipe import WriteFence, get_many, put_many
from agentlog.testing.cluster import LocalCluster, stream_leader


@pytest.mark.early  # a cluster: started first (tests/conftest.py)
async def test_chained_writes_through_a_follower_land_whole_on_a_replicated_bucket(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path / "cluster", 3) as cluster:
        nc = await nats.connect(cluster.urls)
        try:
            async with asyncio.timeout(60):
                kv = await nc.jetstream().create_key_value(KeyValueConfig(bucket="chain", history=1, direct=True,
                                                                          replicas=3))
                leader = await stream_leader(nc, "KV_chain")
                follower = next(node.url for node in cluster.nodes if node.server_name != leader)
                via = await nats.connect(follower)
                try:
                    fence = WriteFence()
                    for i in range(200):
                        await put_many(via, [(kv, f"k{j}", f"{i}".encode()) for j in range(1 + i % 20)], fence=fence)
                    assert await get_many(via, [(kv, f"k{j}") for j in range(20)]) == [b"199"] * 20  # the last, 20 puts
                finally:
                    await via.close()
        finally:
            await nc.close()
