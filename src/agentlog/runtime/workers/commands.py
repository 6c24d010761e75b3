"""The command queue (DESIGN 4.5): commands (`agentlog.runtime.inputs.commands`) on a JetStream work
queue, for workers to take.

    client = CommandClient(nc)
    await client.ensure_stream()
    ack = await client.submit(StartRun(thread_id="t1", run_id="r1", agent_id="calc",
                                       messages=[{"role": "user", "content": "hi"}]))

Commands go to the work-queue stream
`AGENTLOG_COMMANDS` on `agentlog.cmd.<app>.<thread_id>` (`agentlog.cmd.<thread_id>` for the
default app; one subject per app and thread, so a worker takes only its app's commands and can
see whether an earlier command of the same thread is still unacknowledged), with
`Nats-Msg-Id: <command_id>`: a resubmitted command is a no-op inside the duplicate window. The
client chooses `run_id` (and `command_id`), so it knows them before any worker runs anything.

A start, continue or decide is published with `Nats-Expected-Last-Subject-Sequence`
(`PREDECESSOR`): the queue seq of the command it must come right after, which the server checks
against the last command of the thread still queued before it stores it. `0` (`ALONE`): no other
command of the thread is queued, so none is ahead of it, and a worker runs it without asking the
queue (the order check, a request otherwise). `N`: the command right ahead of it is the one at
seq `N`, so a worker that carried that one out itself (and had its ack confirmed) knows that
nothing of the thread is ahead any more, and does not ask either. A publish the server refuses
(another command is last) is tried once more with the seq the refusal names, then published
without the header. The first command a client sends on a thread expects `0`; one sent within
`RECENT` seconds of a refusal on the thread (a burst: commands queued back to back) expects the
seq of the client's own last command there, which is then usually right at once.

Decisions and cancels are also published on core NATS `agentlog.ctl.<run_id>`, so the worker that
is driving the run sees them at once (a cancel mid-tool, a parallel_streaming decision) instead of
when the queued command reaches the head of its thread; so are queued messages once recorded
(the worker driving the run reads them at its next step boundary).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any, NamedTuple

from nats.aio.client import Client as NATS
from nats.js.errors import BadRequestError

from agentlog.eventlog.errors import AgentlogError, InvalidId
from agentlog.eventlog.ids import validate_id
from agentlog.eventlog.jetstream.api import ERR_WRONG_LAST_SEQUENCE, WRONG_LAST_RE
from agentlog.eventlog.subjects import DEFAULT_APP, PREFIX, command_subject
from agentlog.runtime.inputs.commands import Cancel, Command, ContinueRun, Decide, StartRun, encode_command

COMMANDS_STREAM = "AGENTLOG_COMMANDS"
COMMANDS_SUBJECTS = f"{PREFIX}.cmd.>"
WORKER_CONSUMER = "agentlog-workers"

#: The header naming the queue seq of the command of the thread a command comes right after,
#: checked by the server (module doc); with `0`, the command was stored alone (`ALONE`).
PREDECESSOR = "Nats-Expected-Last-Subject-Sequence"
ALONE = (PREDECESSOR, "0")
#: Seconds after a refused publish on a thread during which a client expects its own last
#: command of the thread ahead of the next one (module doc); the threads it remembers.
RECENT = 1.0
RECENT_THREADS = 10_000

#: Dead letters: commands a worker gave up on, on `agentlog.dlq.<thread_id>` (`_` when the
#: command could not even be read), kept in this stream (limits retention, `DLQ_MAX_AGE`). The
#: payload is the command as queued; the headers say why (`DLQ_*` below).
DLQ_STREAM = "AGENTLOG_DLQ"
DLQ_SUBJECTS = f"{PREFIX}.dlq.>"
DLQ_MAX_AGE = 30 * 24 * 3600.0
DLQ_CODE = "Agentlog-Error-Code"
DLQ_ERROR = "Agentlog-Error"
DLQ_COMMAND_ID = "Agentlog-Command-Id"
DLQ_RUN_ID = "Agentlog-Run-Id"
DLQ_DELIVERIES = "Agentlog-Deliveries"
DLQ_QUEUE_SEQ = "Agentlog-Queue-Seq"


def dlq_subject(thread_id: str | None) -> str:
    return f"{PREFIX}.dlq.{thread_id or '_'}"


def control_subject(run_id: str) -> str:
    """Core NATS (not persisted): live decisions and cancels for the worker driving `run_id`."""
    return f"{PREFIX}.ctl.{run_id}"


def validate_app_name(name: object) -> str:
    """An app name is one subject token, like an id (`[A-Za-z0-9_-]`, at most 128)."""
    try:
        return validate_id(name, "app name")
    except InvalidId as exc:
        raise ValueError(f"{exc} (an app name is letters, digits, '_' and '-')") from None


def worker_consumer(app: str | None = None) -> str:
    """The durable consumer the workers of `app` share."""
    return WORKER_CONSUMER if app is None or app == DEFAULT_APP else f"{WORKER_CONSUMER}-{app}"


class CommandTooLarge(AgentlogError):
    """A command over the server's max payload: it could never be queued (HTTP 413)."""

    code = "command_too_large"


