"""agentlog projections: pure folds from events to views, and the runner that keeps them in KV.

Pure (no I/O, no clock): `fold_thread`, `fold_run`, `fold_messages`, `fold_commits`, `Folder`,
`derive_status`, `validate_patch`, the time-travel functions. I/O: `ViewStore` implementations
and the runner/rebuild (imported from their modules, so the pure part stays import-light).
"""

from agentlog.projections.errors import InvalidPatch, ListingBusy, ProjectionError, ProjectionTimeout
from agentlog.projections.fold import (
    Folder,
    RunFolder,
    Views,
    derive_status,
    fold_commits,
    fold_messages,
    fold_run,
    fold_thread,
    merge_metadata,
)
from agentlog.projections.state import validate_patch, validate_state
from agentlog.projections.timetravel import (
    messages_at,
    positions,
    run_at,
    runs_at,
    state_at,
    states_along,
    thread_at,
)
from agentlog.projections.views import (
    ACTIVE_CALL_STATUSES,
    FAILED_TERMINATIONS,
    FINISHED_RUN_STATUSES,
    TERMINAL_CALL_STATUSES,
    CallStatus,
    CallView,
    RunStatus,
    RunView,
    ThreadView,
    decode_run,
    decode_thread,
    encode_view,
    finished_status,
)

__all__ = [
    "ACTIVE_CALL_STATUSES", "FAILED_TERMINATIONS", "FINISHED_RUN_STATUSES", "TERMINAL_CALL_STATUSES", "CallStatus", "CallView", "Folder", "InvalidPatch", "ListingBusy", "RunFolder",
    "ProjectionError", "ProjectionTimeout", "RunStatus", "RunView", "ThreadView", "Views", "decode_run",
    "decode_thread", "derive_status", "encode_view", "finished_status", "fold_commits", "fold_messages", "fold_run",
    "fold_thread", "merge_metadata", "messages_at", "positions", "run_at", "runs_at", "state_at", "states_along",
    "thread_at", "validate_patch", "validate_state",
]
