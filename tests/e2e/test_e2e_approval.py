"""One approval end to end, through the processes users run (`agentlog serve`, and `agentlog
gateway` + `agentlog worker`): `POST /v1/runs/{id}/inputs` -> the tool runs -> one model turn ->
the next call waits -> the run's SSE follow from `Last-Event-ID` ends.

- A decision does not read the run's log from its first commit: the gateway checks it on the run
  loaded from its snapshot and the log after it, the worker resumes it the same way, and the
  follow reads from the client's position (the run's first commits are never read again, so the
  cost does not grow with the run's history; scripts/bench_e2e.py measures it).
- Decide-then-follow, again and again: every follow ends at the next pause and, across follows,
  the client sees every event of the run once, in order.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import nats
import pytest

from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.runtime.snapshots.format import SNAPSHOT_BUCKET, decode_snapshot

from tests.support.topology import TOPOLOGIES, Deployment, deploy

#: A bound on one follow, not a sync: the run pauses again within milliseconds on a quiet machine.
FOLLOW_TIMEOUT = 30.0
PAUSES = ("RunSuspended", "RunFinished")


@pytest.fixture(scope="module", params=TOPOLOGIES)
def deployment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """One deployment per topology for the module (each test drives runs of its own)."""
    with deploy(request.param, tmp_path_factory.mktemp(request.param), app="tests.apps.approval_app:app") as running:
        yield running


def parse_sse(text: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(event id, event type, data) of every event frame (comments / heartbeats skipped)."""
    out = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(":"))
        if "id" in fields and "event" in fields:
            out.append((fields["id"], fields["event"], json.loads(fields["data"])))
    return out


class Cycler:
    """One run of `approval_app`'s `cycler`, driven over HTTP as a browser would."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http = http
        self.url = url
        self.run_id = self.thread_id = ""
        self.last_id: str | None = None
        self.call: str | None = None
        self.decisions = 0

    async def start(self) -> list[tuple[str, str, dict[str, Any]]]:
        async with self.http.post(f"{self.url}/v1/runs", json={"agent_id": "cycler", "messages": "go"}) as resp:
            assert resp.status == 202, await resp.text()
            accepted = await resp.json()
        self.run_id, self.thread_id = accepted["run_id"], accepted["thread_id"]
        return await self.follow()

    async def follow(self) -> list[tuple[str, str, dict[str, Any]]]:
        """The run's stream from the last event seen until it ends (bounded)."""
        headers = {"Last-Event-ID": self.last_id} if self.last_id else {}
        async with asyncio.timeout(FOLLOW_TIMEOUT):
            async with self.http.get(f"{self.url}/v1/runs/{self.run_id}/events", params={"follow": "true"},
                                     headers=headers) as resp:
                assert resp.status == 200, await resp.text()
                events = parse_sse(await resp.text())
        if events:
            self.last_id = events[-1][0]
        for _id, kind, data in events:
            if kind == "ToolCallSuspended":
                self.call = data["event"]["call_id"]
        return events

    async def decide(self) -> None:
        assert self.call is not None
        body = {"decisions": [{"target_id": self.call, "decision_id": f"d{self.decisions}", "action": "resume",
                               "result": {"ok": True}}]}
        self.call = None
        self.decisions += 1
        async with self.http.post(f"{self.url}/v1/runs/{self.run_id}/inputs", json=body) as resp:
            assert resp.status == 202, await resp.text()

    async def cycle(self) -> list[tuple[str, str, dict[str, Any]]]:
        await self.decide()
        return await self.follow()


async def wait_snapshot(nc: Any, run_id: str, after_seq: int) -> None:
    """Until the run's snapshot covers a commit past `after_seq` (watched, bounded)."""
    kv = await nc.jetstream().key_value(f"agentlog_{SNAPSHOT_BUCKET}")
    watcher = await kv.watch(run_id)
    try:
        async with asyncio.timeout(FOLLOW_TIMEOUT):
            while True:
                entry = await watcher.updates(timeout=FOLLOW_TIMEOUT)
                if entry is not None and entry.value:
                    snap = decode_snapshot(entry.value)
                    if snap is not None and snap.seq > after_seq:
                        return
    finally:
        await watcher.stop()


async def test_a_decision_does_not_read_the_run_from_its_first_commit(deployment: Deployment) -> None:
    """Every read of the log while one approval goes through (the gateway's check, the worker's
    resume, the follow from `Last-Event-ID`) starts after the run's first commits: reads the
    watch sees on the NATS server as batched Direct Gets."""
    nc = await nats.connect(deployment.nats_url)
    try:
        async with aiohttp.ClientSession() as http:
            run = Cycler(http, deployment.http_url)
            first = await run.start()
            start_seq = int(first[0][0].split(":")[0])
            for _ in range(3):
                events = await run.cycle()
            assert events[-1][1] in PAUSES
            # the worker's snapshot of this pause is written (in the background after it): none
            # is being replaced while the decision below is checked and resumed
            await wait_snapshot(nc, run.run_id, int(events[-1][0].split(":")[0]) - 1)

            reads: list[dict[str, Any]] = []

            async def on_request(msg: Any) -> None:
                try:
                    body = json.loads(msg.data)
                except ValueError:
                    return
                subject = body.get("next_by_subj") if isinstance(body, dict) else None
                if subject and (run.thread_id in subject or run.run_id in subject):
                    reads.append(body)

            sub = await nc.subscribe("$JS.API.DIRECT.GET.>", cb=on_request)
            await nc.flush()
            events = await run.cycle()
            await nc.flush()
            await sub.unsubscribe()
        assert events[-1][1] in PAUSES
        assert reads, "the approval read nothing of the run?"
        from_start = [r for r in reads if r["seq"] <= start_seq]
        assert not from_start, (from_start, start_seq, deployment.outputs()[-3000:])
    finally:
        await nc.close()


async def test_decide_then_follow_ends_every_time_and_sees_every_event_once(deployment: Deployment) -> None:
    """The follow is opened right after each 202, from the last event the client saw: it must
    end at the run's next pause (never hang) and, over all the follows, hand the client each of
    the run's events exactly once, in log order."""
    async with aiohttp.ClientSession() as http:
        run = Cycler(http, deployment.http_url)
        seen = await run.start()
        for _ in range(100):
            events = await run.cycle()
            assert events and events[-1][1] in PAUSES, events
            assert [kind for _id, kind, _d in events].count("RunSuspended") == 1, events
            seen += events
    store = await JetStreamEventStore.connect(deployment.nats_url)
    try:  # the run's events as the log has them (one SSE read of ~1,000 events would overflow its queue)
        everything = [str(position) async for stored in store.read_run(run.run_id)
                      for position, _event in stored.positioned()]
    finally:
        await store.close()
    assert [e[0] for e in seen] == everything
