"""The persisted vocabulary: every event type of DESIGN 2.2 and the commit envelope.

Events are frozen msgspec Structs in one tagged union (the `type` field holds the class name), so a
commit decodes in a single pass and an unknown tag is a typed error, not a crash. Field names are
the wire names; renaming one is a schema change (bump `SCHEMA_VERSION` and add an upcaster in
`codec`).
"""

from __future__ import annotations

from typing import Any, Literal, Union, get_args

import msgspec

#: Version of the envelope and event schemas written by this build.
SCHEMA_VERSION = 1

JSON = Any
Role = Literal["system", "user", "assistant", "tool"]
Visibility = Literal["all", "internal"]
Verdict = Literal["allow", "deny", "ask"]
ResumeMode = Literal["replay_tool_call", "use_decision_as_tool_result", "pass_decision_to_tool"]
DecisionAction = Literal["resume", "cancel"]
Outcome = Literal["succeeded", "failed", "cancelled"]
StateScope = Literal["thread", "run", "tool_call"]
#: Where a typed state key lives: `StateScope`, or the profile (long-term memory shared by the
#: threads of one `resource_id`, kept in its own stream: `ProfileCommit`).
KeyScope = Literal["thread", "run", "tool_call", "profile"]
#: How parallel writes of one key in one tool round combine (`agentlog.runtime.state`).
MergeStrategy = Literal["exclusive", "commutative", "lattice"]
ConflictResolution = Literal["failed", "sequential"]
TerminationType = Literal[
    "natural_end", "behavior_requested", "stopped", "cancelled", "blocked", "error"
]


