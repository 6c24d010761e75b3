"""Time travel (DESIGN 3): a thread's state, messages and runs as of any event position.

Position `(seq, index)` includes every event of commits before `seq` and the events of the commit
at `seq` whose index is <= `index`. These are plain folds over the given commits, so "the state at
p" is by construction "the fold of the events up to p"; the CLI's `replay --to` and the HTTP
`?at=` use them with the commits the event store returns for the thread.
"""

from __future__ import annotations

from collections.abc import Iterable

from agentlog.eventlog.events import Message, MessageAppended, Position, StoredCommit
from agentlog.projections.fold import Folder
from agentlog.projections.views import RunView, ThreadView


def _upto(commits: Iterable[StoredCommit], position: Position) -> Iterable[tuple[StoredCommit, int | None]]:
    for stored in commits:
        if stored.seq < position.seq:
            yield stored, None
        elif stored.seq == position.seq:
            yield stored, position.index
        else:
            break  # commits are in log order


def _fold_upto(commits: Iterable[StoredCommit], position: Position) -> Folder:
    folder = Folder()
    for stored, upto in _upto(commits, position):
        folder.apply_commit(stored.seq, stored.commit, upto)
    return folder


def thread_at(commits: Iterable[StoredCommit], thread_id: str, position: Position) -> ThreadView:
    """The thread's view as of `position` (an empty view if nothing of it came before)."""
    return _fold_upto(commits, position).thread(thread_id) or ThreadView(thread_id=thread_id)


def state_at(commits: Iterable[StoredCommit], thread_id: str, position: Position) -> dict:
    """The thread-scope state as of `position`."""
    return thread_at(commits, thread_id, position).state


def runs_at(commits: Iterable[StoredCommit], position: Position) -> dict[str, RunView]:
    """Every run's view as of `position` (runs not started by then are absent)."""
    return _fold_upto(commits, position).views().runs


def run_at(commits: Iterable[StoredCommit], run_id: str, position: Position) -> RunView | None:
    return _fold_upto(commits, position).run(run_id)


def messages_at(
    commits: Iterable[StoredCommit], thread_id: str, position: Position | None = None
) -> list[Message]:
    """The thread's messages in log order as of `position` (all of them if None). This is also
    what the runtime folds to rebuild a run's conversation on resume."""
    messages: list[Message] = []
    for stored, upto in _upto(commits, position or Position(2**63, 0)):
        if stored.commit.thread_id != thread_id:
            continue
        events = stored.commit.events if upto is None else stored.commit.events[: upto + 1]
        for event in events:
            if type(event) is MessageAppended:
                messages.append(event.message)
    return messages


def states_along(commits: Iterable[StoredCommit], thread_id: str, run_id: str,
                 wanted: Iterable[Position]) -> dict[Position, dict[str, dict]]:
    """`{"thread": thread state, "run": run state}` as of each position of `wanted`, by ONE fold
    of `commits` (asking `state_at`/`run_at` once per position folds the log again each time: a
    run inspector on a long run went quadratic). Equal to those folds at every position."""
    targets = sorted(set(wanted), reverse=True)  # pop() gives the smallest
    states: dict[Position, dict[str, dict]] = {}
    folder = Folder()

    def capture_before(position: Position) -> None:
        while targets and targets[-1] < position:
            states[targets.pop()] = {"thread": folder.thread_state(thread_id), "run": folder.run_state(run_id)}

    for stored in commits:
        if not targets:
            break
        for index in range(len(stored.commit.events)):
            capture_before(Position(stored.seq, index))
            folder.apply_event(stored.seq, stored.commit, index)
    capture_before(Position(2**63, 0))
    return states


def positions(commits: Iterable[StoredCommit]) -> list[Position]:
    """Every event position of `commits`, in order (handy for stepping through history)."""
    return [p for stored in commits for p, _ in stored.positioned()]
