"""What the protocol adapters share: typed input errors, decision dicts, interrupt reasons and the
split between committed log events and live (core NATS) items.

The adapters are pure translators: they never touch NATS, the store or the clock. A route feeds
them what it reads (committed events from the log, live deltas from `agentlog.live.*`) and writes
what they return, so the same code serves HTTP SSE, NATS replies and replays of stored runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TypedDict, TypeVar

import msgspec
import structlog

from agentlog.eventlog.errors import AgentlogError
from agentlog.eventlog.events import AgentHandedOff, Event, Message, SuspendTicket
from agentlog.eventlog.ids import is_valid_id
from agentlog.gateway.operations.errors import ApiError
from agentlog.runtime.inputs import FRONTEND_ACTION

_encode = msgspec.json.Encoder(order="deterministic").encode
log = structlog.get_logger("agentlog.gateway.adapters")
T = TypeVar("T")


#: The AG-UI CUSTOM event name of a handoff (AI SDK: the `data-agentlog-handoff` part).
HANDOFF_EVENT = "agentlog.handoff"


def handoff_value(ev: AgentHandedOff) -> dict[str, Any]:
    """What both protocols carry of a handoff: the two agents, and the reason and call if any."""
    out: dict[str, Any] = {"from_agent": ev.from_agent, "to_agent": ev.to_agent}
    if ev.reason is not None:
        out["reason"] = ev.reason
    if ev.call_id is not None:
        out["call_id"] = ev.call_id
    return out


class AdapterInputError(AgentlogError, ValueError):
    """A protocol request body that cannot be turned into a run request. `field` names where
    (dotted path, e.g. `messages[2].content`), so the route can answer 400 with field detail."""

    code = "invalid_input"

    def __init__(self, message: str, field: str | None = None) -> None:
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


#: Where a protocol request says what its new message does to a run still running on the thread:
#: AG-UI `forwardedProps.agentlog.mode`, AI SDK request body `agentlog.mode` (`sendMessage`'s
#: `body` option). `steer` / `follow_up` queue it on that run; absent: "stop, then send".
QUEUE_MODES = ("steer", "follow_up")


def queue_mode(props: Any, where: str) -> str | None:
    """The queue mode a request's props ask for (None: none); `AdapterInputError` for another."""
    ours = props.get("agentlog") if isinstance(props, Mapping) else None
    mode = ours.get("mode") if isinstance(ours, Mapping) else None
    if mode is not None and mode not in QUEUE_MODES:
        raise AdapterInputError(f"must be one of {', '.join(QUEUE_MODES)}", f"{where}.agentlog.mode")
    return mode


class ResumeError(AgentlogError, ValueError):
    """Resume entries / approvals that do not match the open interrupts of the waiting run.
    The route answers with RUN_ERROR (AG-UI) or an error part (AI SDK) and writes nothing."""

    code = "invalid_resume"

    def __init__(self, message: str, ids: Iterable[str] = ()) -> None:
        self.ids = sorted(ids)
        super().__init__(message)


class MissingResume(ResumeError):
    code = "missing_resume"


class MissingToolResult(ResumeError):
    """The run waits for the client's results of frontend tool calls (AG-UI
    `pendingToolCallIds`): no interrupt is open, so the answer names the calls and how to
    answer them (`role: tool` messages), not interrupts the client never received."""

    code = "missing_tool_result"


class UnknownInterrupt(ResumeError):
    code = "unknown_interrupt"


class DuplicateResume(ResumeError):
    code = "duplicate_resume"


class Decision(TypedDict, total=False):
    """What a protocol answer becomes: the fields of `agentlog.eventlog.events.ToolCallDecision` the
    runtime needs (`updated_at` is stamped by whoever appends it)."""

    target_id: str
    decision_id: str
    action: Literal["resume", "cancel"]
    result: Any
    reason: str


def decision_id(*parts: Any) -> str:
    """A deterministic decision id from what identifies the answer (thread, interrupt, status,
    payload): the same resume sent twice gets the same id, which the runtime dedupes on, so a
    retried request never decides twice (AG-UI: resume is idempotent on exactly these)."""
    digest = hashlib.sha256(_encode(list(parts))).hexdigest()
    return "d" + digest[:40]


def check_decisions(
    decisions: Iterable[Mapping[str, Any]], open_ids: Iterable[str], *, require_all: bool = True
) -> None:
    """Check answers against the interrupts a waiting run has open (its suspended call ids).

    Every target must be open (else `UnknownInterrupt`), no target twice (`DuplicateResume`),
    and with `require_all` (AG-UI's contract) every open interrupt must be answered
    (`MissingResume`), which also means a waiting run refuses plain new input.
    """
    open_set = set(open_ids)
    seen: set[str] = set()
    dup: set[str] = set()
    for d in decisions:
        target = d["target_id"]
        if target in seen:
            dup.add(target)
        seen.add(target)
    if dup:
        raise DuplicateResume(f"more than one answer for interrupt(s) {', '.join(sorted(dup))}", dup)
    unknown = seen - open_set
    if unknown:
        shown = ", ".join(sorted(open_set)) or "none"
        raise UnknownInterrupt(
            f"no open interrupt {', '.join(sorted(unknown))} on this run (open: {shown})", unknown
        )
    missing = open_set - seen
    if require_all and missing:
        raise MissingResume(
            f"the run waits on interrupt(s) {', '.join(sorted(missing))}: a resume must answer "
            "every open interrupt before the thread takes new input", missing,
        )