class _Value(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """Plain value objects nested in events.

    `gc=False`: the garbage collector does not track them. They hold JSON data and other such
    values and are frozen, so they are never part of a reference cycle (one would need a dict or
    list inside a value to be made to hold that value: nothing does; such a cycle would leak,
    not break). A cold resume of a long run decodes hundreds of them (messages, tool calls) at
    once; untracked, they cost the collector nothing afterwards (figures in the docs' decision
    notes).

    Subclasses here and of `Event` repeat `frozen=True`: msgspec inherits it anyway (same
    struct config), but mypy's dataclass_transform model does not, and would call each a
    non-frozen subclass of a frozen class."""


class Usage(_Value, frozen=True):
    """Tokens of one or more inferences. `input_tokens` counts every prompt token, cached or
    not; `cache_read_tokens` / `cache_write_tokens` say how many of them were read from or
    written to the provider's prompt cache (priced differently), `reasoning_tokens` how many of
    `output_tokens` were hidden reasoning. The three are omitted when 0, so logs without them
    decode and encode as before."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
        )


class PayloadRef(_Value, frozen=True):
    """A value stored out of band in the JetStream Object Store (a commit over the server's max
    payload moves its large tool outputs there; `agentlog.eventlog.jetstream.payloads`). Readers resolve it."""

    bucket: str
    name: str
    size: int
    sha256: str


class ToolCall(_Value, frozen=True):
    """A call the model asked for, as part of an assistant message."""

    id: str
    name: str
    arguments: dict[str, JSON] = {}


class ReasoningPart(_Value, frozen=True):
    """A piece of a model's reasoning, as its provider gave it, so the next request can send it
    back (providers check it: Anthropic thinking blocks by `signature`, OpenAI reasoning items by
    `id` + encrypted `data`, Gemini thought signatures, on a call's part when `call_id` is set).
    `text` is what may be shown (a summary, or the thinking itself); `data` is opaque."""

    #: Which provider's format this is ("anthropic", "openai", "gemini"): each sends back only its
    #: own (a pool may mix providers in one conversation).
    provider: str | None = None
    text: str = ""
    signature: str | None = None
    data: str | None = None
    id: str | None = None
    call_id: str | None = None


class ContentPart(_Value, frozen=True):
    """One part of a multimodal message: text, an image or a file. A binary travels as base64
    `data` (with its `media_type`) or as a `url` the provider fetches; one larger than
    `agentlog.eventlog.jetstream.payloads.INLINE_BINARY_LIMIT` is kept in the Object Store (`data_ref`, the raw
    bytes) and every read puts it back, so a commit never carries it inline."""

    type: Literal["text", "image", "file"]
    text: str = ""
    media_type: str | None = None
    data: str | None = None
    url: str | None = None
    filename: str | None = None
    data_ref: PayloadRef | None = None


class Message(_Value, frozen=True):
    id: str
    role: Role
    content: str = ""
    tool_calls: list[ToolCall] | None = None
    #: The model's reasoning before this answer (assistant messages; omitted when none).
    reasoning: list[ReasoningPart] | None = None
    tool_call_id: str | None = None
    visibility: Visibility = "all"
    #: Set (and `content` empty) while the content is stored by reference.
    content_ref: PayloadRef | None = None
    #: The content as parts when it is more than text (images, files); `content` then holds its
    #: text parts, joined, so text-only readers still see the words. Omitted for plain text.
    parts: list[ContentPart] | None = None


class Termination(_Value, frozen=True):
    type: TerminationType
    code: str | None = None
    detail: str | None = None


#: The `SuspendTicket.action` of an in-doubt call: a call of a tool declared not idempotent whose
#: run was resumed (another process, another worker) after the call started and before its
#: outcome was recorded, so nobody knows whether its effect happened
#: (`agentlog.runtime.loop.in_doubt`).
IN_DOUBT_ACTION = "in_doubt"


class SuspendTicket(_Value, frozen=True):
    """What a suspended call waits for: shown to the human, answered by a decision."""

    id: str
    action: str = "approve"
    message: str | None = None
    parameters: dict[str, JSON] = {}
    response_schema: dict[str, JSON] | None = None
    resume_mode: ResumeMode = "replay_tool_call"


class ToolCallDecision(_Value, frozen=True):
    target_id: str
    decision_id: str
    action: DecisionAction
    result: JSON = None
    reason: str | None = None
    updated_at: int = 0


class Event(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type", tag=True):
    """Base of every persisted event. Concrete classes below; the tag is the class name."""


# -- thread ---------------------------------------------------------------------------------------


class ForkOrigin(_Value, frozen=True):
    """Where a forked thread branched off: the source thread and the event position (its
    `"<seq>:<index>"` id) whose state and messages the fork starts from. A counterfactual
    branch of a run (`agentlog.projections.counterfactual`) also names the run (`run_id`) and
    what it replaced there: a decision (`call_id`) or a model's answer (`message_id`, the
    assistant message replaced); `position` is then the last event of the run the branch shares.
    Omitted when unset."""

    thread_id: str
    position: str
    run_id: str | None = None
    call_id: str | None = None
    message_id: str | None = None


class ThreadCreated(Event, frozen=True):
    """`forked_from`: set on a thread made by forking another (`agentlog.projections.fork`); omitted
    otherwise, so logs written before the field existed decode as before."""

    resource_id: str | None = None
    parent_thread_id: str | None = None
    metadata: dict[str, JSON] = {}
    forked_from: ForkOrigin | None = None


class ThreadMetadataUpdated(Event, frozen=True):
    """Merge into the thread metadata; a key whose value is null is removed (JSON merge patch)."""

    metadata: dict[str, JSON]


class ThreadDeleted(Event, frozen=True):
    """Tombstone: the thread stays in the log, views hide it."""

    reason: str | None = None


# -- run ------------------------------------------------------------------------------------------


class AppRef(_Value, frozen=True):
    """The app a run was started by: its name (which workers may drive the run: commands are
    queued per app name, `agentlog.runtime.workers.commands`) and a digest of its agents and tools
    (`agentlog.runtime.digest.app_digest`), so a replay or an operator can tell which app a run
    needs."""

    name: str
    digest: str = ""


class ContextEntry(_Value, frozen=True):
    """One piece of context a client sent with the run (AG-UI `RunAgentInput.context`): shown to
    the model in the system prompt, in order (`agentlog.runtime.inputs.run_input.context_text`)."""

    description: str
    value: str


class RunOverrides(_Value, frozen=True):
    """What a request changed of the agent's configuration for this run only, within what the
    agent allows (`agentlog.runtime.inputs.run_input.OverridePolicy`): the model, the system prompt,
    provider options merged over `model_options`."""

    model: str | None = None
    system_prompt: str | None = None
    options: dict[str, JSON] = {}
    #: The run's tool policy: only tools matching these names or globs are offered and may run
    #: (None: every tool of the agent), minus those matching `excluded_tools`.
    allowed_tools: list[str] | None = None
    excluded_tools: list[str] = []


class ReplacedAnswer(_Value, frozen=True):
    """The answer a run takes at its step `step` instead of asking its model: `message`, an
    assistant message (its content and tool calls; its id is not used: the run draws its own).
    A counterfactual branch of a run records it (`agentlog.projections.counterfactual`)."""

    step: int
    message: Message


class RunStarted(Event, frozen=True):
    """`frontend_tools`: tools the client executes (AG-UI `RunAgentInput.tools`), each
    `{name, description, parameters}`, offered to the model for this run only. Recorded here so
    that resume and verified replay rebuild them from the log alone; omitted when empty, so logs
    written before the field existed (and runs without frontend tools) encode as before.
    `app`: the app that started the run (None: not recorded, e.g. an in-process `Runtime`
    without an app name, or a log written before the field existed; omitted then)."""

    run_id: str
    agent_id: str
    parent_run_id: str | None = None
    parent_thread_id: str | None = None
    origin: str = "user"
    frontend_tools: list[dict[str, JSON]] = []
    app: AppRef | None = None
    #: The model a pool chose for this run (`agentlog.runtime.models.pool`): resumes, on any
    #: worker, keep it. None when the agent names no pool (omitted: older logs decode as before).
    model: str | None = None
    #: The request's overrides (model, system prompt, options), recorded so that a resume on any
    #: worker and verified replay use the same values. None (omitted): none.
    overrides: RunOverrides | None = None
    #: The client's context for this run (AG-UI `context`), shown to the model.
    context: list[ContextEntry] = []
    #: What the client forwarded as is (AG-UI `forwardedProps`), for plugins and audits.
    forwarded_props: JSON = None
    #: Answers the run takes instead of its model's at given steps (a counterfactual branch's
    #: replaced answer; each taken is recorded as `InferenceReplaced`). Omitted when empty.
    answers: list[ReplacedAnswer] = []


class RunSuspended(Event, frozen=True):
    call_ids: list[str]


class RunResumed(Event, frozen=True):
    call_ids: list[str] = []


class RunCancelRequested(Event, frozen=True):
    reason: str | None = None


QueueMode = Literal["steer", "follow_up"]


class MessageQueued(Event, frozen=True):
    """A user message sent to a run while it runs, recorded on that run (the log is the queue).

    `steer`: the loop takes it at its next step boundary (after the current tool round, before
    the next model call); `follow_up`: only when the run would otherwise end naturally, and the
    run then goes on with it instead of ending. Taking it is the loop's own
    `MessageAppended` of this very message (same id) on the run: a queued message is pending
    until then. One the run never takes (it was cancelled, hit a stop condition, failed) stays
    recorded, untaken."""

    message: Message
    mode: QueueMode


class RunFinished(Event, frozen=True):
    termination: Termination
    usage: Usage = Usage()
    #: The run's summed inference cost in USD; None (omitted) when no inference had prices.
    cost: float | None = None


class StepStarted(Event, frozen=True):
    step: int


class StepFinished(Event, frozen=True):
    step: int


class AgentHandedOff(Event, frozen=True):
    """The run's active agent changed from `from_agent` to `to_agent` (a `transfer_to_<agent>`
    tool call, `call_id`, or a plugin's `HandOff` action): from the next step on the loop uses
    the target's instructions, tools, plugins and model, and a resume or replay of the run folds
    this event to pick the same agent. The thread's active agent (its view's `active_agent`) is
    the last run's after its handoffs."""

    from_agent: str
    to_agent: str
    reason: str | None = None
    call_id: str | None = None


