"""Commands: what a gateway, a sub-agent tool or a test asks the runtime to do to a run, as values.

    cmd = StartRun.of(request, thread_id, run_id)   # or Decide, Cancel, QueueMessages
    data = encode_command(cmd); decode_command(data) == cmd
    await runtime.execute(cmd)                      # what a worker does with one it took

Commands are msgspec structs with a `type` tag, JSON on the wire (the work queue,
`agentlog.runtime.workers.commands`, carries them to workers). A start is a `RunRequest` with its
ids chosen, so the caller knows them before anything runs; `command_id` is the idempotency key.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from agentlog.eventlog.errors import AgentlogError, InvalidId
from agentlog.eventlog.events import ToolCallDecision
from agentlog.eventlog.ids import new_id, validate_id
from agentlog.runtime.inputs.frontend import InvalidFrontendTools, normalize_frontend_tools
from agentlog.runtime.inputs.request import RunRequest


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
    `interrupt` the parent may still be running: it is cancelled first (`interruption`) and this
    run starts once it has finished. One command for both, so a crash in between leaves it to
    redo: a finished parent is not cancelled again, a started run is resumed."""

    def interruption(self) -> Cancel | None:
        """The cancel of the parent this command asks for first, if it interrupts."""
        if not self.interrupt or self.parent_run_id is None:
            return None
        return Cancel(thread_id=self.thread_id, run_id=self.parent_run_id, reason=INTERRUPTED)


#: The cancel reason an interrupting continuation records on the run it stops.
INTERRUPTED = "interrupted by a new message"


class Decide(_Base, tag="decide", kw_only=True):
    """Human decisions for suspended calls of `run_id` (idempotent on each `decision_id`), as
    the gateway parsed and checked them."""

    run_id: str
    decisions: list[ToolCallDecision]


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


__all__ = [
    "INTERRUPTED", "Cancel", "Command", "CommandKind", "ContinueRun", "Decide", "InvalidCommand", "QueueMessages",
    "StartRun", "decode_command", "encode_command", "validate_command",
]