#: Ticket actions (`ToolResult.pending(action=...)`, permission `ask`) -> AG-UI core reasons.
_REASONS: dict[str, str] = {
    "approve": "tool_call",
    "approval": "tool_call",
    "tool_call": "tool_call",
    "confirm": "confirmation",
    "confirmation": "confirmation",
    "input": "input_required",
    "input_required": "input_required",
    "answer": "input_required",
}


def interrupt_reason(ticket: SuspendTicket | None) -> str:
    """The AG-UI interrupt reason of a suspended call: core reasons for known ticket actions,
    a namespaced custom reason (`agentlog:<action>`) otherwise (`core:` is reserved upstream)."""
    if ticket is None:
        return "tool_call"
    return _REASONS.get(ticket.action, f"agentlog:{ticket.action}")


def needs_approval(ticket: SuspendTicket | None) -> bool:
    """A yes/no answer settles it (AI SDK `tool-approval-request`); else it needs input."""
    return interrupt_reason(ticket) in ("tool_call", "confirmation")


class Item(NamedTuple):
    """One thing fed to a translator, normalised: a committed event (with its commit's ts) or a
    live payload (`{"type": "text_delta" | "reasoning_delta" | "tool_call_delta" | "tool_progress", ...}`)."""

    event: Event | None
    live: dict[str, Any] | None
    ts: int | None


def as_item(item: Any) -> Item:
    """Accept `runtime.CommittedEvent` (position, event, ts), a bare event, or a live dict."""
    if isinstance(item, Event):
        return Item(item, None, None)
    if isinstance(item, Mapping):
        return Item(None, dict(item), None)
    event = getattr(item, "event", None)
    if isinstance(event, Event):
        ts = getattr(item, "ts", None)
        return Item(event, None, ts if isinstance(ts, int) else None)
    raise TypeError(f"cannot translate {type(item).__name__}: expected a committed event or a live dict")


def safe_id(value: Any) -> str | None:
    """`value` if it is a safe agentlog id, else None (the runtime then generates one)."""
    return value if is_valid_id(value) else None


def json_text(value: Any) -> str:
    """Compact JSON text (tool arguments as AG-UI carries them: a JSON-encoded string)."""
    return msgspec.json.encode(value).decode()