# -- messages and inference -----------------------------------------------------------------------


class MessageAppended(Event, frozen=True):
    message: Message


class InferenceCompleted(Event, frozen=True):
    """One model call. `request_digest` (sha256 of the canonical request) lets verified replay
    notice a changed prompt, tool list or plugin context, which never shows in the other events;
    `request_digests` (short digests of each part: model, system, messages, tools, options) lets
    it name the part that changed. Both optional: older logs have neither or only the first."""

    model: str
    usage: Usage = Usage()
    duration_ms: int = 0
    stop_reason: str | None = None
    message_id: str | None = None
    request_digest: str | None = None
    request_digests: dict[str, str] | None = None
    #: What the call cost in USD, from the model's prices (`agentlog.runtime.models.pricing`);
    #: None (omitted) when the model has no prices.
    cost: float | None = None


class InferenceReplaced(Event, frozen=True):
    """The run's assistant message `message_id` (step `step`) is the answer its `RunStarted.answers`
    gave for that step, not a model's: no model was asked, so there is no `InferenceCompleted`
    (and verified replay asks its recorded model nothing for it)."""

    message_id: str
    step: int


BreakerState = Literal["closed", "open", "half_open"]


class CircuitBreakerChanged(Event, frozen=True):
    """A model's circuit breaker changed state during this run's inference
    (`agentlog.runtime.models.breaker`): `open` after `failures` failures in a row (the model is
    skipped until its cooldown ends), `half_open` when a probe request is let through after
    the cooldown, `closed` when a request succeeded again. Recorded in the run whose inference
    saw the change, so a resume or a verified replay takes the same path from the log instead
    of deciding again from the clock."""

    model: str
    state: BreakerState
    failures: int = 0
    detail: str | None = None


