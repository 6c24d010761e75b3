"""Commands for workers (DESIGN 4.5): what a client asks a worker to do, on a JetStream work queue.

    client = CommandClient(nc)
    await client.ensure_stream()
    ack = await client.submit(StartRun(thread_id="t1", run_id="r1", agent_id="calc",
                                       messages=[{"role": "user", "content": "hi"}]))

Commands are msgspec structs with a `type` tag, JSON on the wire. They go to the work-queue stream
`AGENTLOG_COMMANDS` on `agentlog.cmd.<thread_id>` (one subject per thread, so a worker can see
whether an earlier command of the same thread is still unacknowledged), with
`Nats-Msg-Id: <command_id>`: a resubmitted command is a no-op inside the duplicate window. The
client chooses `run_id` (and `command_id`), so it knows them before any worker runs anything.

Decisions and cancels are also published on core NATS `agentlog.ctl.<run_id>`, so the worker that
is driving the run sees them at once (a cancel mid-tool, a parallel_streaming decision) instead of
when the queued command reaches the head of its thread.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import msgspec

from eventlog.errors import AgentlogError, InvalidId
from eventlog.ids import new_id, validate_id
from eventlog.subjects import PREFIX, command_subject

from .frontend import InvalidFrontendTools, normalize_frontend_tools

COMMANDS_STREAM = "AGENTLOG_COMMANDS"
COMMANDS_SUBJECTS = f"{PREFIX}.cmd.>"
WORKER_CONSUMER = "agentlog-workers"


def control_subject(run_id: str) -> str:
    """Core NATS (not persisted): live decisions and cancels for the worker driving `run_id`."""
    return f"{PREFIX}.ctl.{run_id}"


class InvalidCommand(AgentlogError, ValueError):
    """Bytes or fields that are not a valid command. Nothing was queued / nothing will run."""

    code = "invalid_command"


class _Base(msgspec.Struct, kw_only=True, tag_field="type", forbid_unknown_fields=True):
    #: Idempotency key (`Nats-Msg-Id`); generated when not given.
    command_id: str = msgspec.field(default_factory=new_id)
    thread_id: str


class StartRun(_Base, tag="start", kw_only=True, omit_defaults=True):
    """Start run `run_id` of `agent_id` on `thread_id` with `messages` (str or role/content dicts).
    With `parent_run_id` it is a continuation; `decisions` then go to the waiting parent first.
    `frontend_tools`: the run's client-executed tools (`{name, description, parameters}`, see
    `runtime.frontend`), recorded by the worker's `Runtime.start`. Defaults are omitted on the
    wire, so a command without frontend tools is still readable by workers that predate them."""

    run_id: str = msgspec.field(default_factory=new_id)
    agent_id: str
    messages: list[Any] = msgspec.field(default_factory=list)
    parent_run_id: str | None = None
    decisions: list[dict[str, Any]] = msgspec.field(default_factory=list)
    origin: str = "user"
    frontend_tools: list[dict[str, Any]] = msgspec.field(default_factory=list)
    #: A sub-agent run (`runtime.subagents`): the parent's thread (with `parent_run_id`), and
    #: the new child thread's metadata.
    parent_thread_id: str | None = None
    thread_metadata: dict[str, Any] = msgspec.field(default_factory=dict)


class ContinueRun(StartRun, tag="continue", kw_only=True):
    """A continuation: a new run after `parent_run_id` (required) on the same thread."""


class Decide(_Base, tag="decide", kw_only=True):
    """Human decisions for suspended calls of `run_id` (idempotent on each `decision_id`)."""

    run_id: str
    decisions: list[dict[str, Any]]


class Cancel(_Base, tag="cancel", kw_only=True):
    run_id: str
    reason: str | None = None


Command = StartRun | ContinueRun | Decide | Cancel
CommandKind = Literal["start", "continue", "decide", "cancel"]

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
            try:
                normalize_frontend_tools(cmd.frontend_tools)
            except InvalidFrontendTools as exc:
                raise InvalidCommand(str(exc)) from None
        if isinstance(cmd, Decide) and not cmd.decisions:
            raise InvalidCommand("a decide command needs at least one decision")
    except InvalidId as exc:
        raise InvalidCommand(str(exc)) from None
    return cmd


def encode_command(cmd: Command) -> bytes:
    validate_command(cmd)
    return _encoder.encode(cmd)


def decode_command(data: bytes) -> Command:
    """Bytes -> a validated command; raises `InvalidCommand` (never anything else) on bad input."""
    try:
        cmd = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidCommand(f"invalid command: {exc}") from None
    return validate_command(cmd)


# == the stream ===================================================================================


def commands_stream_config(*, replicas: int = 1, duplicate_window: float = 120.0) -> Any:
    from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

    return StreamConfig(
        name=COMMANDS_STREAM,
        subjects=[COMMANDS_SUBJECTS],
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE,
        num_replicas=replicas,
        duplicate_window=duplicate_window,
        discard=DiscardPolicy.OLD,
        description="agentlog worker commands (work queue; one subject per thread)",
    )


async def ensure_commands_stream(js: Any, *, replicas: int = 1, duplicate_window: float = 120.0) -> None:
    """Create `AGENTLOG_COMMANDS` if missing (idempotent; safe when many processes race)."""
    from nats.js.errors import BadRequestError, NotFoundError

    config = commands_stream_config(replicas=replicas, duplicate_window=duplicate_window)
    try:
        await js.stream_info(COMMANDS_STREAM)
        return
    except NotFoundError:
        pass
    try:
        await js.add_stream(config)
    except BadRequestError:
        await js.stream_info(COMMANDS_STREAM)  # another process created it first


class Submitted(NamedTuple):
    """Answer of `CommandClient.submit`: the ids the submitter needs, and the queue position."""

    command_id: str
    thread_id: str
    run_id: str
    seq: int
    duplicate: bool


class CommandClient:
    """Publishes commands to the work queue with dedup (`Nats-Msg-Id`), and decisions/cancels
    also live on `agentlog.ctl.<run_id>`."""

    def __init__(self, nc: Any, *, timeout: float = 5.0) -> None:
        self.nc = nc
        self.js = nc.jetstream(timeout=timeout)
        self._ensured = False

    async def ensure_stream(self) -> None:
        if not self._ensured:
            await ensure_commands_stream(self.js)
            self._ensured = True

    async def submit(self, cmd: Command) -> Submitted:
        payload = encode_command(cmd)
        await self.ensure_stream()
        ack = await self.js.publish(
            command_subject(cmd.thread_id), payload, headers={"Nats-Msg-Id": cmd.command_id}
        )
        if isinstance(cmd, (Decide, Cancel)):
            try:
                await self.nc.publish(control_subject(cmd.run_id), payload)
            except Exception:  # noqa: BLE001 - live delivery is a shortcut; the queue is the truth
                pass
        return Submitted(cmd.command_id, cmd.thread_id, cmd.run_id, ack.seq, bool(ack.duplicate))