# == the stream ===================================================================================


def commands_stream_config(*, replicas: int | None = None, duplicate_window: float = 120.0) -> Any:
    from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

    return StreamConfig(
        name=COMMANDS_STREAM,
        subjects=[COMMANDS_SUBJECTS],
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE,
        num_replicas=replicas or 1,
        duplicate_window=duplicate_window,
        discard=DiscardPolicy.OLD,
        description="agentlog worker commands (work queue; one subject per thread)",
    )


async def ensure_commands_stream(js: Any, *, replicas: int | None = None, duplicate_window: float = 120.0) -> None:
    """Create `AGENTLOG_COMMANDS` if missing (see `_ensure_stream`)."""
    await _ensure_stream(js, commands_stream_config(replicas=replicas, duplicate_window=duplicate_window), replicas)


async def ensure_dlq_stream(js: Any, *, replicas: int | None = None) -> None:
    """Create `AGENTLOG_DLQ` if missing (see `_ensure_stream`)."""
    from nats.js.api import RetentionPolicy, StorageType, StreamConfig

    await _ensure_stream(js, StreamConfig(
        name=DLQ_STREAM, subjects=[DLQ_SUBJECTS], retention=RetentionPolicy.LIMITS, storage=StorageType.FILE,
        num_replicas=replicas or 1, max_age=DLQ_MAX_AGE, duplicate_window=120.0,
        description="agentlog dead letters: worker commands given up on (headers say why)"), replicas)


async def ensure_runtime_streams(js: Any, *, replicas: int | None = None) -> None:
    """The streams the runtime writes besides the events stream and the KV views: the command
    work queue, its dead letters, the large-payload object store and the start claims, each created with
    `replicas` or raised to it (never lowered). Called at start by a process given `--replicas`
    (else each is created at R1 where it is first used), so none is left on one node."""
    from agentlog.eventlog.jetstream.payloads import ensure_payload_bucket
    from agentlog.runtime.workers.claims import ensure_claims_bucket

    await ensure_commands_stream(js, replicas=replicas)
    await ensure_dlq_stream(js, replicas=replicas)
    await ensure_payload_bucket(js, replicas=replicas)
    await ensure_claims_bucket(js, replicas=replicas)


async def _ensure_stream(js: Any, config: Any, replicas: int | None) -> None:
    """Create the stream if missing (idempotent; safe when many processes race). An existing
    stream keeps its config, except that its replicas are raised when more are asked for (never
    lowered: `agentlog.eventlog.jetstream.replicas`)."""
    from nats.js.errors import BadRequestError, NotFoundError

    from agentlog.eventlog.jetstream.replicas import placed, raise_replicas

    try:
        await raise_replicas(js, config.name, replicas)
        return
    except NotFoundError:
        pass
    try:
        await placed(lambda: js.add_stream(config), f"stream {config.name}")
    except BadRequestError:
        await js.stream_info(config.name)  # another process created it first


