"""The query views of DESIGN 3: `ThreadView`, `RunView` and the per-call `CallView`.

Frozen msgspec Structs: JSON-encodable as they are (they are the KV values), cheap to compare in
tests, and safe to hand to other tasks. Times are the commit `ts` (unix ms) of the events that
made them, never a wall clock, so the same log always gives the same views.
"""

from __future__ import annotations

import dataclasses
import operator
from collections import OrderedDict
from typing import Any, Literal, TypeVar

import msgspec

from agentlog.eventlog.events import (
    AppRef,
    ForkOrigin,
    PayloadRef,
    RunOverrides,
    SuspendTicket,
    Termination,
    ToolCallDecision,
    Usage,
)

CallStatus = Literal["new", "running", "suspended", "resuming", "succeeded", "failed", "cancelled"]
RunStatus = Literal["running", "waiting", "done", "failed"]

#: Call statuses that mean "work in progress": the run is running while any call has one.
ACTIVE_CALL_STATUSES: frozenset[str] = frozenset({"running", "resuming"})
TERMINAL_CALL_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
#: Run statuses of a finished run (`RunFinished` folded): `failed` when its termination is one of
#: `FAILED_TERMINATIONS`, else `done`.
FINISHED_RUN_STATUSES: frozenset[str] = frozenset({"done", "failed"})
#: Terminations of a run that failed: an error (a model, a plugin, a dead-lettered command) or a
#: block. Natural ends, stop conditions, a plugin's request and a cancel are `done`.
FAILED_TERMINATIONS: frozenset[str] = frozenset({"error", "blocked"})


def finished_status(termination: Termination) -> RunStatus:
    """The status of a run that finished with `termination`: `failed` or `done`."""
    return "failed" if termination.type in FAILED_TERMINATIONS else "done"


