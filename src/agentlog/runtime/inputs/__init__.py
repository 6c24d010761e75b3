"""What comes into the runtime, and the checks it passes before the first write.

- `request`: a run to start (`RunRequest`); `commands`: what a gateway queues for workers;
- `run_input`: overrides, context and state, and what an agent lets a request change;
- `frontend`: the tools the client runs itself;
- `admission`: what a start or a queued message is refused for, the same in the gateway and
  the runtime.

A room of the runtime's public face (with `agentlog.runtime` and `agentlog.runtime.workers`): the
gateway imports these names from here. The loop reads the recorded run input and frontend tools
from its folded context, so this room sits below the loop and imports none of it.
"""

from agentlog.runtime.inputs.admission import (
    QUEUE_MODES,
    InvalidRunInput,
    PlaceholderIds,
    admit_thread,
    as_messages,
    as_parts,
    check_ids,
    check_messages,
    check_request,
    check_storable,
    queue_input,
)
from agentlog.runtime.inputs.commands import (
    INTERRUPTED,
    Cancel,
    Command,
    ContinueRun,
    Decide,
    InvalidCommand,
    QueueMessages,
    StartRun,
    decode_command,
    encode_command,
)
from agentlog.runtime.inputs.frontend import ACTION as FRONTEND_ACTION
from agentlog.runtime.inputs.frontend import FrontendToolConflict, InvalidFrontendTools
from agentlog.runtime.inputs.request import RunRequest
from agentlog.runtime.inputs.run_input import (
    OverrideNotAllowed,
    OverridePolicy,
    OverrideScope,
    RunInput,
    as_run_input,
)
from agentlog.runtime.inputs.thread_folds import ThreadFolds, ThreadViews

__all__ = [
    "FRONTEND_ACTION", "INTERRUPTED", "QUEUE_MODES", "Cancel", "Command", "ContinueRun", "Decide",
    "FrontendToolConflict", "InvalidCommand", "InvalidFrontendTools", "InvalidRunInput", "OverrideNotAllowed",
    "OverridePolicy", "OverrideScope", "PlaceholderIds", "QueueMessages", "RunInput", "RunRequest", "StartRun", "ThreadFolds", "ThreadViews",
    "admit_thread",
    "as_messages", "as_parts", "as_run_input", "check_ids", "check_messages", "check_request", "check_storable",
    "decode_command", "encode_command", "queue_input",
]
