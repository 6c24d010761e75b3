"""`agentlog.client`: a Python client of the agentlog HTTP API, async and blocking.

    from agentlog.client import get_client, get_sync_client

    client = get_client("http://127.0.0.1:8480", token="tok")     # asyncio (aiohttp)
    run = await client.runs.create("deployer", "ship it")
    async for event in client.runs.stream(run["run_id"]):        # SSE from the log, resumable
        print(event.id, event.type)
    view = await client.runs.wait(run["run_id"])                  # done, or waiting for a human
    await client.runs.approve(run["run_id"])                      # {"approved": true} on every pending call

    with get_sync_client() as client:                             # the same, blocking
        client.threads.list()

`client.threads` (create, get, list, update, delete, messages, state, fork, revoke, stream),
`client.runs` (create, get, current, list, stream, wait, inputs, decide, pending, approve, deny,
cancel) and
`client.agents.list()`. Answers are the API's JSON bodies; failures raise the classes of
`agentlog.client.errors` (`NotFound`, `Conflict`, ...: one per family of the API's error codes,
each with `.code` and `.status`). Importing it imports aiohttp, not the agentlog runtime.
"""

from agentlog.client.aio import (
    APPROVED,
    DENIED,
    FINISHED,
    AsyncClient,
    RunOptions,
    always_answer,
    get_client,
    pending_calls,
    settled,
)
from agentlog.client.errors import (
    STATUS_BY_CODE,
    ApiError,
    ClientError,
    Conflict,
    ConnectionFailed,
    Forbidden,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    ServerError,
    TooLarge,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
)
from agentlog.client.sse import StreamEvent
from agentlog.client.sync import SyncClient, get_sync_client

__all__ = [
    "get_client", "get_sync_client", "AsyncClient", "SyncClient", "RunOptions", "StreamEvent", "APPROVED", "DENIED",
    "FINISHED", "always_answer",
    "pending_calls", "settled",
    "STATUS_BY_CODE", "ClientError", "ApiError", "InvalidRequest", "Unauthorized", "Forbidden", "NotFound",
    "MethodNotAllowed", "Conflict", "TooLarge", "UnsupportedMediaType", "ServerError", "Unavailable",
    "ConnectionFailed",
]