class _View(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Views keep their defaults on the wire too (no omit_defaults): a KV reader sees every field.

    `gc=False`, like the event values they hold (`agentlog.eventlog.events._Value`, which says why
    that is safe): frozen, only JSON data and values inside; the collector need not
    track the hundreds of call views a cold resume decodes, or those a chunk cache keeps.

    Subclasses repeat `frozen=True` for mypy (msgspec inherits it; see `agentlog.eventlog.events._Value`)."""


class CallView(_View, frozen=True):
    """One tool call of a run, through new -> running -> suspended -> resuming -> terminal.

    `state` is the call's `tool_call` scope state; it is cleared when the call completes.
    `verdict`/`rule` come from the permission gate, `decision` from the human.
    """

    call_id: str
    status: CallStatus = "new"
    name: str | None = None
    arguments: dict[str, Any] = {}
    result: Any = None
    #: A result stored by reference (too large for a commit; the view keeps the reference, as a
    #: KV value has the same size limit). Read the run's events for the value.
    result_ref: PayloadRef | None = None
    ticket: SuspendTicket | None = None
    decision: ToolCallDecision | None = None
    resume_mode: str | None = None
    verdict: str | None = None
    rule: str | None = None
    message_id: str | None = None
    state: dict[str, Any] = {}
    created: int = 0
    updated: int = 0
    #: What the tool said about its result for clients (`ToolCallCompleted.details`); the model
    #: never sees it.
    details: Any = None
    #: The call is suspended in doubt (status `suspended`, its ticket's action `in_doubt`): it
    #: was running when its run was interrupted, and its tool is not idempotent, so it waits for
    #: a human to say `mark_done`, `retry` or `cancel` (`agentlog.runtime.loop.in_doubt`).
    in_doubt: bool = False


def calls_in_doubt(run: RunView) -> list[str]:
    """The ids of the run's calls suspended in doubt (`CallView.in_doubt`), in the view's order."""
    return [c.call_id for c in run.calls.values() if c.in_doubt]


class RunView(_View, frozen=True):
    """One run. `status` is derived from the calls while it runs, and from its termination once
    finished (see `fold.derive_status`).

    Usage: `inference_usage` is the running sum of `InferenceCompleted.usage`; `usage` equals it
    while the run is live, and at `RunFinished` becomes `RunFinished.usage` when that is non-zero.
    The runtime's final figure is authoritative (it is what its token budget used and may count
    calls that never produced an InferenceCompleted, e.g. failed retries); the sum is the live
    estimate and the fallback for a run finished without a usage figure.
    """

    run_id: str
    thread_id: str
    agent_id: str | None = None
    parent_run_id: str | None = None
    parent_thread_id: str | None = None
    origin: str | None = None
    #: The app that started the run (`RunStarted.app`), if recorded.
    app: AppRef | None = None
    status: RunStatus = "running"
    termination: Termination | None = None
    cancel_requested: bool = False
    steps: int = 0
    last_step: int | None = None
    inferences: int = 0
    usage: Usage = Usage()
    inference_usage: Usage = Usage()
    #: USD: the sum of the run's recorded `InferenceCompleted.cost`; None while no inference
    #: of the run was priced.
    cost: float | None = None
    #: The model a pool chose for the run (`RunStarted.model`), if it names a pool.
    model: str | None = None
    #: The agent driving the run now: `agent_id`, or the target of its last handoff
    #: (`AgentHandedOff`, `agentlog.runtime.agents.handoff`).
    active_agent: str | None = None
    #: The run's handoffs in order: `{from_agent, to_agent, reason, call_id, seq}`.
    handoffs: list[dict[str, Any]] = []
    #: The request's overrides of the agent's model, system prompt and options
    #: (`RunStarted.overrides`), if it made any.
    overrides: RunOverrides | None = None
    message_count: int = 0
    calls: dict[str, CallView] = {}
    #: How many of the run's oldest finished calls `calls` leaves out, so that the view stays
    #: within what one KV value can hold (`ViewEncoder.fit`); 0 for all but very long runs or
    #: runs of very large results. The run's events hold every call.
    calls_elided: int = 0
    state: dict[str, Any] = {}
    #: The state was more than one KV value holds with the rest of the view (`ViewEncoder.fit`):
    #: `state` is left empty and patches are not folded onto it until a `StateReplaced` sets
    #: it whole again. The HTTP routes then fold the state from the log.
    state_elided: bool = False
    rejected_patches: int = 0
    created: int = 0
    updated: int = 0
    last_seq: int = 0

    @property
    def finished(self) -> bool:
        """Whether the run has ended (`done` or `failed`)."""
        return self.status in FINISHED_RUN_STATUSES


class ThreadView(_View, frozen=True):
    """One thread. `version` is the seq of the last commit applied (the thread's OCC version).

    Messages are not kept here (a KV value must stay small); `message_count` is, and
    `fold.fold_messages` / `timetravel.messages_at` give the messages themselves.
    """

    thread_id: str
    resource_id: str | None = None
    parent_thread_id: str | None = None
    metadata: dict[str, Any] = {}
    created: int = 0
    updated: int = 0
    version: int = 0
    message_count: int = 0
    state: dict[str, Any] = {}
    #: The state was more than one KV value holds with the rest of the view (`ViewEncoder.fit`):
    #: `state` is left empty and patches are not folded onto it until a `StateReplaced` sets
    #: it whole again. The HTTP routes then fold the state from the log.
    state_elided: bool = False
    run_ids: list[str] = []
    active_run_id: str | None = None
    deleted: bool = False
    rejected_patches: int = 0
    #: USD: the sum of the recorded inference costs of all the thread's runs (None: none priced).
    cost: float | None = None
    #: The thread and event position this thread was forked from (None: not a fork).
    forked_from: ForkOrigin | None = None
    #: The agent the thread is with: its last run's agent after that run's handoffs. A
    #: continuation that names no agent (`POST /v1/runs/{id}/inputs`) starts with it.
    active_agent: str | None = None

    @property
    def last_seq(self) -> int:
        return self.version


def empty_thread(thread_id: str) -> ThreadView:
    return ThreadView(thread_id=thread_id)


def empty_run(run_id: str, thread_id: str) -> RunView:
    return RunView(run_id=run_id, thread_id=thread_id)


_thread_encoder = msgspec.json.Encoder()
_thread_decoder = msgspec.json.Decoder(ThreadView)
_run_decoder = msgspec.json.Decoder(RunView)


def encode_view(view: ThreadView | RunView) -> bytes:
    return _thread_encoder.encode(view)


V = TypeVar("V", ThreadView, RunView)


class ViewEncoder:
    """`encode_view` for a writer that writes the same runs again and again (the projection
    runner writes a run's view after each of its commits): it keeps, per run, the encoded calls
    of the view it wrote last, so a write encodes only the calls that changed. The fold is
    copy-on-write (a call that did not change is the very object it was) and keeps calls in
    order, so the calls that did not change are a run of the last write's calls, found by
    identity at C speed (`_Calls.common`): a long run's write costs its few live calls, not its
    hundreds of finished ones. Same bytes as `encode_view` (a property test proves it).

    Kept for runs of at least `min_calls` calls (below that encoding all is as cheap), least
    recently written dropped first past `capacity` bytes of kept encodings."""

    def __init__(self, *, capacity: int = 32 * 1024 * 1024, min_calls: int = 32) -> None:
        self.capacity = capacity
        self.min_calls = min_calls
        self.size = 0
        self._runs: OrderedDict[str, _Calls] = OrderedDict()
        #: The views `fit` returned and their bytes, by identity, until they are encoded (a
        #: writer fits a batch's views, then writes them: each is encoded once).
        self._fitted: dict[int, tuple[ThreadView | RunView, bytes]] = {}

    def encode(self, view: ThreadView | RunView) -> bytes:
        fitted = self._fitted.pop(id(view), None)
        if fitted is not None and fitted[0] is view:
            return fitted[1]
        return self._encode(view)

    def forget_fitted(self) -> None:
        """Drop the encodings `fit` kept and nobody asked for (a batch that failed before its
        writes)."""
        self._fitted.clear()

    def _encode(self, view: ThreadView | RunView) -> bytes:
        if not isinstance(view, RunView) or len(view.calls) < self.min_calls:
            return encode_view(view)
        calls = self._calls(view)
        # the calls as raw JSON in place of the dict: the same bytes as encoding the dict
        return _thread_encoder.encode(msgspec.structs.replace(view, calls=msgspec.Raw(calls.json())))

    def _kept(self, view: V, data: bytes) -> V:
        self._fitted[id(view)] = (view, data)
        return view

    def fit(self, view: RunView, limit: int) -> RunView:
        """`view` as one KV value of at most `limit` bytes holds it (a view over the server's
        max payload cannot be written, and the projections would stop for every run): without
        its oldest finished calls, as few as it takes (`calls_elided`); if even all of them are
        not enough, without its state (`state_elided`) and as few finished calls as that
        leaves to drop. Live calls are always kept: readers act on them. Pure but for the
        cache."""
        fitted = self._without_finished_calls(view, limit)
        if fitted is not None:
            return fitted
        bare = msgspec.structs.replace(view, state={}, state_elided=True)
        fitted = self._without_finished_calls(bare, limit)
        if fitted is not None:
            return fitted
        finished = {k for k, c in view.calls.items() if c.status in TERMINAL_CALL_STATUSES}
        bare = msgspec.structs.replace(bare, calls={k: c for k, c in view.calls.items() if k not in finished},
                                       calls_elided=view.calls_elided + len(finished))
        return self._kept(bare, self._encode(bare))  # still over: its live calls alone are

    def fit_thread(self, view: ThreadView, limit: int) -> ThreadView:
        """`view` as one KV value of at most `limit` bytes holds it (see `fit`): without its
        state when over (`state_elided`; its other fields are small, but for its run ids,
        ~35,000 of which would take a KV value)."""
        data = self._encode(view)
        if len(data) <= limit:
            return self._kept(view, data)
        view = msgspec.structs.replace(view, state={}, state_elided=True)
        return self._kept(view, self._encode(view))

    def _without_finished_calls(self, view: RunView, limit: int) -> RunView | None:
        """The view (kept with its bytes) without its oldest finished calls, as few as fit it in
        `limit` (none if it fits whole); None if it does not fit without all of them."""
        data = self._encode(view)
        if len(data) <= limit:
            return self._kept(view, data)
        excess = len(data) - limit
        calls = dict(view.calls)
        dropped = 0
        encoded = self._runs.get(view.run_id)
        if encoded is not None and not (len(encoded.views) == len(calls)
                                        and all(map(operator.is_, encoded.views, calls.values()))):
            encoded = None  # not this view's (one below `min_calls` is not kept)
        for index, (call_id, call) in enumerate(view.calls.items()):  # oldest first, as folded
            if call.status not in TERMINAL_CALL_STATUSES:
                continue
            # its key, colon, value and comma (the count's own digits: the check below)
            excess -= (encoded.entry_size(index) if encoded is not None
                       else len(_thread_encoder.encode(call_id)) + len(_thread_encoder.encode(call)) + 2)
            del calls[call_id]
            dropped += 1
            if excess <= 0:
                fitted = msgspec.structs.replace(view, calls=calls, calls_elided=view.calls_elided + dropped)
                data = self._encode(fitted)
                if len(data) <= limit:
                    return self._kept(fitted, data)
        return None

    def _calls(self, view: RunView) -> _Calls:
        before = self._runs.pop(view.run_id, None)
        if before is not None:
            self.size -= before.size
        encoded = _Calls.of(view.calls, before)
        self._runs[view.run_id] = encoded
        self.size += encoded.size
        while self.size > self.capacity and self._runs:
            _, dropped = self._runs.popitem(last=False)
            self.size -= dropped.size
        return encoded


@dataclasses.dataclass(slots=True)
class _Calls:
    """A run view's calls as written: the call views in order, and their JSON object entries
    (`"id":{...}`) joined by commas, with where each entry ends."""

    views: list[CallView]
    keys: list[str]
    joined: bytes
    ends: list[int]

    @property
    def size(self) -> int:
        return len(self.joined)

    def json(self) -> bytes:
        return b"{" + self.joined + b"}"

    def entry_size(self, index: int) -> int:
        """Bytes entry `index` takes in `joined`, a comma included."""
        return self.ends[index] - (self.ends[index - 1] if index else -1)

    @classmethod
    def of(cls, calls: dict[str, CallView], before: _Calls | None) -> _Calls:
        views, keys = list(calls.values()), list(calls)
        start, n = before.common(views, keys) if before is not None else (0, 0)
        if n:
            assert before is not None
            first = before.ends[start - 1] + 1 if start else 0  # past the comma before it
            joined_parts: list[bytes | memoryview] = [memoryview(before.joined)[first : before.ends[start + n - 1]]]
            ends = [end - first for end in before.ends[start : start + n]]
        else:
            joined_parts, ends = [], []
        pos = ends[-1] if ends else 0
        for key, view in zip(keys[n:], views[n:], strict=True):
            entry = b"".join((b"," if ends else b"", _thread_encoder.encode(key), b":", _thread_encoder.encode(view)))
            joined_parts.append(entry)
            pos += len(entry)
            ends.append(pos)
        return cls(views, keys, b"".join(joined_parts), ends)

    def common(self, views: list[CallView], keys: list[str]) -> tuple[int, int]:
        """(start, n): `views[:n]` are the very objects `self.views[start:start + n]`, under the
        same keys (the fold drops no call; `ViewEncoder.fit` drops the oldest, so a fitted
        view's calls start further in)."""
        if not views or not self.views:
            return 0, 0
        first = views[0]
        if self.views[0] is first:
            start = 0
        else:
            start = next((i for i, v in enumerate(self.views) if v is first), -1)
            if start < 0:
                return 0, 0
        same = list(map(operator.is_, views, self.views[start:]))
        n = same.index(False) if False in same else len(same)
        if keys[:n] != self.keys[start : start + n]:
            return 0, 0
        return start, n


def decode_thread(data: bytes) -> ThreadView:
    return _thread_decoder.decode(data)


def decode_run(data: bytes) -> RunView:
    """A stored run view, its status as the fold gives it now: a view written when every
    finished run was `done` reads as `failed` when its termination says so."""
    view = _run_decoder.decode(data)
    if view.status == "done" and view.termination is not None and view.termination.type in FAILED_TERMINATIONS:
        return msgspec.structs.replace(view, status="failed")
    return view