# -- tool calls -----------------------------------------------------------------------------------


class ToolCallGated(Event, frozen=True):
    call_id: str
    verdict: Verdict
    rule: str | None = None


class ToolCallStarted(Event, frozen=True):
    call_id: str
    name: str
    arguments: dict[str, JSON] = {}


class ToolCallSuspended(Event, frozen=True):
    call_id: str
    ticket: SuspendTicket


class ToolCallDecided(Event, frozen=True):
    call_id: str
    decision: ToolCallDecision


class ToolCallResuming(Event, frozen=True):
    call_id: str
    mode: ResumeMode


class ToolCallCompleted(Event, frozen=True):
    call_id: str
    outcome: Outcome
    result: JSON = None
    message_id: str | None = None
    #: Set (and `result` None) while the result is stored by reference.
    result_ref: PayloadRef | None = None
    #: What the tool said about its result for clients and audits, never shown to the model
    #: (`ToolResult.details`). None (omitted): nothing.
    details: JSON = None
    #: The user messages the tool asked to follow this step's tool results (`ToolResult.follow_up`),
    #: appended at the step's end; recorded here so that a replay answering the tool from the
    #: log asks for them again. None (omitted): none.
    follow_up: list[str] | None = None


# -- context ----------------------------------------------------------------------------------------


class ContextCompacted(Event, frozen=True):
    """The thread's messages up to `upto_message_id` were summarised into `summary` (an LLM call
    by the agent's context policy, `agentlog.runtime.context_policy`). From here on the loop's model context is
    the summary plus the messages after that id: recorded so resume and replay use the identical
    compacted context instead of asking a model again."""

    summary: str
    upto_message_id: str
    model: str | None = None
    usage: Usage = Usage()
    tokens_before: int = 0
    tokens_after: int = 0
    #: Why: None when the context policy's budget was exceeded, "overflow" when the provider
    #: refused the request as too long (the inference is retried once after it).
    reason: str | None = None


# -- plugins ----------------------------------------------------------------------------------------


class ContextMessageSet(Event, frozen=True):
    """A plugin's keyed context message for the model's system prompt
    (`agentlog.runtime.plugins.AddContext` with a key, persistent or throttled, or given outside
    BeforeInference; `RemoveContext`: `text` None). Run-scoped: the loop folds these and adds
    the messages due at each inference (`agentlog.runtime.loop.run_context.due_context`): a
    one-shot message at the next inference, a persistent one at every inference, each no more
    often than once every `cooldown` + 1 inferences. Recorded so resume and replay inject the
    same messages at the same steps."""

    key: str
    text: str | None = None
    persistent: bool = False
    cooldown: int = 0


class ActionScheduled(Event, frozen=True):
    """A plugin scheduled action `key` for a later phase (`agentlog.runtime.plugins.Schedule`):
    pending in the run until the loop reaches `phase`, where its handler runs
    (`ScheduledActionsRan` records that it did). Recorded so that a resume after a crash in
    between still runs it."""

    key: str
    phase: str
    payload: JSON = None


class ScheduledActionsRan(Event, frozen=True):
    """The run's pending scheduled actions for `phase` (`count` of them) ran: no longer pending."""

    phase: str
    count: int


