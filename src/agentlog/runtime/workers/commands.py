"""Commands for workers (DESIGN 4.5): what a client asks a worker to do, on a JetStream work queue.

    client = CommandClient(nc)
    await client.ensure_stream()
    ack = await client.submit(StartRun(thread_id="t1", run_id="r1", agent_id="calc",
                                       messages=[{"role": "user", "content": "hi"}]))

Commands are msgspec structs with a `type` tag, JSON on the wire. They go to the work-queue stream
`AGENTLOG_COMMANDS` on `agentlog.cmd.<app>.<thread_id>` (`agentlog.cmd.<thread_id>` for the
default app; one subject per app and thread, so a worker takes only its app's commands and can
see whether an earlier command of the same thread is still unacknowledged), with
`Nats-Msg-Id: <command_id>`: a resubmitted command is a no-op inside the duplicate window. The
client chooses `run_id` (and `command_id`), so it knows them before any worker runs anything.

Decisions and cancels are also published on core NATS `agentlog.ctl.<run_id>`, so the worker that
is driving the run sees them at once (a cancel mid-tool, a parallel_streaming decision) instead of
when the queued command reaches the head of its thread; so are queued messages once recorded
(the worker driving the run reads them at its next step boundary).
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import msgspec
from nats.aio.client import Client as NATS

from agentlog.eventlog.errors import AgentlogError, InvalidId
from agentlog.eventlog.ids import new_id, validate_id
from agentlog.eventlog.subjects import DEFAULT_APP, PREFIX, command_subject
from agentlog.runtime.inputs.frontend import InvalidFrontendTools, normalize_frontend_tools
from agentlog.runtime.inputs.request import RunRequest

COMMANDS_STREAM = "AGENTLOG_COMMANDS"
COMMANDS_SUBJECTS = f"{PREFIX}.cmd.>"
WORKER_CONSUMER = "agentlog-workers"

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


class InvalidCommand(AgentlogError, ValueError):
    """Bytes or fields that are not a valid command. Nothing was queued / nothing will run."""

    code = "invalid_command"


class _Base(msgspec.Struct, kw_only=True, tag_field="type", forbid_unknown_fields=True):
    #: Idempotency key (`Nats-Msg-Id`); generated when not given.
    command_id: str = msgspec.field(default_factory=new_id)
    thread_id: str


class StartRun(RunRequest, tag_field="type", tag="start", kw_only=True, omit_defaults=True,
               forbid_unknown_fields=True):
    """Start a run: a `RunRequest` with its thread and run ids chosen, as a gateway queues it
    (`StartRun.of`). The worker's runtime checks it again and records it (`Runtime.execute`)."""

    #: Idempotency key (`Nats-Msg-Id`); generated when not given.
    command_id: str = msgspec.field(default_factory=new_id)
    thread_id: str
    run_id: str = msgspec.field(default_factory=new_id)
    #: Offered by a gateway that may withdraw it (`agentlog.runtime.workers.claims`): a worker
    #: starts the run only once it has taken the offer, and acks the command unexecuted if the
    #: offer was withdrawn, replaced or is gone.
    offered: bool = False

    @classmethod
    def of(cls, request: RunRequest, thread_id: str, run_id: str, **command: Any) -> StartRun:
        """The command that starts `request` as run `run_id` on `thread_id` (a `ContinueRun`
        for a continuation); `command`: `command_id`, `offered`."""
        kind = ContinueRun if request.continues is not None else StartRun
        fields = {f: getattr(request, f) for f in RunRequest.__struct_fields__}
        return kind(**{**fields, "thread_id": thread_id, "run_id": run_id, **command})


class ContinueRun(StartRun, tag="continue", kw_only=True):
    """A continuation: a new run after `parent_run_id` (required) on the same thread. With
    `interrupt` the parent may still be running: the worker cancels it (reason `INTERRUPTED`)
    and starts this run once the parent has finished, "stop, then send" as one command, so the
    thread never has two active runs and a crash in between leaves the command to redo (a
    finished parent is not cancelled again, a started run is resumed)."""


#: The cancel reason an interrupting continuation records on the run it stops.
INTERRUPTED = "interrupted by a new message"


