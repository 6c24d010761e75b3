"""Pydantic models of every query string and body the HTTP API accepts.

They are the single definition of the input: handlers parse with them (a `ValidationError`
becomes a 400 with field detail) and `openapi` derives the parameters and request bodies from
them, so the published schema cannot drift from what is enforced. Ids are checked with the log's
own rule (`[A-Za-z0-9_-]{1,128}`) before anything touches NATS.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from agentlog.eventlog.events import Position
from agentlog.eventlog.ids import is_valid_id

MAX_LIMIT = 200
DEFAULT_LIMIT = 50
ID_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"


def _check_id(value: str) -> str:
    if not is_valid_id(value):
        raise ValueError("ids must be 1-128 characters of A-Z, a-z, 0-9, '_' or '-'")
    return value


def _check_run_id(value: str) -> str:
    _check_id(value)
    if value == "_":
        raise ValueError("'_' is reserved and is not a run id")
    return value


def _clamp_limit(value: Any) -> Any:
    """DESIGN 5.1: limit is 1..200. Out-of-range numbers are clamped (a UI asking for 0 or 10000
    gets a useful page); non-numbers still fail validation."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        return value
    return max(1, min(MAX_LIMIT, number))


def _check_event_id(value: str) -> str:
    Position.parse(value)  # ValueError with a clear message
    return value


Id = Annotated[str, Field(pattern=ID_PATTERN, examples=["01J9ZQ3V6K"]), AfterValidator(_check_id)]
RunId = Annotated[str, Field(pattern=ID_PATTERN), AfterValidator(_check_run_id)]
EventId = Annotated[
    str,
    Field(pattern=r"^\s*[0-9]+(:[0-9]+)?\s*$", description="event id '<seq>:<index>'", examples=["12:0"]),
    AfterValidator(_check_event_id),
]
Limit = Annotated[int, BeforeValidator(_clamp_limit),
                  Field(default=DEFAULT_LIMIT, description=f"page size, clamped to 1..{MAX_LIMIT}")]
Offset = Annotated[int, Field(default=0, ge=0)]
MinSeq = Annotated[int | None, Field(
    default=None, ge=0, description="read-your-writes: wait (bounded) until the views include this seq")]
ResourceId = Annotated[str, Field(min_length=1, max_length=256)]
Order = Annotated[Literal["desc", "asc"], Field(
    default="desc", description="desc: newest first (by creation: the first commit's time, then id); asc: oldest first")]


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Query(Model):
    """Query strings: unknown parameters are rejected too (a typo must not silently widen a list)."""


# -- threads ----------------------------------------------------------------------------------


class CreateThread(Model):
    thread_id: Id | None = Field(default=None, description="generated (time-ordered) when absent")
    resource_id: ResourceId | None = None
    parent_thread_id: Id | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class UpdateThread(Model):
    metadata: dict[str, Any] = Field(description="merged into the metadata; a null value removes the key")
    expected_version: int | None = Field(
        default=None, ge=0, description="optimistic concurrency: 409 unless the thread is at this version")


class ReplaceMessage(Model):
    """A message of the forked history to change (by id): its new content (and role)."""

    id: str = Field(min_length=1, max_length=256, description="the id of a message in the history as of `at`")
    content: str
    role: Literal["user", "system", "assistant", "tool"] | None = None


class ForkThread(Model):
    at: EventId = Field(description="the event of the source thread to fork at (its messages and state as of it)")
    new_thread_id: Id | None = Field(default=None, description="the fork's id; generated when absent")
    state: dict[str, Any] | None = Field(default=None, description="the fork's thread state (replaces it)")
    state_patch: list[dict[str, Any]] | None = Field(
        default=None, max_length=1000, description="RFC 6902 ops applied to the state as of `at`")
    replace_message: ReplaceMessage | None = None
    metadata: dict[str, Any] = Field(default_factory=dict, description="merged into the source's metadata")


class RevokeQuery(Query):
    tool: str = Field(min_length=1, max_length=256, description="the tool (glob) of the standing rules to remove")
    verdict: Literal["allow", "deny"] | None = Field(default=None, description="only rules of this verdict")


class ListThreadsQuery(Query):
    limit: Limit = DEFAULT_LIMIT
    offset: Offset = 0
    order: Order = "desc"
    resource_id: ResourceId | None = None
    parent_thread_id: Id | None = None
    min_seq: MinSeq = None


class GetViewQuery(Query):
    min_seq: MinSeq = None


class DeleteThreadQuery(Query):
    expected_version: int | None = Field(default=None, ge=0)
    reason: str | None = Field(default=None, max_length=1000)


class MessagesQuery(Query):
    after: EventId | None = Field(default=None, description="only messages after this event id (cursor)")
    limit: Limit = DEFAULT_LIMIT
    run_id: RunId | None = None
    visibility: Literal["all", "internal"] | None = None