class EffectEmitted(Event, frozen=True):
    """A plugin's typed post-commit effect (`agentlog.runtime.plugins.Effect`): its handler
    runs once the commit holding this event is in the log, with the state as of that commit
    (at most once: a crash between the commit and the handler skips it; replay never runs it)."""

    key: str
    payload: JSON = None


class InputFiltered(Event, frozen=True):
    """A plugin's input filter judged the messages a run starts with
    (`agentlog.runtime.plugins.Plugin.filter_input`): `reject` ends the run `blocked` (code
    `input_rejected`) before any model call; `warn` lets it go on and tells the model."""

    verdict: Literal["warn", "reject"]
    reason: str
    plugin: str = ""
    message_ids: list[str] = []


# -- quarantine -----------------------------------------------------------------------------------


class CommitQuarantined(Event, frozen=True):
    """Stands in, for every reader, for a message of the log that is not a commit this build can
    decode (raw bytes published on an event subject, a newer schema). Readers make it from the
    message (`agentlog.eventlog.quarantine`); no writer may append one (`check_commit` refuses it).

    No fold gives it meaning, so it changes nothing but what any commit changes: the views'
    version and last-seen sequence count its seq (per-thread OCC counts every message on the
    thread's subjects). `code`: the codec error's code; `subject`: where it was published; `size`
    and `sha256` identify the bytes."""

    code: str
    reason: str
    subject: str = ""
    size: int = 0
    sha256: str = ""


# -- state ----------------------------------------------------------------------------------------


class StatePatched(Event, frozen=True):
    """RFC 6902 ops on the state of `scope`. `call_id` names the call for tool_call scope."""

    ops: list[dict[str, JSON]]
    scope: StateScope = "thread"
    source: str | None = None
    call_id: str | None = None


class StateReplaced(Event, frozen=True):
    state: dict[str, JSON]
    scope: StateScope = "thread"
    call_id: str | None = None


class StateWritten(Event, frozen=True):
    """A write of the typed state key `key` in `scope`: `ops` (RFC 6902 and the extended
    vocabulary of `agentlog.projections.state.apply_ops`, with absolute paths under `/<key>` of
    the scope's document) are what the folds apply, so no fold needs the app that declared the
    key. `action`: the reducer action the ops came from (None: a plain write); replay reduces it
    again and checks it gives the same ops. `merge`: the key's strategy, as declared.

    `call_id`: the tool call that wrote it (and, in `tool_call` scope, whose document it is).
    `profile_id`: the profile written (`profile` scope; the write itself is a `ProfileCommit` in
    the profile's own stream, and this event is the run's record of it). `transient`: the key is
    not persistent and is cleared when the run ends (`StateCleared`)."""

    key: str
    ops: list[dict[str, JSON]]
    scope: KeyScope = "thread"
    merge: MergeStrategy = "exclusive"
    action: JSON = None
    source: str | None = None
    call_id: str | None = None
    profile_id: str | None = None
    transient: bool = False


class StateCleared(Event, frozen=True):
    """Scoped state ended: `keys` of the `run` scope when the run ends, of a call's `tool_call`
    scope when the call completes (`call_id`), or the run's transient `thread` keys when it ends.
    Written by the loop so views and time travel show the cleanup where it happened."""

    scope: StateScope
    keys: list[str] = []
    call_id: str | None = None


class StateConflicted(Event, frozen=True):
    """Two writers of one round touched overlapping paths (`path`) of the exclusive key `key`.
    `writer` lost to `with_writer` (`tool:<call_id>` or `plugin:<id>`). `resolution`: `failed`
    (a tool call: it completes failed, its writes dropped, the model sees why) or `sequential`
    (a plugin hook: run again after the other's writes, on the state they made). A failed
    call's dropped writes are kept here (`ops`: its untyped ops, `writes`: its typed ones), so
    the log says what was refused and verified replay can refuse it again."""

    key: str
    path: str
    writer: str
    with_writer: str
    resolution: ConflictResolution
    scope: KeyScope = "thread"
    call_id: str | None = None
    ops: list[dict[str, JSON]] = []
    writes: list[StateWritten] = []


# -- events for clients ----------------------------------------------------------------------------


EmitKind = Literal["custom", "raw", "activity_snapshot", "activity_delta"]


