"""Pure folds: events -> `ThreadView`, `RunView`, messages.

One implementation of the semantics lives in two small mutable accumulators (`_ThreadAcc`,
`_RunAcc`). The public per-event folds thaw a view, apply one event and freeze the result, so they
are pure (the input view is never changed). `Folder` keeps accumulators across many commits and
freezes once at the end: that is the hot path of the runner, the rebuild and time travel, and the
reason it is cheap (no copy per event). Nothing here does I/O or reads a clock: times are commit
timestamps, so the same log gives the same views everywhere.

Accumulator discipline (what keeps frozen views immutable without deep copies): containers that
are mutated in place (`run_ids`, `calls`) are copied on thaw and on freeze; documents (`state`,
`metadata`) are only ever replaced by new objects, never mutated, so they can be shared.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

import msgspec

from agentlog.eventlog.events import (
    IN_DOUBT_ACTION,
    AgentHandedOff,
    AnyEvent,
    AppRef,
    Commit,
    ForkOrigin,
    InferenceCompleted,
    Message,
    MessageAppended,
    RunCancelRequested,
    RunFinished,
    RunOverrides,
    RunStarted,
    StateCleared,
    StatePatched,
    StateReplaced,
    StateWritten,
    StepFinished,
    StepStarted,
    StoredCommit,
    Termination,
    ThreadCreated,
    ThreadDeleted,
    ThreadMetadataUpdated,
    ToolCallCompleted,
    ToolCallDecided,
    ToolCallGated,
    ToolCallResuming,
    ToolCallStarted,
    ToolCallSuspended,
    Usage,
)
from agentlog.projections.errors import InvalidPatch
from agentlog.projections.state import apply_ops, pointer, validate_patch, validate_state
from agentlog.projections.views import (
    ACTIVE_CALL_STATUSES,
    CallView,
    RunStatus,
    RunView,
    ThreadView,
    finished_status,
)

_replace = msgspec.structs.replace
_THREAD_FIELDS: tuple[str, ...] = ThreadView.__struct_fields__
_RUN_FIELDS: tuple[str, ...] = RunView.__struct_fields__


def derive_status(calls: Mapping[str, CallView], termination: Termination | None) -> RunStatus:
    """DESIGN 3: once finished (`termination` set), failed or done by its termination
    (`views.finished_status`); else running if any call is running/resuming; else waiting if any
    call is suspended; else (no calls, or all new/terminal) running."""
    if termination is not None:
        return finished_status(termination)
    waiting = False
    for call in calls.values():
        status = call.status
        if status in ACTIVE_CALL_STATUSES:
            return "running"
        if status == "suspended":
            waiting = True
    return "waiting" if waiting else "running"


def merge_metadata(metadata: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """JSON-merge-patch style, one level: a key set to null is removed. Returns a new dict."""
    merged = dict(metadata)
    for key, value in update.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


# -- accumulators ---------------------------------------------------------------------------------

_Acc = TypeVar("_Acc")


def _thawed(acc_cls: type[_Acc], view: Any, fields: tuple[str, ...]) -> _Acc:
    """An accumulator holding `view`'s fields as they are (no `__init__`: the caller copies what
    it mutates in place)."""
    acc = acc_cls.__new__(acc_cls)
    for name in fields:
        setattr(acc, name, getattr(view, name))
    return acc


def _fields(acc: Any, fields: tuple[str, ...]) -> dict[str, Any]:
    return {name: getattr(acc, name) for name in fields}


# -- thread ---------------------------------------------------------------------------------------


class _ThreadAcc:
    __slots__ = _THREAD_FIELDS
    # The fields of `ThreadView` (the slots above), declared for the type checker.
    thread_id: str
    resource_id: str | None
    parent_thread_id: str | None
    metadata: dict[str, Any]
    created: int
    updated: int
    version: int
    message_count: int
    state: dict[str, Any]
    state_elided: bool
    run_ids: list[str]
    active_run_id: str | None
    deleted: bool
    rejected_patches: int
    cost: float | None
    forked_from: ForkOrigin | None
    active_agent: str | None

    @classmethod
    def thaw(cls, view: ThreadView) -> _ThreadAcc:
        acc = _thawed(cls, view, _THREAD_FIELDS)
        acc.run_ids = list(view.run_ids)
        return acc

    def freeze(self) -> ThreadView:
        values = _fields(self, _THREAD_FIELDS)
        values["run_ids"] = list(self.run_ids)
        return ThreadView(**values)

    def apply(self, event: AnyEvent, seq: int, ts: int, run_id: str | None) -> None:
        if self.version == 0:
            self.created = ts
        self.updated = ts
        self.version = seq
        handler = _THREAD_HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event, run_id)

    def _created(self, ev: ThreadCreated, run_id: str | None) -> None:
        self.resource_id = ev.resource_id
        self.parent_thread_id = ev.parent_thread_id
        self.metadata = merge_metadata(self.metadata, ev.metadata)
        self.forked_from = ev.forked_from

    def _metadata(self, ev: ThreadMetadataUpdated, run_id: str | None) -> None:
        self.metadata = merge_metadata(self.metadata, ev.metadata)

    def _deleted(self, ev: ThreadDeleted, run_id: str | None) -> None:
        self.deleted = True

    def _run_started(self, ev: RunStarted, run_id: str | None) -> None:
        if ev.run_id not in self.run_ids:
            self.run_ids.append(ev.run_id)
        self.active_run_id = ev.run_id
        self.active_agent = ev.agent_id

    def _handed_off(self, ev: AgentHandedOff, run_id: str | None) -> None:
        self.active_agent = ev.to_agent

    def _run_finished(self, ev: RunFinished, run_id: str | None) -> None:
        if self.active_run_id == run_id:
            self.active_run_id = None

    def _message(self, ev: MessageAppended, run_id: str | None) -> None:
        self.message_count += 1

    def _inference(self, ev: InferenceCompleted, run_id: str | None) -> None:
        if ev.cost is not None:
            self.cost = ev.cost if self.cost is None else self.cost + ev.cost

    def _patched(self, ev: StatePatched, run_id: str | None) -> None:
        if ev.scope == "thread" and not self.state_elided:  # elided: nothing to patch
            try:
                self.state = validate_patch(self.state, ev.ops)
            except InvalidPatch:
                # The runtime validates before appending; a foreign bad patch is skipped, counted,
                # and skipped the same way by every fold (deterministic), never a crash.
                self.rejected_patches += 1

    def _replaced(self, ev: StateReplaced, run_id: str | None) -> None:
        if ev.scope == "thread":
            try:
                self.state = validate_state(ev.state)
            except InvalidPatch:
                self.rejected_patches += 1
            else:
                self.state_elided = False  # whole again

    def _written(self, ev: StateWritten, run_id: str | None) -> None:
        if ev.scope == "thread" and not self.state_elided:
            if not key_ops_valid(ev.ops, ev.key):
                self.rejected_patches += 1
                return
            try:
                self.state = apply_ops(self.state, ev.ops)
            except InvalidPatch:
                self.rejected_patches += 1

    def _cleared(self, ev: StateCleared, run_id: str | None) -> None:
        if ev.scope == "thread" and not self.state_elided:
            self.state = without_keys(self.state, ev.keys)


def without_keys(state: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """`state` without the members `keys` (a new dict when any is present; the same one else)."""
    if not any(k in state for k in keys):
        return state
    drop = set(keys)
    return {k: v for k, v in state.items() if k not in drop}


def key_ops_valid(ops: Sequence[Any], key: str) -> bool:
    """Whether every op of a `StateWritten` of `key` stays under `/<key>` (a write of one key
    never touches another's value)."""
    root = pointer([key])
    return all(isinstance(op, Mapping) and _under(op.get("path"), root)
               and (op.get("op") not in ("move", "copy") or _under(op.get("from"), root)) for op in ops)


def _under(path: Any, root: str) -> bool:
    return isinstance(path, str) and (path == root or path.startswith(root + "/"))


_THREAD_HANDLERS: dict[type, Any] = {
    ThreadCreated: _ThreadAcc._created,
    ThreadMetadataUpdated: _ThreadAcc._metadata,
    ThreadDeleted: _ThreadAcc._deleted,
    RunStarted: _ThreadAcc._run_started,
    RunFinished: _ThreadAcc._run_finished,
    AgentHandedOff: _ThreadAcc._handed_off,
    MessageAppended: _ThreadAcc._message,
    InferenceCompleted: _ThreadAcc._inference,
    StatePatched: _ThreadAcc._patched,
    StateReplaced: _ThreadAcc._replaced,
    StateWritten: _ThreadAcc._written,
    StateCleared: _ThreadAcc._cleared,
}


# -- run ------------------------------------------------------------------------------------------


class _RunAcc:
    """The run fold's accumulator. `derive_status` over every call on each call event made a
    run's fold quadratic in its calls, so the status is kept from two counters instead
    (calls running/resuming, calls suspended), updated per call change: O(1) per event.
    `calls` is copy-on-write: `freeze` hands the dict to the view and the next call change
    copies it, so freezing after every commit (`RunFolder.view`) costs no copy per freeze.

    `_lookup` (see `RunFolder`) finds a call that is not in `calls` but is the run's all the
    same: a finished call of a view whose finished calls are kept elsewhere."""

    __slots__ = (*_RUN_FIELDS, "_active", "_lookup", "_suspended", "_shared")
    # The fields of `RunView` (the slots above), declared for the type checker.
    run_id: str
    thread_id: str
    agent_id: str | None
    parent_run_id: str | None
    parent_thread_id: str | None
    origin: str | None
    app: AppRef | None
    status: RunStatus
    termination: Termination | None
    cancel_requested: bool
    steps: int
    last_step: int | None
    inferences: int
    usage: Usage
    inference_usage: Usage
    cost: float | None
    model: str | None
    active_agent: str | None
    handoffs: list[dict[str, Any]]
    overrides: RunOverrides | None
    message_count: int
    calls: dict[str, CallView]
    state: dict[str, Any]
    state_elided: bool
    rejected_patches: int
    created: int
    updated: int
    last_seq: int
    _active: int
    _lookup: Callable[[str], CallView | None] | None
    _suspended: int
    _shared: bool

    @classmethod
    def thaw(cls, view: RunView) -> _RunAcc:
        acc = _thawed(cls, view, _RUN_FIELDS)
        acc._shared = True  # the view's own dict: copied at the first call change
        acc._lookup = None
        active = suspended = 0
        for call in view.calls.values():  # one pass (a resumed long run thaws ~220 calls)
            status = call.status
            if status in ACTIVE_CALL_STATUSES:
                active += 1
            elif status == "suspended":
                suspended += 1
        acc._active, acc._suspended = active, suspended
        return acc

    def freeze(self) -> RunView:
        values = _fields(self, _RUN_FIELDS)
        self._shared = True
        return RunView(**values)

    def apply(self, event: AnyEvent, seq: int, ts: int) -> None:
        if self.last_seq == 0:
            self.created = ts
        self.updated = ts
        self.last_seq = seq
        handler = _RUN_HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event, ts)

    # run lifecycle
    def _started(self, ev: RunStarted, ts: int) -> None:
        self.agent_id = ev.agent_id
        self.parent_run_id = ev.parent_run_id
        self.parent_thread_id = ev.parent_thread_id
        self.origin = ev.origin
        self.app = ev.app
        self.model = ev.model
        self.overrides = ev.overrides
        self.active_agent = ev.agent_id

    def _handed_off(self, ev: AgentHandedOff, ts: int) -> None:
        self.active_agent = ev.to_agent
        entry: dict[str, Any] = {"from_agent": ev.from_agent, "to_agent": ev.to_agent, "seq": self.last_seq}
        if ev.reason is not None:
            entry["reason"] = ev.reason
        if ev.call_id is not None:
            entry["call_id"] = ev.call_id
        self.handoffs = [*self.handoffs, entry]  # a new list: the frozen view's stays as it was

    def _cancel_requested(self, ev: RunCancelRequested, ts: int) -> None:
        self.cancel_requested = True

    def _finished(self, ev: RunFinished, ts: int) -> None:
        self.termination = ev.termination
        self.usage = ev.usage if ev.usage.total_tokens > 0 else self.inference_usage
        self.state, self.state_elided = {}, False  # run scope ends with the run
        self.status = finished_status(ev.termination)

    def _step_started(self, ev: StepStarted, ts: int) -> None:
        self.steps += 1
        self.last_step = ev.step

    def _step_finished(self, ev: StepFinished, ts: int) -> None:
        self.last_step = ev.step

    def _message(self, ev: MessageAppended, ts: int) -> None:
        self.message_count += 1

    def _inference(self, ev: InferenceCompleted, ts: int) -> None:
        self.inferences += 1
        self.inference_usage = self.inference_usage + ev.usage
        if ev.cost is not None:
            self.cost = ev.cost if self.cost is None else self.cost + ev.cost
        if self.termination is None:  # still live: the sum is the estimate
            self.usage = self.inference_usage

    # tool calls
    def _call(self, call_id: str, ts: int) -> CallView:
        call = self.calls.get(call_id)
        if call is None and self._lookup is not None:
            call = self._lookup(call_id)
        if call is None:
            call = CallView(call_id=call_id, created=ts, updated=ts)
        return call

    def _set_call(self, call: CallView) -> None:
        if self._shared:
            self.calls = dict(self.calls)
            self._shared = False
        old = self.calls.get(call.call_id)
        if old is not None:
            self._count(old.status, -1)
        self._count(call.status, 1)
        self.calls[call.call_id] = call
        if self.termination is None:  # derive_status, from the counters
            self.status = "running" if self._active else "waiting" if self._suspended else "running"

    def _count(self, status: str, delta: int) -> None:
        if status in ACTIVE_CALL_STATUSES:
            self._active += delta
        elif status == "suspended":
            self._suspended += delta

    def _gated(self, ev: ToolCallGated, ts: int) -> None:
        self._set_call(_replace(self._call(ev.call_id, ts), verdict=ev.verdict, rule=ev.rule, updated=ts))

    def _call_started(self, ev: ToolCallStarted, ts: int) -> None:
        call = self._call(ev.call_id, ts)
        self._set_call(_replace(call, status="running", name=ev.name, arguments=ev.arguments, in_doubt=False,
                                updated=ts))

    def _call_suspended(self, ev: ToolCallSuspended, ts: int) -> None:
        call = self._call(ev.call_id, ts)
        if ev.ticket.action == IN_DOUBT_ACTION:  # waits for a decision of its own
            self._set_call(_replace(call, status="suspended", ticket=ev.ticket, in_doubt=True, decision=None,
                                    resume_mode=None, updated=ts))
            return
        self._set_call(_replace(call, status="suspended", ticket=ev.ticket, updated=ts))

    def _call_decided(self, ev: ToolCallDecided, ts: int) -> None:
        # A decision alone does not move the call: it stays suspended (the run keeps waiting)
        # until the runtime resumes it. That is what makes partial decisions wait for the rest.
        self._set_call(_replace(self._call(ev.call_id, ts), decision=ev.decision, updated=ts))

    def _call_resuming(self, ev: ToolCallResuming, ts: int) -> None:
        call = self._call(ev.call_id, ts)
        self._set_call(_replace(call, status="resuming", resume_mode=ev.mode, in_doubt=False, updated=ts))

    def _call_completed(self, ev: ToolCallCompleted, ts: int) -> None:
        call = self._call(ev.call_id, ts)
        self._set_call(
            _replace(
                call, status=ev.outcome, result=ev.result, result_ref=ev.result_ref, message_id=ev.message_id,
                details=ev.details, state={}, in_doubt=False, updated=ts,  # tool_call scope ends with the call
            )
        )

    # state
    def _patched(self, ev: StatePatched, ts: int) -> None:
        self._scoped(ev.scope, ev.call_id, lambda doc: validate_patch(doc, ev.ops), ts)

    def _scoped(self, scope: str, call_id: str | None, apply: Callable[[dict[str, Any]], dict[str, Any]],
                ts: int) -> None:
        """Change the run scope's state (unless elided: nothing to change) or a tool call's with
        `apply`; a change that does not apply, or a call scope without a call, is counted as
        rejected. Other scopes are not the run's."""
        if scope == "run":
            if self.state_elided:
                return
            try:
                self.state = apply(self.state)
            except InvalidPatch:
                self.rejected_patches += 1
        elif scope == "tool_call":
            if call_id is None:
                self.rejected_patches += 1
                return
            call = self._call(call_id, ts)
            try:
                state = apply(call.state)
            except InvalidPatch:
                self.rejected_patches += 1
                return
            self._set_call(_replace(call, state=state, updated=ts))

    def _replaced(self, ev: StateReplaced, ts: int) -> None:
        if ev.scope == "thread":
            return
        try:
            state = validate_state(ev.state)
        except InvalidPatch:
            self.rejected_patches += 1
            return
        if ev.scope == "run":
            self.state = state
            self.state_elided = False  # whole again
        elif ev.call_id is None:
            self.rejected_patches += 1
        else:
            self._set_call(_replace(self._call(ev.call_id, ts), state=state, updated=ts))

    def _written(self, ev: StateWritten, ts: int) -> None:
        if ev.scope in ("run", "tool_call") and not key_ops_valid(ev.ops, ev.key):
            self.rejected_patches += 1
            return
        self._scoped(ev.scope, ev.call_id, lambda doc: apply_ops(doc, ev.ops), ts)

    def _cleared(self, ev: StateCleared, ts: int) -> None:
        if ev.scope == "run":
            if not self.state_elided:
                self.state = without_keys(self.state, ev.keys)
        elif ev.scope == "tool_call" and ev.call_id is not None:
            call = self._call(ev.call_id, ts)
            state = without_keys(call.state, ev.keys)
            if state is not call.state:
                self._set_call(_replace(call, state=state, updated=ts))