class StateQuery(Query):
    at: EventId | None = Field(default=None, description="time travel: the state as of this event id")


class ProfileStateQuery(Query):
    at: int | None = Field(default=None, ge=1, description="time travel: the profile as of this sequence of its stream")
    history: bool = Field(default=False, description="also list the profile's writes (up to `at`)")


class ProfileStateRequest(ProfileStateQuery):
    profile_id: ResourceId


class EventsQuery(Query):
    after: EventId | None = Field(
        default=None, description="resume after this event id (the Last-Event-ID header wins)")
    follow: bool = Field(default=False, description="keep tailing live events (with heartbeats)")


# -- runs -------------------------------------------------------------------------------------


class ListRunsQuery(Query):
    thread_id: Id | None = None
    status: Literal["running", "waiting", "done", "failed"] | None = Field(
        default=None, description="failed: ended in an error (termination error or blocked); done: ended otherwise")
    agent_id: Id | None = None
    parent_run_id: RunId | None = None
    limit: Limit = DEFAULT_LIMIT
    offset: Offset = 0
    order: Order = "desc"
    min_seq: MinSeq = None


# -- run writes (agentlog.gateway.http.write, agentlog.gateway.nats.service) -----------------------------------

MAX_ITEMS = 1000


class ContentPartIn(Model):
    """One part of a multimodal message: text, or an image / file as base64 `data` (with its
    `media_type`) or a `url`. Large binaries are kept in the Object Store by reference."""

    type: Literal["text", "image", "file"]
    text: str | None = None
    media_type: str | None = Field(default=None, description="e.g. image/png, application/pdf")
    data: str | None = Field(default=None, description="the bytes, base64")
    url: str | None = None
    filename: str | None = None


class InputMessage(Model):
    """One input message; a bare string is shorthand for `{"role": "user", "content": ...}`;
    `content` may be a list of parts (text, image, file)."""

    role: Literal["user", "system", "assistant", "tool"] = "user"
    content: str | list[ContentPartIn] = ""
    tool_call_id: Id | None = None


Messages = Annotated[str | list[InputMessage | str], Field(
    description="a string (one user message) or a list of {role, content} objects / strings")]


class DecisionIn(Model):
    """A human decision for a suspended tool call (DESIGN 4.3); idempotent on decision_id."""

    target_id: Id = Field(description="the suspended call id")
    decision_id: Id = Field(description="idempotency key of the decision")
    action: Literal["resume", "cancel"]
    result: Any = None
    reason: str | None = Field(default=None, max_length=10_000)
    updated_at: int = Field(default=0, ge=0, description="unix ms; the server's clock when 0")


#: A tool name or glob of a run's tool policy.
ToolPattern = Annotated[str, Field(min_length=1, max_length=256)]


class OverridesIn(Model):
    """This run's overrides of the agent's configuration, within what the agent allows (its
    `overrides` policy; anything else is a 400 `override_not_allowed`)."""

    model: str | None = Field(default=None, min_length=1, max_length=256, description="a model the agent allows")
    system_prompt: str | None = Field(default=None, max_length=100_000,
                                      description="replaces the agent's system prompt, if it allows that")
    options: dict[str, Any] = Field(default_factory=dict, description="provider options (temperature...) the "
                                                                      "agent allows, over its model_options")
    allowed_tools: list[ToolPattern] | None = Field(
        default=None, max_length=MAX_ITEMS,
        description="only these of the agent's tools (names or globs) for this run, if the agent allows that")
    excluded_tools: list[ToolPattern] = Field(
        default_factory=list, max_length=MAX_ITEMS,
        description="none of these of the agent's tools (names or globs) for this run, if the agent allows that")


class ContextIn(Model):
    """Context for the model (shown in the system prompt, after the agent's own)."""

    description: str = Field(max_length=10_000)
    value: str = Field(max_length=100_000)


class StartRunBody(Model):
    agent_id: Id
    thread_id: Id | None = Field(default=None, description="a new thread when absent")
    run_id: RunId | None = Field(default=None, description="generated when absent")
    messages: Messages = Field(default_factory=list)
    parent_run_id: RunId | None = Field(default=None, description="continue after this run (lineage)")
    decisions: list[DecisionIn] = Field(default_factory=list, max_length=MAX_ITEMS,
                                        description="for the waiting parent run's suspended calls")
    resource_id: ResourceId | None = Field(default=None, description="owner of a new thread (tenant scoping)")
    overrides: OverridesIn | None = Field(default=None, description="model / system prompt / options for this run")
    context: list[ContextIn] = Field(default_factory=list, max_length=MAX_ITEMS,
                                     description="context for the model, recorded with the run")
    state: dict[str, Any] | None = Field(default=None, description="merged into the thread's state at run start "
                                                                     "(top-level keys; recorded as a state patch)")