class Emitted(Event, frozen=True):
    """A protocol event a tool or plugin emitted for the run's clients (AG-UI `CUSTOM`, `RAW`,
    `ACTIVITY_SNAPSHOT`, `ACTIVITY_DELTA`). Recorded like everything else, so a stream replayed
    from the log, a reconnecting client and a live one see the same events in the same place.

    `name`: the custom event's name, the raw event's source, or the activity type. `value`: the
    custom value, the raw event, or the activity's content (snapshot). `patch`: the RFC 6902 ops
    of an activity delta. `message_id`: the activity message. `call_id`: the tool call that
    emitted it (None: a plugin)."""

    kind: EmitKind
    name: str = ""
    value: JSON = None
    patch: list[dict[str, JSON]] | None = None
    message_id: str | None = None
    call_id: str | None = None


AnyEvent = Union[
    ThreadCreated,
    ThreadMetadataUpdated,
    ThreadDeleted,
    RunStarted,
    RunSuspended,
    RunResumed,
    RunCancelRequested,
    MessageQueued,
    RunFinished,
    StepStarted,
    StepFinished,
    AgentHandedOff,
    MessageAppended,
    InferenceCompleted,
    InferenceReplaced,
    CircuitBreakerChanged,
    ToolCallGated,
    ToolCallStarted,
    ToolCallSuspended,
    ToolCallDecided,
    ToolCallResuming,
    ToolCallCompleted,
    StatePatched,
    StateReplaced,
    StateWritten,
    StateCleared,
    StateConflicted,
    ContextCompacted,
    CommitQuarantined,
    Emitted,
    ContextMessageSet,
    ActionScheduled,
    ScheduledActionsRan,
    EffectEmitted,
    InputFiltered,
]

EVENT_TYPES: dict[str, type[Event]] = {cls.__name__: cls for cls in get_args(AnyEvent)}


class Commit(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One JetStream message: an atomic, ordered list of events of one thread and at most one run."""

    commit_id: str
    thread_id: str
    run_id: str | None = None
    ts: int
    v: int = SCHEMA_VERSION
    events: list[AnyEvent]


class ProfileCommit(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One message of a profile's stream (`agentlog.pf.<digest of the profile id>`): typed state
    writes (`StateWritten`, scope `profile`) of the profile shared by the threads of one
    `resource_id`, appended under optimistic concurrency per profile. `thread_id` / `run_id` /
    `call_id` say which run wrote it (None: written from outside a run)."""

    commit_id: str
    profile_id: str
    ts: int
    v: int = SCHEMA_VERSION
    thread_id: str | None = None
    run_id: str | None = None
    call_id: str | None = None
    events: list[StateWritten]


class StoredProfileCommit(msgspec.Struct, frozen=True):
    """A profile commit as read back, with the sequence the profile stream gave it."""

    seq: int
    commit: ProfileCommit


class Position(msgspec.Struct, frozen=True, order=True):
    """Where an event sits: stream sequence of its commit and its index inside the commit.

    Its string form `"<seq>:<index>"` is the event id of SSE `Last-Event-ID` and CLI `--to`.
    """

    seq: int
    index: int = 0

    def __str__(self) -> str:
        return f"{self.seq}:{self.index}"

    @classmethod
    def parse(cls, text: str) -> Position:
        """Parse `"seq:index"` (or a bare `"seq"`, meaning index 0); ValueError if malformed."""
        seq_text, _, index_text = text.strip().partition(":")
        try:
            seq = int(seq_text)
            index = int(index_text) if index_text else 0
        except ValueError:
            raise ValueError(f"not an event id (expected '<seq>:<index>'): {text!r}") from None
        if seq < 1 or index < 0:
            raise ValueError(f"not an event id (seq >= 1, index >= 0): {text!r}")
        return cls(seq, index)


class StoredCommit(msgspec.Struct, frozen=True):
    """A commit as read back from a store, with the sequence the log gave it."""

    seq: int
    commit: Commit

    def positioned(self) -> list[tuple[Position, AnyEvent]]:
        return [(Position(self.seq, i), ev) for i, ev in enumerate(self.commit.events)]


class AppendResult(msgspec.Struct, frozen=True):
    """Answer to an append: the commit's sequence; `duplicate` if it was already in the log."""

    seq: int
    duplicate: bool = False