_RUN_HANDLERS: dict[type, Any] = {
    RunStarted: _RunAcc._started,
    RunCancelRequested: _RunAcc._cancel_requested,
    RunFinished: _RunAcc._finished,
    AgentHandedOff: _RunAcc._handed_off,
    StepStarted: _RunAcc._step_started,
    StepFinished: _RunAcc._step_finished,
    MessageAppended: _RunAcc._message,
    InferenceCompleted: _RunAcc._inference,
    ToolCallGated: _RunAcc._gated,
    ToolCallStarted: _RunAcc._call_started,
    ToolCallSuspended: _RunAcc._call_suspended,
    ToolCallDecided: _RunAcc._call_decided,
    ToolCallResuming: _RunAcc._call_resuming,
    ToolCallCompleted: _RunAcc._call_completed,
    StatePatched: _RunAcc._patched,
    StateReplaced: _RunAcc._replaced,
    StateWritten: _RunAcc._written,
    StateCleared: _RunAcc._cleared,
}


# -- public per-event folds -----------------------------------------------------------------------


def fold_thread(
    view: ThreadView, event: AnyEvent, seq: int, ts: int, run_id: str | None = None
) -> ThreadView:
    """The thread view after `event` (of a commit at `seq`, committed at `ts`, of run `run_id`
    or None for a thread-level commit). Pure: `view` is not changed. Start from
    `ThreadView(thread_id=...)`."""
    acc = _ThreadAcc.thaw(view)
    acc.apply(event, seq, ts, run_id)
    return acc.freeze()


