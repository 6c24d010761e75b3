"""A2A push notifications: a webhook config per task, delivered from the log through an outbox.

    configs   KV bucket `agentlog_a2a_push`, key = task (run) id -> the task's configs (JSON)
    scan      durable consumer on the event stream: each commit that changes a task's state
              (run started, suspended, resumed, finished) of a task with configs becomes one
              outbox message per config (the task as of that commit), then the commit is acked.
              It reads only while some task has a config (a watch of the bucket says so): a
              deployment that never uses push pays nothing per commit. It resumes at the oldest
              config's `since` (the log's last seq when the config was set), skipping the commits
              of the pause, which no config was set for
    outbox    stream `AGENTLOG_A2A_PUSH` (work queue), message id `<config>:<seq>` (a commit the
              scan sees twice is enqueued once)
    send      durable consumer on the outbox: POST the notification; a 2xx acks it, anything
              else naks it with a growing delay (retries), a gateway that dies mid-POST leaves it
              unacked and JetStream hands it to a gateway again after `ack_wait`

So delivery is at least once and survives restarts: neither the scan position nor an undelivered
notification lives in a process. Every gateway runs both consumers; JetStream shares the work.

A notification is the A2A `StreamResponse` JSON (`{"task": {...}}`) with headers
`X-A2A-Notification-Token` (the config's token, when it has one), `X-Agentlog-Signature:
sha256=<hex HMAC-SHA256 of the body keyed by that token>` and `X-Agentlog-Delivery` (the
outbox message id: the same for every retry, so a receiver can drop duplicates).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import os
from typing import Any

import aiohttp
import structlog
from nats.aio.client import Client as NATS

from agentlog.eventlog.cancel import cancel_wins
from agentlog.eventlog.codec import decode_commit
from agentlog.eventlog.events import RunFinished, RunResumed, RunStarted, RunSuspended
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.subjects import EVENTS_STREAM, EVENTS_SUBJECTS
from agentlog.projections.fold import fold_commits
from agentlog.projections.kvpipe import get_many

log = structlog.get_logger("agentlog.a2a.push")

BUCKET = "agentlog_a2a_push"
OUTBOX_STREAM = "AGENTLOG_A2A_PUSH"
OUTBOX_SUBJECT = "agentlog.a2apush"
SCAN_CONSUMER = "agentlog-a2a-push-scan"
SEND_CONSUMER = "agentlog-a2a-push-send"
#: Seconds a delivery may stay unacked before JetStream hands it out again (a dead gateway's).
ACK_WAIT_ENV = "AGENTLOG_A2A_PUSH_ACK_WAIT"
#: The most a scanned commit stays leased. The scan takes one commit at a time, so a gateway killed
#: with one in hand stalls every task's notifications for this long; a scan slower than this
#: enqueues twice, which the outbox's message ids drop.
SCAN_ACK_WAIT = 5.0
#: The events that change a task's state: only their commits are notified.
TRANSITIONS = (RunStarted, RunSuspended, RunResumed, RunFinished)
SIGNATURE_HEADER = "X-Agentlog-Signature"
DELIVERY_HEADER = "X-Agentlog-Delivery"
TOKEN_HEADER = "X-A2A-Notification-Token"


def signature(token: str, body: bytes) -> str:
    return "sha256=" + hmac.new(token.encode(), body, hashlib.sha256).hexdigest()


class PushConfigs:
    """The configs of each task, in a KV bucket (shared by every gateway)."""

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self._kv: Any = None

    async def kv(self) -> Any:
        if self._kv is None:
            from nats.js.errors import BucketNotFoundError

            js = self.nc.jetstream()
            try:
                self._kv = await js.key_value(BUCKET)
            except BucketNotFoundError:
                from nats.js.api import KeyValueConfig

                self._kv = await js.create_key_value(KeyValueConfig(bucket=BUCKET, history=1, direct=True))
        return self._kv

    async def get(self, task_id: str) -> list[dict[str, Any]]:
        """The task's configs ([] if none): a Direct Get where the bucket allows it (the scan
        asks for every state change of every task)."""
        from nats.js.errors import KeyNotFoundError

        kv = await self.kv()
        if kv._direct:
            (data,) = await get_many(self.nc, [(kv, task_id)])
        else:  # a bucket made before Direct Gets were asked for
            try:
                data = (await kv.get(task_id)).value
            except KeyNotFoundError:
                return []
        return _configs_of(data)[1]

    async def put(self, task_id: str, configs: list[dict[str, Any]]) -> None:
        """Set the task's configs, with `since`: the log's last seq now (the scan of a gateway
        that was not reading resumes after it, see `PushDelivery`)."""
        since = (await self.nc.jetstream().stream_info(EVENTS_STREAM)).state.last_seq if configs else 0
        await (await self.kv()).put(task_id, json.dumps({"since": since, "configs": configs}).encode())

    async def oldest_since(self) -> int | None:
        """The smallest `since` of the tasks that have configs, read from the bucket now; None if
        no task has one."""
        from nats.js.errors import KeyNotFoundError, NoKeysError

        kv = await self.kv()
        try:
            keys = await kv.keys()
        except NoKeysError:
            return None
        found: list[int] = []
        for key in keys:
            try:
                since, configs = _configs_of((await kv.get(key)).value)
            except KeyNotFoundError:  # deleted since it was listed
                continue
            if configs:
                found.append(since)
        return min(found) if found else None


def _configs_of(value: bytes | None) -> tuple[int, list[dict[str, Any]]]:
    """(since, configs) of a bucket entry (a bare list: since 0)."""
    if not value:
        return 0, []
    data = json.loads(value)
    if isinstance(data, list):
        return 0, data
    return int(data.get("since") or 0), list(data.get("configs") or [])


class PushDelivery:
    """The scan and send consumers of one gateway process (`start()` / `stop()`)."""

    def __init__(self, store: JetStreamEventStore, configs: PushConfigs) -> None:
        self.store = store
        self.configs = configs
        self.ack_wait = float(os.environ.get(ACK_WAIT_ENV) or 30.0)
        self._tasks: list[asyncio.Task[None]] = []
        self._subs: list[Any] = []
        self._stopping = False
        self._http: aiohttp.ClientSession | None = None
        #: Set while some task has configs (the bucket's watch says so, or the watch failed):
        #: the scan reads only then.
        self._wanted = asyncio.Event()
        #: Whether the scan has not read since it started or last paused.
        self._paused = True

    async def start(self) -> None:
        from nats.js.api import ConsumerConfig, DeliverPolicy, RetentionPolicy, StreamConfig
        from nats.js.errors import NotFoundError

        js = self.store.nc.jetstream()
        try:
            await js.stream_info(OUTBOX_STREAM)
        except NotFoundError:
            await js.add_stream(StreamConfig(name=OUTBOX_STREAM, subjects=[f"{OUTBOX_SUBJECT}.>"],
                                             retention=RetentionPolicy.WORK_QUEUE, duplicate_window=600))
        # the scan starts at the log's head when first created (no config can predate it) and
        # then resumes where it was acked, across restarts (or, after a pause, see `_resume_scan`)
        scan = await js.pull_subscribe(EVENTS_SUBJECTS, durable=SCAN_CONSUMER, stream=EVENTS_STREAM,
                                       config=self._scan_config(DeliverPolicy.NEW))
        send = await js.pull_subscribe(f"{OUTBOX_SUBJECT}.>", durable=SEND_CONSUMER, stream=OUTBOX_STREAM,
                                       config=ConsumerConfig(ack_wait=self.ack_wait, max_deliver=-1))
        self._http = aiohttp.ClientSession()
        self._stopping = False
        self._subs = [scan, send]
        self._wanted.clear()
        self._paused = True
        self._tasks = [asyncio.create_task(self._watch_configs(), name="a2a-push-watch"),
                       asyncio.create_task(self._loop(scan, self._scan, self._scan_gate), name="a2a-push-scan"),
                       asyncio.create_task(self._loop(send, self._send), name="a2a-push-send")]

    def _scan_config(self, policy: Any, start: int | None = None) -> Any:
        from nats.js.api import ConsumerConfig

        return ConsumerConfig(durable_name=SCAN_CONSUMER, deliver_policy=policy, opt_start_seq=start,
                              filter_subject=EVENTS_SUBJECTS, ack_wait=min(self.ack_wait, SCAN_ACK_WAIT),
                              max_ack_pending=1)

    async def _watch_configs(self) -> None:
        """Keep `_wanted` set while some task has configs. If the watch fails, the scan reads
        (as if some had): it never misses a commit for want of knowing."""
        while not self._stopping:
            live: set[str] = set()
            watcher = None
            try:
                kv = await cancel_wins(self.configs.kv())
                watcher = await cancel_wins(kv.watchall())
                while not self._stopping:
                    entry = await cancel_wins(watcher.updates(timeout=None))
                    if entry is None:  # the bucket's current entries are all in
                        continue
                    if entry.operation is None and _configs_of(entry.value)[1]:
                        live.add(entry.key)
                    else:
                        live.discard(entry.key)
                    if live:
                        self._wanted.set()
                    else:
                        self._wanted.clear()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - NATS away: scan meanwhile, watch again
                log.warning("a2a.push.watch_failed", error=str(exc))
                self._wanted.set()
                await asyncio.sleep(1)  # retry pacing, not synchronisation
            finally:
                if watcher is not None:
                    with contextlib.suppress(Exception):
                        await watcher.stop()

    async def _scan_gate(self) -> None:
        """Before each fetch of the scan: wait while no task has configs; when reading again
        after that, first skip what no config was set for (`_resume_scan`)."""
        if not self._wanted.is_set():
            self._paused = True
            await self._wanted.wait()
        if self._paused:
            await self._resume_scan()
            self._paused = False

    async def _resume_scan(self) -> None:
        """Move the scan consumer on to after the oldest config's `since` (read from the bucket
        now, so a config set meanwhile counts) if it is behind that: the commits in between were
        made before any config there is now was set. A consumer that is not behind keeps its
        place (the commits after it may be due to a config: a gateway was down, say). Another
        gateway doing the same at once may scan a few commits twice: the outbox drops the
        second enqueue."""
        from nats.js.api import DeliverPolicy
        from nats.js.errors import NotFoundError

        since = await self.configs.oldest_since()
        if since is None:
            return
        js = self.store.nc.jetstream()
        try:
            info = await js.consumer_info(EVENTS_STREAM, SCAN_CONSUMER)
            if info.ack_floor is not None and (info.ack_floor.stream_seq or 0) >= since:
                return
            await js.delete_consumer(EVENTS_STREAM, SCAN_CONSUMER)
        except NotFoundError:
            pass
        with contextlib.suppress(Exception):  # made by another gateway meanwhile: its start is as good
            await js.add_consumer(EVENTS_STREAM, self._scan_config(DeliverPolicy.BY_START_SEQUENCE, since + 1))

    async def stop(self) -> None:
        """Stop the loops and wait for them. A cancel can be lost in any nats-py call that waits
        (see `agentlog.eventlog.cancel`; the fetch and the watch's waits are awaited through
        `cancel_wins`, the KV read, the publish and the ack are not), and a loop that lost it went
        on, so a gateway's shutdown waited forever: each loop also checks `_stopping` before every
        wait, gives back what it fetched after the stop, and is cancelled again until it has
        ended."""
        self._stopping = True
        tasks, self._tasks = self._tasks, []
        while pending := [task for task in tasks if not task.done()]:
            for task in pending:
                task.cancel()
            await asyncio.wait(pending, timeout=0.5)  # a cancel lost meanwhile: cancel again
        await asyncio.gather(*tasks, return_exceptions=True)
        for sub in self._subs:  # no more deliveries to this process's inboxes
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs = []
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _loop(self, sub: Any, handle: Any, gate: Any = None) -> None:
        from nats.errors import TimeoutError as NatsTimeout

        while not self._stopping:
            try:
                if gate is not None:
                    await gate()
                msgs = await cancel_wins(sub.fetch(1, timeout=5))
            except (TimeoutError, NatsTimeout):
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - NATS away: try again, the consumer keeps its place
                log.warning("a2a.push.fetch_failed", error=str(exc))
                await asyncio.sleep(1)
                continue
            for msg in msgs:
                if self._stopping:  # another gateway takes it now, not after `ack_wait`
                    with contextlib.suppress(Exception):
                        await msg.nak()
                else:
                    await handle(msg)

    async def _scan(self, msg: Any) -> None:
        try:
            commit = decode_commit(msg.data)
            run_id = commit.run_id
            if run_id and any(isinstance(ev, TRANSITIONS) for ev in commit.events):
                configs = await self.configs.get(run_id)
                if configs:
                    await self._enqueue(run_id, msg.metadata.sequence.stream, configs)
            await msg.ack()
        except Exception as exc:  # noqa: BLE001 - the commit is seen again (nak), nothing is lost
            log.warning("a2a.push.scan_failed", error=str(exc))
            await msg.nak(delay=1)

    async def _enqueue(self, run_id: str, seq: int, configs: list[dict[str, Any]]) -> None:
        from google.protobuf.json_format import MessageToDict

        from agentlog.gateway.adapters.a2a.mapping import (
            run_task,  # the SDK's types: imported once a task has a push config
        )

        commits = [sc async for sc in self.store.read_run(run_id) if sc.seq <= seq]
        view = fold_commits(commits).runs.get(run_id)
        if view is None:
            return
        task = MessageToDict(run_task(view, commits))
        js = self.store.nc.jetstream()
        for config in configs:
            delivery = f"{config['id']}:{seq}"
            body = json.dumps({"url": config["url"], "token": config.get("token") or "", "delivery": delivery,
                               "notification": {"task": task}}).encode()
            await js.publish(f"{OUTBOX_SUBJECT}.{run_id}", body, headers={"Nats-Msg-Id": delivery})

    async def _send(self, msg: Any) -> None:
        item = json.loads(msg.data)
        body = json.dumps(item["notification"]).encode()
        headers = {"Content-Type": "application/json", DELIVERY_HEADER: item["delivery"]}
        if item["token"]:
            headers[TOKEN_HEADER] = item["token"]
            headers[SIGNATURE_HEADER] = signature(item["token"], body)
        assert self._http is not None
        try:
            async with self._http.post(item["url"], data=body, headers=headers,
                                       timeout=aiohttp.ClientTimeout(total=30)) as resp:
                ok = 200 <= resp.status < 300
        except Exception as exc:  # noqa: BLE001 - any failure is a retry
            log.info("a2a.push.delivery_failed", delivery=item["delivery"], error=str(exc))
            ok = False
        if ok:
            await msg.ack()
        else:
            attempt = msg.metadata.num_delivered or 1
            with contextlib.suppress(Exception):
                await msg.nak(delay=min(0.5 * 2 ** (attempt - 1), 60.0))


__all__ = ["ACK_WAIT_ENV", "DELIVERY_HEADER", "SCAN_ACK_WAIT", "SIGNATURE_HEADER", "TOKEN_HEADER", "PushConfigs", "PushDelivery",
           "signature"]