def int_or(value: Any, default: int) -> int:
    """`value` if it is a real int (not a bool), else `default`: live payloads come off the wire."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def is_frontend_ticket(ticket: SuspendTicket | None) -> bool:
    """A suspension that waits for the client to run a frontend tool (not a human's answer)."""
    return ticket is not None and ticket.action == FRONTEND_ACTION


def live_message_id(p: Mapping[str, Any], run_id: str, step: int) -> str:
    """The message a live delta belongs to: the log id it carries, else a provisional one."""
    mid = p.get("message_id")
    return mid if is_valid_id(mid) else f"{run_id}-s{step}-text"


@dataclass
class LiveCall:
    """A tool call the live link started: its arguments streamed so far, and whether it is still
    open (the commit of its message closes it; a delta after that is dropped)."""

    call_id: str
    name: str
    args: str = ""
    open: bool = True


class LiveCallDelta(NamedTuple):
    """What one `tool_call_delta` adds: its call, whether it started the call (announce it),
    and the argument text to stream ("" for none)."""

    call: LiveCall
    started: bool
    args: str


class LiveCalls:
    """The tool calls of a translator's live `tool_call_delta`s. A call is keyed by (step, index)
    (the deltas of one call of one model response carry no id after the first), started once
    however it was first seen (live here, or by its commit: `seen`), and streams its arguments
    until its commit closes it. The protocol events are the translator's to emit."""

    def __init__(self) -> None:
        self._calls: dict[tuple[int, int], LiveCall] = {}

    def feed(self, p: Mapping[str, Any], step: int, seen: Callable[[str], bool]) -> LiveCallDelta | None:
        """The effect of delta `p` of `step`; None when it adds nothing: a call cannot be
        started without its id and name (its commit will), nor twice."""
        index = int_or(p.get("index"), 0)
        call = self._calls.get((step, index))
        started = call is None
        if call is None:
            call_id, name = p.get("call_id"), p.get("name")
            if not isinstance(call_id, str) or not isinstance(name, str):
                return None
            if self.get(call_id) is not None or seen(call_id):
                return None
            call = self._calls[(step, index)] = LiveCall(call_id, name)
        delta = p.get("arguments_delta")
        args = delta if call.open and isinstance(delta, str) else ""
        call.args += args
        return LiveCallDelta(call, started, args)

    def get(self, call_id: str) -> LiveCall | None:
        """The live call with this id (call ids are unique on the thread)."""
        return next((c for c in self._calls.values() if c.call_id == call_id), None)

    def close_all(self) -> list[LiveCall]:
        """Close the calls still open; returns them."""
        closed = [c for c in self._calls.values() if c.open]
        for c in closed:
            c.open = False
        return closed


def data_url_part(url: str, media_type: str | None, filename: str | None = None) -> dict[str, Any]:
    """An agentlog content part from a URL that may be a `data:` URL (AI SDK file parts): the
    bytes when it is one, else the URL; an image when its media type says so, else a file."""
    part: dict[str, Any] = {}
    if url.startswith("data:") and "," in url:
        head, data = url[5:].split(",", 1)
        if not head.endswith(";base64"):
            raise AdapterInputError("a data: URL must be base64 (data:<type>;base64,...)")
        part["data"] = data
        media_type = media_type or head[:-len(";base64")] or None
    else:
        part["url"] = url
    part["type"] = "image" if (media_type or "").startswith("image/") else "file"
    if media_type:
        part["media_type"] = media_type
    if filename and part["type"] == "file":
        part["filename"] = filename
    return part


def part_url(part: Any) -> str:
    """An image/file part's bytes as a `data:` URL (or its own URL): how the AI SDK and A2A
    histories give them back."""
    if part.data is None:
        return str(part.url or "")
    return f"data:{part.media_type or 'application/octet-stream'};base64,{part.data}"


def reasoning_id(message_id: str) -> str:
    """The id of a message's reasoning as the protocols show it (an AG-UI reasoning message and
    span, an AI SDK reasoning part): derived from the message's id, so live deltas and the
    committed message name the same reasoning and a client holds it once."""
    return f"{message_id}-reasoning"


def reasoning_text(m: Message) -> str:
    """What may be shown of a message's reasoning: its parts' text, joined as the live
    `reasoning_delta`s streamed it (opaque parts, e.g. redacted thinking, show nothing)."""
    return "".join(r.text for r in m.reasoning or ())


def error_text(exc: BaseException) -> str:
    """What a protocol error event says about `exc`: the message of our own typed errors (the
    runtime's and the gateway's `ApiError`, e.g. a refused token: the same words as the HTTP
    answer and the NATS error headers), only the type of anything else (its text may hold the
    very input that broke it, e.g. a lone surrogate, which no UTF-8 encoder accepts), always
    encodable."""
    text = (str(exc) or type(exc).__name__) if isinstance(exc, (AgentlogError, ApiError)) else \
        f"internal error ({type(exc).__name__})"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


async def guarded(events: AsyncIterator[Any], encode: Callable[[Any], T],
                  on_error: Callable[[BaseException], Any], **log_ctx: Any) -> AsyncIterator[T]:
    """Encoded events of a protocol stream that always ENDS with the protocol's error event when
    anything fails: the producer (e.g. the dispatcher refusing to encode a commit) or the encoding
    of one event (e.g. RUN_STARTED echoing an input with a lone surrogate). Without this a
    transport would wait forever for an end that never comes. `on_error` builds the
    error event (AG-UI RUN_ERROR / AI SDK `error`); it must only use `error_text(exc)`."""
    try:
        async for ev in events:
            try:
                frame = encode(ev)
            except Exception as exc:  # noqa: BLE001 - reported as the stream's last event
                log.error("adapter event could not be encoded", event=type(ev).__name__, exc_info=exc, **log_ctx)
                yield encode(on_error(exc))
                return
            yield frame
    except AgentlogError as exc:
        yield encode(on_error(exc))
    except Exception as exc:  # noqa: BLE001 - reported as the stream's last event
        log.error("adapter stream failed", exc_info=exc, **log_ctx)
        yield encode(on_error(exc))


#: The request keys read as run overrides (AG-UI `forwardedProps`, the AI SDK body), and the
#: `RunOverrides` field each fills (`agentlog.runtime.inputs.run_input`).
OVERRIDE_KEYS = {"model": "model", "systemPrompt": "system_prompt", "config": "options",
                 "allowedTools": "allowed_tools", "excludedTools": "excluded_tools"}


def request_overrides(props: Mapping[str, Any], where: str = "") -> dict[str, Any] | None:
    """`model` (a non-empty string), `systemPrompt` (a string), `config` (an object of provider
    options) and `allowedTools` / `excludedTools` (lists of tool names or globs: the run's tool
    policy) of a protocol request as run overrides, None when it has none. Raises
    `AdapterInputError` (field `where` + key) for a wrong shape; whether the agent allows them is
    the runtime's to say."""
    out: dict[str, Any] = {}
    for key, name in OVERRIDE_KEYS.items():
        value = props.get(key)
        if value is None:
            continue
        if name == "options":
            if not isinstance(value, dict):
                raise AdapterInputError("config is an object of provider options", f"{where}{key}")
        elif name in ("allowed_tools", "excluded_tools"):
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise AdapterInputError(f"{key} is a list of tool names or globs", f"{where}{key}")
        elif not isinstance(value, str) or (name == "model" and not value):
            raise AdapterInputError(f"{key} is a{' non-empty' if name == 'model' else ''} string", f"{where}{key}")
        out[name] = value
    return out or None