def fold_run(view: RunView, event: AnyEvent, seq: int, ts: int) -> RunView:
    """The run view after `event` of a commit of this run. Pure. Start from
    `RunView(run_id=..., thread_id=...)`."""
    acc = _RunAcc.thaw(view)
    acc.apply(event, seq, ts)
    return acc.freeze()


def fold_messages(messages: Sequence[Message], event: AnyEvent) -> Sequence[Message]:
    """The thread's messages after `event`, in log order. Pure: returns a new list when the event
    appends one, else the input unchanged."""
    if type(event) is MessageAppended:
        return [*messages, event.message]
    return messages


class RunFolder:
    """One run's view kept incrementally: each commit of the run is folded once (`apply`), and
    `view()` freezes the accumulator only when something changed since the last freeze. What a
    `RunHandle` uses instead of refolding all of the run's commits on every `view()`.

    `view` may leave out finished calls (a run resumed from a snapshot keeps them apart,
    undecoded: `RunHandle`): `lookup` then finds such a call should a later event touch it, and
    the folded view holds it from then on. Finished calls never count towards the status, so the
    status of the view without them is the run's status."""

    __slots__ = ("_acc", "_view")

    def __init__(self, view: RunView, lookup: Callable[[str], CallView | None] | None = None) -> None:
        self._acc = _RunAcc.thaw(view)
        self._acc._lookup = lookup
        self._view: RunView | None = view

    def apply(self, stored: StoredCommit) -> None:
        """Fold one commit of this run (apply-once: a seq already folded changes nothing)."""
        acc = self._acc
        if stored.seq <= acc.last_seq:
            return
        ts = stored.commit.ts
        for event in stored.commit.events:
            acc.apply(event, stored.seq, ts)
        self._view = None

    def view(self) -> RunView:
        if self._view is None:
            self._view = self._acc.freeze()
        return self._view


