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
    ListTasks                the agent's tasks the caller may see (a tenant token: its tenant's),
                             from the listing index (as of the log's head), each folded from the log
    GetExtendedAgentCard     the card with the agent's tools as skills (authenticated callers only)
    *TaskPushNotificationConfig   a task's webhooks (agentlog.gateway.adapters.a2a.push delivers them)

Tenant-scoped tokens are served: the caller (`agentlog.gateway.operations.auth.Principal`, put in the call
context by the routes) sees only tasks on its tenant's threads (others answer like unknown
ones) and starts runs on threads of its tenant.

Task id = run id, context id = thread id: nothing besides the log is needed to answer, in any
gateway process. A continuation (a new message to a finished or waiting task) starts a new run on
the same thread: its task id is the new run's id.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskPushNotificationConfig,
    TaskStatusUpdateEvent,
)
from a2a.types.a2a_pb2 import (
    Message as A2AMessage,
)
from a2a.utils.errors import (
    InternalError,
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)

from agentlog.eventlog.errors import AgentlogError
from agentlog.eventlog.events import MessageAppended, StoredCommit, ThreadCreated
from agentlog.eventlog.ids import InvalidId, new_id, validate_run_id
from agentlog.eventlog.store import EventStore, as_generator
from agentlog.gateway.adapters.a2a.mapping import (
    a2a_message,
    answer_artifact,
    message_content,
    run_task,
    status_message,
    task_state,
)
from agentlog.gateway.operations.auth import Principal
from agentlog.gateway.operations.dispatch import Dispatcher, RunAlreadyFinished
from agentlog.gateway.operations.services import Services
from agentlog.projections.fold import Folder, fold_commits
from agentlog.projections.views import RunView
from agentlog.runtime import RunRequest

if TYPE_CHECKING:
    from agentlog.gateway.adapters.a2a.push import PushConfigs

#: Where the routes put the caller in the call context's state.
PRINCIPAL_STATE = "agentlog.principal"

#: Seconds ListTasks waits for the listing index to reach the log's head.
LIST_WAIT = 30.0

#: `after` for a follow that only ends when the run is done.
_ONLY_DONE = 1 << 62