class Submitted(NamedTuple):
    """Answer of `CommandClient.submit`: the ids the submitter needs, and the queue position."""

    command_id: str
    thread_id: str
    run_id: str
    seq: int
    duplicate: bool


class CommandClient:
    """Publishes commands to the work queue with dedup (`Nats-Msg-Id`), and decisions/cancels
    also live on `agentlog.ctl.<run_id>`. Commands go to the workers of `app_name` (default:
    the default app's), or of the app `submit` is given."""

    def __init__(self, nc: NATS, *, timeout: float = 5.0, app_name: str | None = None) -> None:
        self.nc = nc
        self.app_name = validate_app_name(app_name) if app_name is not None else DEFAULT_APP
        self.js = nc.jetstream(timeout=timeout)
        self._ensured = False
        #: By command subject with a publish refused in the last `RECENT` s: when (monotonic),
        #: and the queue seq of this client's last command there (module doc).
        self._bursts: OrderedDict[str, tuple[float, int]] = OrderedDict()

    async def ensure_stream(self) -> None:
        if not self._ensured:
            await ensure_commands_stream(self.js)
            self._ensured = True

    def check(self, cmd: Command) -> bytes:
        """The command's bytes, if it can be queued: `InvalidCommand` or `CommandTooLarge`
        otherwise. Callers check before their first write (the gateway creates threads)."""
        payload = encode_command(cmd)
        limit = getattr(self.nc, "max_payload", None)
        size = len(payload) + len(cmd.command_id) + 64  # + the Nats-Msg-Id header
        if isinstance(limit, int) and size > limit:
            raise CommandTooLarge(f"the command is {size} bytes, over the server's max payload of {limit}")
        return payload

    async def submit(self, cmd: Command, *, app_name: str | None = None) -> Submitted:
        """Queue `cmd` for the workers of `app_name` (default: this client's app)."""
        payload = self.check(cmd)
        await self.ensure_stream()
        subject = command_subject(cmd.thread_id, app_name or self.app_name)
        headers = {"Nats-Msg-Id": cmd.command_id}
        ack = None
        if isinstance(cmd, (StartRun, ContinueRun, Decide)):
            ack = await self._publish_in_order(subject, payload, headers)
        if ack is None:
            ack = await self.js.publish(subject, payload, headers=headers)
        if subject in self._bursts:
            self._bursts[subject] = (self._bursts[subject][0], ack.seq)
        live: tuple[str, bytes] | None = None
        if isinstance(cmd, (Decide, Cancel)):
            live = (cmd.run_id, payload)
        if live is not None:
            try:
                await self.nc.publish(control_subject(live[0]), live[1])
            except Exception:  # noqa: BLE001 - live delivery is a shortcut; the queue is the truth
                pass
        return Submitted(cmd.command_id, cmd.thread_id, cmd.run_id, ack.seq, bool(ack.duplicate))

    async def _publish_in_order(self, subject: str, payload: bytes, headers: dict[str, str]) -> Any:
        """Publish with `PREDECESSOR` (module doc): the ack, or None if the server refused it twice."""
        burst = self._bursts.get(subject)
        expected = burst[1] if burst is not None and time.monotonic() - burst[0] < RECENT else 0
        for _attempt in range(2):
            try:
                return await self.js.publish(subject, payload, headers={**headers, PREDECESSOR: str(expected)})
            except BadRequestError as exc:
                if exc.err_code != ERR_WRONG_LAST_SEQUENCE:
                    raise
                last = WRONG_LAST_RE.search(exc.description or "")
                self._bursts[subject] = (time.monotonic(), 0)
                self._bursts.move_to_end(subject)
                if len(self._bursts) > RECENT_THREADS:
                    self._bursts.popitem(last=False)
                if last is None or int(last.group(1)) == expected:
                    return None
                expected = int(last.group(1))  # the command of the thread queued last, as the server saw it
        return None