# -- many commits ---------------------------------------------------------------------------------


class Views(NamedTuple):
    threads: dict[str, ThreadView]
    runs: dict[str, RunView]


class Folder:
    """Folds many commits with mutable accumulators and freezes on demand.

    Apply-once: a commit whose seq is <= a view's last applied seq is skipped for that view (so
    redelivered or replayed commits change nothing). `touched_*` name the views changed since
    the last `take_touched()`, which is what the runner writes (one KV put per view per batch).
    """

    __slots__ = ("_run_accs", "_runs", "_thread_accs", "_threads", "touched_runs", "touched_threads")

    def __init__(
        self,
        threads: Mapping[str, ThreadView] | None = None,
        runs: Mapping[str, RunView] | None = None,
    ) -> None:
        self._threads: dict[str, ThreadView] = dict(threads or {})
        self._runs: dict[str, RunView] = dict(runs or {})
        self._thread_accs: dict[str, _ThreadAcc] = {}
        self._run_accs: dict[str, _RunAcc] = {}
        self.touched_threads: set[str] = set()
        self.touched_runs: set[str] = set()

    def add_views(self, threads: Iterable[ThreadView] = (), runs: Iterable[RunView] = ()) -> None:
        """Seed views loaded from a store (ignored for ids already being folded)."""
        for t in threads:
            if t.thread_id not in self._thread_accs:
                self._threads[t.thread_id] = t
        for r in runs:
            if r.run_id not in self._run_accs:
                self._runs[r.run_id] = r

    def _thread_acc(self, thread_id: str) -> _ThreadAcc:
        acc = self._thread_accs.get(thread_id)
        if acc is None:
            view = self._threads.get(thread_id) or ThreadView(thread_id=thread_id)
            acc = self._thread_accs[thread_id] = _ThreadAcc.thaw(view)
        return acc

    def _run_acc(self, run_id: str, thread_id: str) -> _RunAcc:
        acc = self._run_accs.get(run_id)
        if acc is None:
            view = self._runs.get(run_id) or RunView(run_id=run_id, thread_id=thread_id)
            acc = self._run_accs[run_id] = _RunAcc.thaw(view)
        return acc

    def apply_commit(self, seq: int, commit: Commit, upto_index: int | None = None) -> None:
        """Fold the events of one commit (only those with index <= `upto_index` if given)."""
        events = commit.events if upto_index is None else commit.events[: upto_index + 1]
        ts = commit.ts
        thread = self._thread_acc(commit.thread_id)
        if seq > thread.version:
            run_id = commit.run_id
            for event in events:
                thread.apply(event, seq, ts, run_id)
            self.touched_threads.add(commit.thread_id)
        if commit.run_id is not None:
            run = self._run_acc(commit.run_id, commit.thread_id)
            if seq > run.last_seq:
                for event in events:
                    run.apply(event, seq, ts)
                self.touched_runs.add(commit.run_id)

    def apply(self, stored: StoredCommit) -> None:
        self.apply_commit(stored.seq, stored.commit)

    def apply_event(self, seq: int, commit: Commit, index: int) -> None:
        """Fold event `index` of one commit whose events before `index` this folder folded
        already (event by event, in order): time travel stops between two events of a commit.
        Apply-once holds per commit, as in `apply_commit`."""
        event = commit.events[index]
        thread = self._thread_acc(commit.thread_id)
        if seq > thread.version or (index > 0 and seq == thread.version):
            thread.apply(event, seq, commit.ts, commit.run_id)
            self.touched_threads.add(commit.thread_id)
        if commit.run_id is not None:
            run = self._run_acc(commit.run_id, commit.thread_id)
            if seq > run.last_seq or (index > 0 and seq == run.last_seq):
                run.apply(event, seq, commit.ts)
                self.touched_runs.add(commit.run_id)

    def thread_state(self, thread_id: str) -> dict:
        """The thread-scope state as folded so far, without freezing the view (states are
        replaced, never mutated in place, by the fold: the dict may be kept)."""
        acc = self._thread_accs.get(thread_id)
        view = acc if acc is not None else self._threads.get(thread_id)
        return view.state if view is not None else {}

    def run_state(self, run_id: str) -> dict:
        """The run-scope state as folded so far (see `thread_state`)."""
        acc = self._run_accs.get(run_id)
        view = acc if acc is not None else self._runs.get(run_id)
        return view.state if view is not None else {}

    def thread(self, thread_id: str) -> ThreadView | None:
        acc = self._thread_accs.get(thread_id)
        return acc.freeze() if acc is not None else self._threads.get(thread_id)

    def run(self, run_id: str) -> RunView | None:
        acc = self._run_accs.get(run_id)
        return acc.freeze() if acc is not None else self._runs.get(run_id)

    def _flush(self) -> None:
        for thread_id, acc in self._thread_accs.items():
            self._threads[thread_id] = acc.freeze()
        for run_id, racc in self._run_accs.items():
            self._runs[run_id] = racc.freeze()
        self._thread_accs.clear()
        self._run_accs.clear()

    def views(self) -> Views:
        """Every view known, frozen (copies of the internal dicts)."""
        self._flush()
        return Views(dict(self._threads), dict(self._runs))

    def take_touched(self) -> Views:
        """Frozen views changed since the last call; resets the touched sets."""
        self._flush()
        touched = Views(
            {t: self._threads[t] for t in self.touched_threads},
            {r: self._runs[r] for r in self.touched_runs},
        )
        self.touched_threads = set()
        self.touched_runs = set()
        return touched


def fold_commits(
    commits: Iterable[StoredCommit],
    threads: Mapping[str, ThreadView] | None = None,
    runs: Mapping[str, RunView] | None = None,
) -> Views:
    """All views after folding `commits` (in log order) onto the given ones. Pure."""
    folder = Folder(threads, runs)
    for stored in commits:
        folder.apply_commit(stored.seq, stored.commit)
    return folder.views()