class RunTaskHandler(RequestHandler):
    """A2A for agent `agent_id`; `store` is read for task state (the log is the truth)."""

    def __init__(self, agent_id: str, dispatcher: Dispatcher, store: EventStore, *, services: Services | None = None,
                 extended_card: Callable[[], AgentCard] | None = None, push: PushConfigs | None = None) -> None:
        self.agent_id = agent_id
        self.dispatcher = dispatcher
        self.store = store
        #: The gateway's `agentlog.gateway.operations.services.Services` (the listing index for ListTasks).
        self.services = services
        self.extended_card = extended_card
        #: The task webhooks (`push.PushConfigs`); None: push notifications unsupported.
        self.push = push

    @staticmethod
    def caller(context: ServerCallContext | None) -> Principal:
        who = context.state.get(PRINCIPAL_STATE) if context is not None else None
        return who if isinstance(who, Principal) else Principal()

    async def _visible(self, thread_id: str, who: Principal) -> bool:
        """Is the thread the caller's (always, for an unscoped caller)? An unknown thread is."""
        if who.tenant is None:
            return True
        async for sc in self.store.read_thread(thread_id):
            for ev in sc.commit.events:
                if type(ev) is ThreadCreated:
                    return who.can_see(ev.resource_id)
            break
        return True

    # -- reading tasks from the log --------------------------------------------------------------

    async def _commits(self, run_id: str, who: Principal | None = None) -> list[StoredCommit]:
        try:
            validate_run_id(run_id)
        except InvalidId:
            raise TaskNotFoundError(message=f"task {run_id!r} not found") from None
        commits = [sc async for sc in self.store.read_run(run_id)]
        if not commits or (who is not None and not await self._visible(commits[0].commit.thread_id, who)):
            raise TaskNotFoundError(message=f"task {run_id!r} not found")
        return commits

    async def _follow(self, thread_id: str, run_id: str, after: int = 0) -> AsyncIterator[tuple[StoredCommit, RunView]]:
        """Each commit of the run with the run view after it, from the log (history, then live),
        until the run is done, or waits as of a commit at or after seq `after` (a wait the
        request's own decisions answered does not count)."""
        folder = Folder()  # incremental: one commit folded per commit, not the run's whole history
        async with contextlib.aclosing(as_generator(self.store.follow(thread_id))) as follow:
            async for sc in follow:
                if sc.commit.run_id != run_id:
                    continue
                folder.apply(sc)
                view = folder.run(run_id)
                assert view is not None  # the run's own commit was just applied
                yield sc, view
                if view.finished or (view.status == "waiting" and sc.seq >= after):
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

    async def _submit(self, params: SendMessageRequest, who: Principal) -> tuple[str, str, int]:
        """Apply an incoming message; returns (thread_id, run_id, seq) of the run to answer with."""
        msg = params.message
        content, decisions = message_content(msg)
        text: Any = content if isinstance(content, str) else [{"role": "user", "content": content}]
        try:
            if msg.task_id:
                await self._commits(msg.task_id, who)
                if not text and not decisions:
                    raise InvalidParamsError(message="a message to a task needs text or decisions")
                accepted = await self.dispatcher.submit_inputs(msg.task_id, decisions=decisions,
                                                               messages=text or ())
            else:
                if decisions:
                    raise InvalidParamsError(message="decisions need the task_id of the waiting task")
                if not text:
                    raise InvalidParamsError(message="the message has no text part")
                resource: dict[str, Any] = {}
                if who.tenant is not None:
                    if msg.context_id and not await self._visible(msg.context_id, who):
                        raise TaskNotFoundError(message=f"context {msg.context_id!r} not found")
                    known = bool(msg.context_id) and await self.store.thread_version(msg.context_id) > 0
                    resource = {} if known else {"resource_id": who.tenant}
                accepted = await self.dispatcher.start_run(RunRequest(
                    agent_id=self.agent_id, messages=text, thread_id=msg.context_id or None, **resource))
        except AgentlogError as exc:
            if exc.code in ("run_not_found", "thread_not_found"):
                raise TaskNotFoundError(message=str(exc)) from None
            raise InvalidParamsError(message=f"[{exc.code}] {exc}") from None
        except (ValueError, TypeError) as exc:
            raise InvalidParamsError(message=str(exc)) from None
        return accepted.thread_id, accepted.run_id, accepted.seq

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Task | A2AMessage:
        thread_id, run_id, seq = await self._submit(params, self.caller(context))
        if params.configuration.return_immediately:
            view = fold_commits(commits := await self._commits(run_id)).runs[run_id]
            return run_task(view, commits)
        return await self._settled(thread_id, run_id, after=seq)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any]:
        thread_id, run_id, seq = await self._submit(params, self.caller(context))
        async for event in self._stream(thread_id, run_id, after=seq):
            yield event

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any]:
        commits = await self._commits(params.id, self.caller(context))
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
            if view.finished or (view.status == "waiting" and sc.seq >= after):
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
        commits = await self._commits(params.id, self.caller(context))
        view = fold_commits(commits).runs[params.id]
        length = params.history_length if params.HasField("history_length") else None
        return run_task(view, commits, length)

    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task | None:
        commits = await self._commits(params.id, self.caller(context))
        try:
            await self.dispatcher.cancel(params.id, reason="cancelled over A2A")
        except RunAlreadyFinished:
            raise TaskNotCancelableError(message=f"task {params.id!r} has already finished") from None
        return await self._settled(commits[0].commit.thread_id, params.id, after=_ONLY_DONE)

    async def on_list_tasks(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        """This agent's tasks the caller may see, oldest first (by creation), `page_size` (default 50,
        at most 100) per page, `next_page_token` the offset of the next page. Listed as of the
        log's head (the listing index waits for it: a task the caller just created is there);
        `status` filters the page's tasks (a page may then hold fewer)."""
        from agentlog.gateway.operations.models import ListRunsQuery
        from agentlog.gateway.operations.operations import list_runs

        if self.services is None:
            raise UnsupportedOperationError(message="ListTasks needs the gateway's views")
        who = self.caller(context)
        try:
            offset = int(params.page_token or 0)
            size = params.page_size if params.HasField("page_size") and params.page_size else 50
            query = ListRunsQuery(agent_id=self.agent_id, thread_id=params.context_id or None,
                                  limit=min(max(size, 1), 100), offset=max(offset, 0), order="asc")
        except ValueError as exc:
            raise InvalidParamsError(message=f"bad ListTasks parameters: {exc}") from None
        # as of the log's head: the listing index is a projection, which may trail the log (the
        # gateway's own runner applies every worker's commits); a bound, then a typed error
        head = await self.store.last_seq()
        runner = getattr(self.services, "runner", None)
        if head and runner is not None:
            try:
                await runner.wait_for(head, timeout=LIST_WAIT)
            except AgentlogError as exc:
                raise InternalError(message=f"[{exc.code}] the task listing is behind the log: {exc}") from None
        page = await list_runs(self.services, who, query)
        length = params.history_length if params.HasField("history_length") else 0
        tasks: list[Task] = []
        for run in page["runs"]:
            run_id = run["run_id"] if isinstance(run, dict) else run.run_id
            commits = [sc async for sc in self.store.read_run(run_id)]
            view = fold_commits(commits).runs.get(run_id) if commits else None
            if view is None:
                continue
            task = run_task(view, commits, length)
            if params.status and task.status.state != params.status:
                continue
            if not params.include_artifacts:
                del task.artifacts[:]
            tasks.append(task)
        following = query.offset + len(page["runs"])
        return ListTasksResponse(tasks=tasks, page_size=query.limit, total_size=int(page["total"]),
                                 next_page_token=str(following) if following < page["total"] else "")

    # -- push notifications (agentlog.gateway.adapters.a2a.push) ----------------------------------------

    def _push(self) -> Any:
        if self.push is None:
            raise PushNotificationNotSupportedError()
        return self.push

    async def on_create_task_push_notification_config(self, params: TaskPushNotificationConfig,
                                                      context: ServerCallContext) -> TaskPushNotificationConfig:
        """A webhook for the task's state changes from now on (one per config id: the same id
        replaces it). Only http(s) URLs."""
        push = self._push()
        await self._commits(params.task_id, self.caller(context))
        if not params.url.startswith(("http://", "https://")):
            raise InvalidParamsError(message="the push notification url must be http(s)")
        config = {"id": params.id or new_id(), "url": params.url, "token": params.token}
        configs = [c for c in await push.get(params.task_id) if c["id"] != config["id"]] + [config]
        await push.put(params.task_id, configs)
        return _config(params.task_id, config)

    async def on_get_task_push_notification_config(self, params: GetTaskPushNotificationConfigRequest,
                                                   context: ServerCallContext) -> TaskPushNotificationConfig:
        await self._commits(params.task_id, self.caller(context))
        for config in await self._push().get(params.task_id):
            if config["id"] == params.id:
                return _config(params.task_id, config)
        raise TaskNotFoundError(message=f"no push notification config {params.id!r} on task {params.task_id!r}")

    async def on_list_task_push_notification_configs(self, params: ListTaskPushNotificationConfigsRequest,
                                                     context: ServerCallContext
                                                     ) -> ListTaskPushNotificationConfigsResponse:
        await self._commits(params.task_id, self.caller(context))
        return ListTaskPushNotificationConfigsResponse(
            configs=[_config(params.task_id, c) for c in await self._push().get(params.task_id)])

    async def on_delete_task_push_notification_config(self, params: DeleteTaskPushNotificationConfigRequest,
                                                      context: ServerCallContext) -> None:
        await self._commits(params.task_id, self.caller(context))
        push = self._push()
        await push.put(params.task_id, [c for c in await push.get(params.task_id) if c["id"] != params.id])

    async def on_get_extended_agent_card(self, params: Any, context: ServerCallContext) -> AgentCard:
        """The card for an authenticated caller (the JSON-RPC endpoint is behind the gateway's
        tokens): the public card plus a skill per tool of the agent."""
        if self.extended_card is None:
            raise UnsupportedOperationError(message="no extended agent card")
        return self.extended_card()


def _config(task_id: str, config: dict[str, Any]) -> TaskPushNotificationConfig:
    return TaskPushNotificationConfig(task_id=task_id, id=config["id"], url=config["url"],
                                      token=config.get("token") or "")