class Decide(_Base, tag="decide", kw_only=True):
    """Human decisions for suspended calls of `run_id` (idempotent on each `decision_id`)."""

    run_id: str
    decisions: list[dict[str, Any]]


class Cancel(_Base, tag="cancel", kw_only=True):
    run_id: str
    reason: str | None = None


class QueueMessages(_Base, tag="queue", kw_only=True):
    """User messages for run `run_id`, which is running (`agentlog.runtime.queued`): `steer` ones
    join its conversation at its next step boundary, `follow_up` ones when it would otherwise
    end. Each message carries its id (chosen by the client), so the effect is recognisable in
    the log and a redelivered command records nothing twice. Like a cancel it skips the
    thread's order (the run's own command holds the thread until the run ends)."""

    run_id: str
    messages: list[Any]
    mode: Literal["steer", "follow_up"] = "steer"


Command = StartRun | ContinueRun | Decide | Cancel | QueueMessages
CommandKind = Literal["start", "continue", "decide", "cancel", "queue"]

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Command)


def validate_command(cmd: Command) -> Command:
    """Check ids and required shapes; raises `InvalidCommand`."""
    try:
        validate_id(cmd.command_id, "command_id")
        validate_id(cmd.thread_id, "thread_id")
        validate_id(cmd.run_id, "run_id")
        if isinstance(cmd, StartRun):
            validate_id(cmd.agent_id, "agent_id")
            if cmd.parent_run_id is not None:
                validate_id(cmd.parent_run_id, "parent_run_id")
            if cmd.parent_thread_id is not None:
                validate_id(cmd.parent_thread_id, "parent_thread_id")
                if cmd.parent_run_id is None or cmd.decisions or isinstance(cmd, ContinueRun):
                    raise InvalidCommand("a sub-agent start (parent_thread_id) needs parent_run_id, no decisions")
            if isinstance(cmd, ContinueRun) and cmd.parent_run_id is None:
                raise InvalidCommand("a continue command needs parent_run_id")
            if cmd.decisions and cmd.parent_run_id is None:
                raise InvalidCommand("decisions on a start command need parent_run_id (the waiting run)")
            if cmd.interrupt and not isinstance(cmd, ContinueRun):
                raise InvalidCommand("only a continue command interrupts its parent")
            try:
                normalize_frontend_tools(cmd.frontend_tools)
            except InvalidFrontendTools as exc:
                raise InvalidCommand(str(exc)) from None
        if isinstance(cmd, QueueMessages) and not cmd.messages:
            raise InvalidCommand("a queue command needs at least one message")
        if isinstance(cmd, Decide) and not cmd.decisions:
            raise InvalidCommand("a decide command needs at least one decision")
    except InvalidId as exc:
        raise InvalidCommand(str(exc)) from None
    return cmd


class CommandTooLarge(AgentlogError):
    """A command over the server's max payload: it could never be queued (HTTP 413)."""

    code = "command_too_large"


def encode_command(cmd: Command) -> bytes:
    """Validate and encode; raises `InvalidCommand` for anything that cannot go on the wire
    (a lone surrogate in some string, a value that is not JSON), never anything else."""
    validate_command(cmd)
    try:
        return _encoder.encode(cmd)
    except (TypeError, UnicodeError, RecursionError, msgspec.EncodeError) as exc:
        raise InvalidCommand(f"the command cannot be encoded: {exc}") from None


def decode_command(data: bytes) -> Command:
    """Bytes -> a validated command; raises `InvalidCommand` (never anything else) on bad input."""
    try:
        cmd = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidCommand(f"invalid command: {exc}") from None
    return validate_command(cmd)


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
        ack = await self.js.publish(
            command_subject(cmd.thread_id, app_name or self.app_name), payload, headers={"Nats-Msg-Id": cmd.command_id}
        )
        live: tuple[str, bytes] | None = None
        if isinstance(cmd, (Decide, Cancel)):
            live = (cmd.run_id, payload)
        if live is not None:
            try:
                await self.nc.publish(control_subject(live[0]), live[1])
            except Exception:  # noqa: BLE001 - live delivery is a shortcut; the queue is the truth
                pass
        return Submitted(cmd.command_id, cmd.thread_id, cmd.run_id, ack.seq, bool(ack.duplicate))