class BranchPoint(Model):
    """Where a counterfactual branch of a run departs from it: one of `decision`, `inference`."""

    decision: Id | None = Field(default=None, description="the id of a tool call of the run that waited for a "
                                                          "decision: the branch takes `decision` instead")
    inference: Annotated[int, Field(ge=1)] | Id | None = Field(
        default=None, description="the id of an assistant message of the run, or the number of one of its "
                                  "inferences (1-based): the branch takes `answer` instead")

    def model_post_init(self, _context: Any) -> None:
        if (self.decision is None) == (self.inference is None):
            raise ValueError("give one of decision, inference")


class BranchDecision(Model):
    """The decision the branch takes instead (its call is the branch point's)."""

    decision_id: Id | None = Field(default=None, description="idempotency key; generated when absent")
    action: Literal["resume", "cancel"]
    result: Any = None
    reason: str | None = Field(default=None, max_length=10_000)


class BranchToolCall(Model):
    id: Id | None = Field(default=None, description="the call id; generated when absent")
    name: str = Field(min_length=1, max_length=256)
    arguments: dict[str, Any] = Field(default_factory=dict)


class BranchAnswer(Model):
    """The answer the branch takes instead of the model's: an assistant message."""

    content: str = Field(default="", max_length=1_000_000)
    tool_calls: list[BranchToolCall] = Field(default_factory=list, max_length=64)

    def model_post_init(self, _context: Any) -> None:
        if not self.content and not self.tool_calls:
            raise ValueError("an answer needs content and/or tool_calls")
        ids = [c.id for c in self.tool_calls if c.id is not None]
        if len(ids) != len(set(ids)):
            raise ValueError("tool call ids must be distinct")


class CounterfactualBody(Model):
    at: BranchPoint
    decision: BranchDecision | None = Field(default=None, description="with at.decision")
    answer: BranchAnswer | None = Field(default=None, description="with at.inference")
    new_thread_id: Id | None = Field(default=None, description=(
        "the branch's thread id; generated when absent. The same request again (same run, id and body) "
        "answers the same branch, finishing it if an earlier attempt was cut short"))

    def model_post_init(self, _context: Any) -> None:
        if (self.at.decision is None) != (self.decision is None) or (self.at.inference is None) != (self.answer is None):
            raise ValueError("at.decision goes with decision, at.inference with answer")


class CounterfactualRequest(CounterfactualBody):
    run_id: RunId


class DiffRequest(Model):
    thread_id: Id
    other_thread_id: Id


class RunInputsBody(Model):
    decisions: list[DecisionIn] = Field(default_factory=list, max_length=MAX_ITEMS)
    messages: Messages = Field(default_factory=list, description="non-empty: a continuation run")
    mode: Literal["interrupt", "steer", "follow_up"] | None = Field(
        default=None, description="with messages on a running run (without a mode such a request is a 409): "
                                  "`steer` queues them for its next step boundary, `follow_up` for when it "
                                  "would otherwise end (both: the same run goes on with them; 409 "
                                  "`run_finished` once it has finished); `interrupt` cancels it and "
                                  "continues with the messages, one command")

    def model_post_init(self, _context: Any) -> None:
        if not self.decisions and not self.messages:
            raise ValueError("give decisions and/or messages")


class CancelRunBody(Model):
    reason: str | None = Field(default=None, max_length=1000)


# -- NATS request bodies: the HTTP inputs plus the path ids ------------------------------------


class AgentsQuery(Query):
    """`agents.list` takes nothing (an empty body)."""


class RunRef(GetViewQuery):
    run_id: RunId


class ThreadRef(GetViewQuery):
    thread_id: Id


class RunInputsRequest(RunInputsBody):
    run_id: RunId


class CancelRunRequest(CancelRunBody):
    run_id: RunId


class ThreadMessagesRequest(MessagesQuery):
    thread_id: Id


class RevokeRequest(RevokeQuery):
    thread_id: Id


class ForkThreadRequest(ForkThread):
    thread_id: Id = Field(description="the source thread")


__all__ = [
    "AgentsQuery", "BranchAnswer", "BranchDecision", "BranchPoint", "BranchToolCall", "CounterfactualBody", "CounterfactualRequest", "DiffRequest",
    "CancelRunBody", "CancelRunRequest", "DecisionIn", "InputMessage", "RunInputsBody", "RunInputsRequest",
    "RunRef", "StartRunBody", "ThreadMessagesRequest", "ThreadRef",
    "CreateThread", "DeleteThreadQuery", "ForkThread", "ForkThreadRequest", "ReplaceMessage", "RevokeQuery", "RevokeRequest", "EventsQuery", "GetViewQuery", "ListRunsQuery", "ListThreadsQuery",
    "MAX_LIMIT", "MessagesQuery", "StateQuery", "UpdateThread",
]
