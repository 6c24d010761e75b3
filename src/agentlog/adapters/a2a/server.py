"""The A2A request handler of one agent: A2A operations mapped onto runs through the gateway's
`Dispatcher` (so it works in-process and with workers alike) and the log.

    SendMessage              a new run (context id = thread to continue, else a new thread), or
                             with `task_id`: the task's (run's) decisions (decision-only message,
                             HITL) or a continuation message; answers the task once it is done or
                             waits for input (`return_immediately`: at once)
    SendStreamingMessage     the same, streamed: the task, then a status update per answer and
                             step, the answer artifact, and the final status
    SubscribeToTask          the stream of an existing task, from the log
    GetTask / CancelTask     fold the run / cancel it (`TaskNotCancelableError` once finished)

Task id = run id, context id = thread id: nothing besides the log is needed to answer, in any
gateway process. A continuation (a new message to a finished or waiting task) starts a new run on
the same thread: its task id is the new run's id.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    ListTasksResponse,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskStatusUpdateEvent,
)
from a2a.types.a2a_pb2 import (
    Message as A2AMessage,
)
from a2a.utils.errors import (
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)

from agentlog.api.dispatch import Dispatcher, RunAlreadyFinished
from agentlog.log.errors import AgentlogError
from agentlog.log.events import MessageAppended, StoredCommit
from agentlog.log.ids import InvalidId, validate_run_id
from agentlog.views.fold import Folder, fold_commits
from agentlog.views.views import RunView

from .mapping import a2a_message, answer_artifact, message_content, run_task, status_message, task_state

#: `after` for a follow that only ends when the run is done.
_ONLY_DONE = 1 << 62


class RunTaskHandler(RequestHandler):
    """A2A for agent `agent_id`; `store` is read for task state (the log is the truth)."""

    def __init__(self, agent_id: str, dispatcher: Dispatcher, store: Any) -> None:
        self.agent_id = agent_id
        self.dispatcher = dispatcher
        self.store = store

    # -- reading tasks from the log --------------------------------------------------------------

    async def _commits(self, run_id: str) -> list[StoredCommit]:
        try:
            validate_run_id(run_id)
        except InvalidId:
            raise TaskNotFoundError(message=f"task {run_id!r} not found") from None
        commits = [sc async for sc in self.store.read_run(run_id)]
        if not commits:
            raise TaskNotFoundError(message=f"task {run_id!r} not found")
        return commits

    async def _follow(self, thread_id: str, run_id: str, after: int = 0) -> AsyncIterator[tuple[StoredCommit, RunView]]:
        """Each commit of the run with the run view after it, from the log (history, then live),
        until the run is done, or waits as of a commit at or after seq `after` (a wait the
        request's own decisions answered does not count)."""
        folder = Folder()  # incremental: one commit folded per commit, not the run's whole history
        async with contextlib.aclosing(self.store.follow(thread_id)) as follow:
            async for sc in follow:
                if sc.commit.run_id != run_id:
                    continue
                folder.apply(sc)
                view = folder.run(run_id)
                assert view is not None  # the run's own commit was just applied
                yield sc, view
                if view.status == "done" or (view.status == "waiting" and sc.seq >= after):
                    return

    async def _settled(self, thread_id: str, run_id: str, *, after: int = 0) -> Task:
        """The task once its run is done or waits (see `_follow`)."""
        commits: list[StoredCommit] = []
        view: RunView | None = None
        async for sc, view in self._follow(thread_id, run_id, after):  # noqa: B007  (the last view is used below)
            commits.append(sc)
        if view is None:
            raise TaskNotFoundError(message=f"task {run_id!r} not found")
        return run_task(view, commits)

    # -- starting / continuing -------------------------------------------------------------------

    async def _submit(self, params: SendMessageRequest) -> tuple[str, str, int]:
        """Apply an incoming message; returns (thread_id, run_id, seq) of the run to answer with."""
        msg = params.message
        content, decisions = message_content(msg)
        text: Any = content if isinstance(content, str) else [{"role": "user", "content": content}]
        try:
            if msg.task_id:
                await self._commits(msg.task_id)
                if not text and not decisions:
                    raise InvalidParamsError(message="a message to a task needs text or decisions")
                accepted = await self.dispatcher.submit_inputs(msg.task_id, decisions=decisions,
                                                               messages=text or ())
            else:
                if decisions:
                    raise InvalidParamsError(message="decisions need the task_id of the waiting task")
                if not text:
                    raise InvalidParamsError(message="the message has no text part")
                accepted = await self.dispatcher.start_run(self.agent_id, text, thread_id=msg.context_id or None)
        except AgentlogError as exc:
            if exc.code in ("run_not_found", "thread_not_found"):
                raise TaskNotFoundError(message=str(exc)) from None
            raise InvalidParamsError(message=f"[{exc.code}] {exc}") from None
        except (ValueError, TypeError) as exc:
            raise InvalidParamsError(message=str(exc)) from None
        return accepted.thread_id, accepted.run_id, accepted.seq

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Task | A2AMessage:
        thread_id, run_id, seq = await self._submit(params)
        if params.configuration.return_immediately:
            view = fold_commits(commits := await self._commits(run_id)).runs[run_id]
            return run_task(view, commits)
        return await self._settled(thread_id, run_id, after=seq)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any]:
        thread_id, run_id, seq = await self._submit(params)
        async for event in self._stream(thread_id, run_id, after=seq):
            yield event

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any]:
        commits = await self._commits(params.id)
        async for event in self._stream(commits[0].commit.thread_id, params.id, after=commits[-1].seq):
            yield event

    async def _stream(self, thread_id: str, run_id: str, after: int = 0) -> AsyncIterator[Any]:
        """The task first, then a working status per agent answer, then the answer artifact and
        the final status (completed / canceled / failed / input-required)."""
        first = True
        commits: list[StoredCommit] = []
        async for sc, view in self._follow(thread_id, run_id, after):
            commits.append(sc)
            if first:
                yield run_task(view, commits)
                first = False
            if view.status == "done" or (view.status == "waiting" and sc.seq >= after):
                artifact = answer_artifact(view, commits)
                if artifact is not None:
                    yield TaskArtifactUpdateEvent(task_id=run_id, context_id=thread_id, artifact=artifact,
                                                  last_chunk=True)
                yield self._status(view, commits)
                return
            for ev in sc.commit.events:
                if type(ev) is MessageAppended and ev.message.role == "assistant" and ev.message.content:
                    update = self._status(view, commits)
                    update.status.message.CopyFrom(a2a_message(ev.message, run_id, thread_id))
                    yield update

    @staticmethod
    def _status(view: RunView, commits: list[StoredCommit]) -> TaskStatusUpdateEvent:
        update = TaskStatusUpdateEvent(task_id=view.run_id, context_id=view.thread_id)
        update.status.state = task_state(view)
        msg = status_message(view, commits)
        if msg is not None:
            update.status.message.CopyFrom(msg)
        update.status.timestamp.FromMilliseconds(view.updated or view.created)
        return update

    # -- tasks -----------------------------------------------------------------------------------

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        commits = await self._commits(params.id)
        view = fold_commits(commits).runs[params.id]
        length = params.history_length if params.HasField("history_length") else None
        return run_task(view, commits, length)

    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task | None:
        commits = await self._commits(params.id)
        try:
            await self.dispatcher.cancel(params.id, reason="cancelled over A2A")
        except RunAlreadyFinished:
            raise TaskNotCancelableError(message=f"task {params.id!r} has already finished") from None
        return await self._settled(commits[0].commit.thread_id, params.id, after=_ONLY_DONE)

    async def on_list_tasks(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        raise UnsupportedOperationError(message="ListTasks: use GET /v1/runs")

    async def on_create_task_push_notification_config(self, params: Any, context: ServerCallContext) -> Any:
        raise PushNotificationNotSupportedError()

    async def on_get_task_push_notification_config(self, params: Any, context: ServerCallContext) -> Any:
        raise PushNotificationNotSupportedError()

    async def on_list_task_push_notification_configs(self, params: Any, context: ServerCallContext) -> Any:
        raise PushNotificationNotSupportedError()

    async def on_delete_task_push_notification_config(self, params: Any, context: ServerCallContext) -> None:
        raise PushNotificationNotSupportedError()

    async def on_get_extended_agent_card(self, params: Any, context: ServerCallContext) -> AgentCard:
        raise UnsupportedOperationError(message="no extended agent card")
