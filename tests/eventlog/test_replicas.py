"""Replication on a real 3-node JetStream cluster on loopback.

* `--replicas` / `AGENTLOG_REPLICAS` create and raise the replicas of the events stream, the
  command work queue, its dead letters, the large-payload object store and the KV buckets (views,
  listing index, run snapshots, start claims, the projections' writer lease); nothing ever lowers them: a process started with the
  default (every CLI command ensures its streams) or with a lower number keeps the operator's R3.
* A create that JetStream refuses for want of peers online (err 10005: a node starting, or busy
  enough to miss heartbeats) is tried again for a while, then fails as `PlacementRefused`.
* Chaos: 200 runs through 2 worker processes while the events stream's leader is SIGKILLed: all
  finish, 0 commits lost, 0 duplicated (scripts/reliability_cluster.py does the work).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import nats.js.errors
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentlog.cli.assembly import ServerConfig, serve
from agentlog.eventlog.jetstream.payloads import PAYLOAD_BUCKET
from agentlog.eventlog.jetstream.replicas import PlacementRefused, placed, replicas_target
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.subjects import EVENTS_STREAM
from agentlog.gateway.operations.connection import ConnectionOptions, open_store
from agentlog.projections.kv import KVViewStore
from agentlog.projections.lease import WriterLease
from agentlog.runtime.snapshots.store import KVSnapshotStore
from agentlog.runtime.workers.claims import CLAIMS_BUCKET
from agentlog.runtime.workers.commands import (
    COMMANDS_STREAM,
    DLQ_STREAM,
    CommandClient,
    ensure_runtime_streams,
)
from agentlog.testing.cluster import LocalCluster

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import reliability_cluster

KV_STREAMS = ("KV_agentlog_projections", "KV_agentlog_threads", "KV_agentlog_runs", "KV_agentlog_index",
              "KV_agentlog_snapshots", "KV_agentlog_leases")
STREAMS = (EVENTS_STREAM, COMMANDS_STREAM, DLQ_STREAM, f"OBJ_{PAYLOAD_BUCKET}", f"KV_{CLAIMS_BUCKET}", *KV_STREAMS)


@given(st.one_of(st.none(), st.integers(1, 5)), st.one_of(st.none(), st.integers(1, 5)))
def test_replicas_are_created_as_asked_raised_when_asked_and_never_lowered(existing: int | None,
                                                                           requested: int | None) -> None:
    target = replicas_target(existing, requested)
    if existing is None:
        assert target == (requested or 1)
    else:
        assert target is None or target > existing
        assert (target is not None) == (requested is not None and requested > existing)


async def _replicas(nc: Any) -> dict[str, int]:
    js = nc.jetstream(timeout=5.0)
    return {name: (await js.stream_info(name)).config.num_replicas
            for name in STREAMS}


async def _ensure_all(replicas: int | None, cluster: LocalCluster) -> dict[str, int]:
    """What a process started with `replicas` does at start: events stream (connect), command
    stream, dead letters, payload bucket, KV buckets; returns the replicas in effect afterwards."""
    store = await JetStreamEventStore.connect(cluster.urls, replicas=replicas)
    try:
        await ensure_runtime_streams(store.nc.jetstream(timeout=5.0), replicas=replicas)
        await KVViewStore.open(store.nc, replicas=replicas)
        await KVSnapshotStore.open(store.nc, replicas=replicas)
        await WriterLease.open(store.nc, replicas=replicas)  # a gateway's
        return await _replicas(store.nc)
    finally:
        await store.close()


class _Creates:
    """A stream create answering with `outcomes` in turn (an exception is raised)."""

    def __init__(self, *outcomes: object) -> None:
        self.outcomes = list(outcomes)
        self.calls = 0

    async def __call__(self) -> object:
        self.calls += 1
        outcome = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


NO_PEERS_PY = nats.js.errors.APIError(code=500, err_code=10005, description="no suitable peers for placement")


@pytest.mark.parametrize("refusal", [PlacementRefused("stream create: no suitable peers"), NO_PEERS_PY])
async def test_a_create_refused_for_want_of_peers_is_tried_again_until_placed(refusal: Exception) -> None:
    create = _Creates(refusal, refusal, "created")
    assert await placed(create, "stream S") == "created"
    assert create.calls == 3


async def test_other_create_failures_are_not_tried_again() -> None:
    create = _Creates(nats.js.errors.APIError(code=400, err_code=10058, description="stream name in use"))
    with pytest.raises(nats.js.errors.APIError):
        await placed(create, "stream S")
    assert create.calls == 1


async def test_a_refusal_that_lasts_stands() -> None:
    create = _Creates(PlacementRefused("stream create: no suitable peers"))
    with pytest.raises(PlacementRefused):
        await placed(create, "stream S", timeout=0.3)
    assert create.calls > 1


@pytest.mark.early  # many seconds: started first (tests/conftest.py)
async def test_replicas_flag_raises_and_nothing_lowers_them(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with LocalCluster(tmp_path / "cluster", 3) as cluster:
        assert set((await _ensure_all(None, cluster)).values()) == {1}  # created with the default
        # `agentlog serve --replicas 3` (its assembly: gateway and worker parts) raises them all.
        async with serve(ServerConfig(role="serve", app_spec="agentlog.cli.demo:app", port=0, tokens="",
                                      connection=ConnectionOptions(nats_url=cluster.url, replicas=3))) as server:
            assert server.store is not None
            assert (await _replicas(server.store.nc)) == dict.fromkeys(STREAMS, 3)
        # A process with the default (any CLI command), and one asking for fewer, keep R3.
        assert set((await _ensure_all(None, cluster)).values()) == {3}
        with caplog.at_level(logging.WARNING, logger="agentlog.eventlog.jetstream.replicas"):
            assert set((await _ensure_all(1, cluster)).values()) == {3}
        kept = [r.getMessage() for r in caplog.records if "keeps its 3 replicas (asked for 1)" in r.getMessage()]
        assert len(kept) == len(STREAMS), kept  # each stream says what it kept
        async with open_store(ConnectionOptions(nats_url=cluster.url)) as store:  # the CLI's own path
            await CommandClient(store.nc).ensure_stream()
            await KVViewStore.open(store.nc)
            await WriterLease.open(store.nc)
            assert set((await _replicas(store.nc)).values()) == {3}


@pytest.mark.early  # many seconds: started first (tests/conftest.py)
async def test_cluster_survives_a_killed_stream_leader_without_losing_or_duplicating(tmp_path: Path) -> None:
    figures = await reliability_cluster.chaos(tmp_path, runs=200, threads=50, workers=2, timeout=100)
    assert figures["leader_killed"], figures
    # The whole stream was read back (so "lost" compared every acked commit with all of it).
    assert figures["commits"] == figures["stream_messages"] > 0 and figures["acked_commits"] > 0, figures
    assert (figures["finished"], figures["lost"], figures["duplicated"]) == (200, 0, 0), figures
    # Every run's log is whole (no call completed that never started) and it ended naturally.
    assert figures["broken_runs"] == 0, figures
