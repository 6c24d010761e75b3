"""The blocking client: the async client (`agentlog.client.aio`) run on a private event loop.

    with get_sync_client("http://127.0.0.1:8480") as client:
        run = client.runs.create("deployer", "ship it")
        for event in client.runs.stream(run["run_id"]):
            print(event.id, event.type)

Why a loop thread rather than a second HTTP stack: aiohttp is already what agentlog runs on
(httpx is not one of its dependencies), and one implementation of the protocol (typed errors, SSE
parsing, `Last-Event-ID` resume, `wait`) serves both flavours, so they cannot drift apart. Each
call hands a coroutine to the client's own loop thread and blocks on its result; a stream pulls
one event at a time the same way. The thread is started with the client and stopped by `close()`
(or the `with` block); a sync client can be used from any thread, one call at a time per thread.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator, Mapping, Sequence
from typing import Any, TypeVar, Unpack

from agentlog.client.aio import (
    APPROVED,
    DEFAULT_URL,
    DENIED,
    TOKEN_ENV,
    URL_ENV,
    AsyncClient,
    Json,
    JsonList,
    Messages,
    RunOptions,
)
from agentlog.client.sse import StreamEvent

T = TypeVar("T")


class LoopThread:
    """An event loop running forever on a daemon thread; `run(coro)` blocks for its result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="agentlog-client", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if not self.thread.is_alive():
            coro.close()
            raise RuntimeError("the agentlog client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def iterate(self, events: AsyncIterator[T]) -> Iterator[T]:
        """`events` pulled one item at a time on the loop; closed when the caller stops early."""
        async def step() -> T:
            return await anext(events)

        try:
            while True:
                try:
                    yield self.run(step())
                except StopAsyncIteration:
                    return
        finally:
            aclose = getattr(events, "aclose", None)
            if aclose is not None and self.thread.is_alive():
                self.run(aclose())

    def stop(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
        self.loop.close()


class SyncClient:
    """Blocking twin of `AsyncClient`: the same methods and answers, without `await`."""

    def __init__(self, url: str, *, token: str | None = None, timeout: float = 60.0,
                 max_reconnects: int = 5, stream_idle: float = 60.0,
                 headers: Mapping[str, str] | None = None) -> None:
        self.aio = AsyncClient(url, token=token, timeout=timeout, max_reconnects=max_reconnects,
                               stream_idle=stream_idle, headers=headers)
        self.url = self.aio.url
        self._loop = LoopThread()
        self.threads = SyncThreads(self)
        self.runs = SyncRuns(self)
        self.agents = SyncAgents(self)
        self.profiles = SyncProfiles(self)

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the HTTP session and stop the loop thread."""
        if self._loop.thread.is_alive():
            self._loop.run(self.aio.aclose())
        self._loop.stop()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run(coro)

    def iterate(self, events: AsyncIterator[T]) -> Iterator[T]:
        return self._loop.iterate(events)

    def health(self) -> Json:
        return self.call(self.aio.health())


class SyncThreads:
    """`client.threads` (see `agentlog.client.aio.Threads`)."""

    def __init__(self, client: SyncClient) -> None:
        self.c, self.a = client, client.aio.threads

    def create(self, thread_id: str | None = None, *, resource_id: str | None = None,
               metadata: Mapping[str, Any] | None = None, parent_thread_id: str | None = None) -> Json:
        return self.c.call(self.a.create(thread_id, resource_id=resource_id, metadata=metadata,
                                         parent_thread_id=parent_thread_id))

    def get(self, thread_id: str, *, min_seq: int | None = None) -> Json:
        return self.c.call(self.a.get(thread_id, min_seq=min_seq))

    def list(self, *, limit: int = 50, offset: int = 0, resource_id: str | None = None,
             parent_thread_id: str | None = None, min_seq: int | None = None, order: str | None = None) -> Json:
        return self.c.call(self.a.list(limit=limit, offset=offset, resource_id=resource_id,
                                       parent_thread_id=parent_thread_id, min_seq=min_seq, order=order))

    def update(self, thread_id: str, metadata: Mapping[str, Any], *, expected_version: int | None = None) -> Json:
        return self.c.call(self.a.update(thread_id, metadata, expected_version=expected_version))

    def delete(self, thread_id: str, *, reason: str | None = None, expected_version: int | None = None) -> Json:
        return self.c.call(self.a.delete(thread_id, reason=reason, expected_version=expected_version))

    def messages(self, thread_id: str, *, after: str | None = None, limit: int = 50, run_id: str | None = None,
                 visibility: str | None = None) -> Json:
        return self.c.call(self.a.messages(thread_id, after=after, limit=limit, run_id=run_id, visibility=visibility))

    def state(self, thread_id: str, *, at: str | None = None) -> Json:
        return self.c.call(self.a.state(thread_id, at=at))

    def revoke(self, thread_id: str, tool: str, *, verdict: str | None = None) -> Json:
        return self.c.call(self.a.revoke(thread_id, tool, verdict=verdict))

    def fork(self, thread_id: str, at: str, *, new_thread_id: str | None = None,
             state: Mapping[str, Any] | None = None, state_patch: Sequence[Mapping[str, Any]] | None = None,
             replace_message: Mapping[str, Any] | None = None, metadata: Mapping[str, Any] | None = None) -> Json:
        return self.c.call(self.a.fork(thread_id, at, new_thread_id=new_thread_id, state=state,
                                       state_patch=state_patch, replace_message=replace_message, metadata=metadata))

    def diff(self, thread_id: str, other_thread_id: str) -> Json:
        return self.c.call(self.a.diff(thread_id, other_thread_id))

    def stream(self, thread_id: str, *, after: str | None = None, follow: bool = False) -> Iterator[StreamEvent]:
        return self.c.iterate(self.a.stream(thread_id, after=after, follow=follow))


class SyncRuns:
    """`client.runs` (see `agentlog.client.aio.Runs`)."""

    def __init__(self, client: SyncClient) -> None:
        self.c, self.a = client, client.aio.runs

    def create(self, agent_id: str, messages: Messages = (), **options: Unpack[RunOptions]) -> Json:
        return self.c.call(self.a.create(agent_id, messages, **options))

    def get(self, run_id: str, *, min_seq: int | None = None) -> Json:
        return self.c.call(self.a.get(run_id, min_seq=min_seq))

    def list(self, *, thread_id: str | None = None, status: str | None = None, agent_id: str | None = None,
             parent_run_id: str | None = None, limit: int = 50, offset: int = 0, min_seq: int | None = None,
             order: str | None = None) -> Json:
        return self.c.call(self.a.list(thread_id=thread_id, status=status, agent_id=agent_id,
                                       parent_run_id=parent_run_id, limit=limit, offset=offset, min_seq=min_seq,
                                       order=order))

    def stream(self, run_id: str, *, after: str | None = None, follow: bool = True) -> Iterator[StreamEvent]:
        return self.c.iterate(self.a.stream(run_id, after=after, follow=follow))

    def current(self, run_id: str, *, min_seq: int | None = None) -> Json:
        return self.c.call(self.a.current(run_id, min_seq=min_seq))

    def wait(self, run_id: str, *, min_seq: int | None = None, timeout: float | None = None) -> Json:
        return self.c.call(self.a.wait(run_id, min_seq=min_seq, timeout=timeout))

    def inputs(self, run_id: str, *, decisions: Sequence[Mapping[str, Any]] = (), messages: Messages = (),
               mode: str | None = None) -> Json:
        return self.c.call(self.a.inputs(run_id, decisions=decisions, messages=messages, mode=mode))

    def decide(self, run_id: str, decisions: Sequence[Mapping[str, Any]]) -> Json:
        return self.c.call(self.a.decide(run_id, decisions))

    def pending(self, run_id: str) -> JsonList:
        return self.c.call(self.a.pending(run_id))

    def approve(self, run_id: str, call_ids: Sequence[str] | None = None, *, reason: str | None = None,
                result: Any = APPROVED, always: bool = False) -> Json:
        return self.c.call(self.a.approve(run_id, call_ids, reason=reason, result=result, always=always))

    def deny(self, run_id: str, call_ids: Sequence[str] | None = None, *, reason: str | None = None,
             result: Any = DENIED, always: bool = False) -> Json:
        return self.c.call(self.a.deny(run_id, call_ids, reason=reason, result=result, always=always))

    def resolve(self, run_id: str, call_id: str, action: str, result: Any = None) -> Json:
        return self.c.call(self.a.resolve(run_id, call_id, action, result))

    def cancel(self, run_id: str, *, reason: str | None = None) -> Json:
        return self.c.call(self.a.cancel(run_id, reason=reason))

    def counterfactual(self, run_id: str, call_id: str, *, action: str = "resume", result: Any = None,
                       reason: str | None = None, decision_id: str | None = None,
                       new_thread_id: str | None = None, retries: int = 2) -> Json:
        return self.c.call(self.a.counterfactual(run_id, call_id, action=action, result=result, reason=reason,
                                                 decision_id=decision_id, new_thread_id=new_thread_id, retries=retries))

    def replace_answer(self, run_id: str, inference: str | int, *, content: str = "",
                       tool_calls: Sequence[Mapping[str, Any]] = (), new_thread_id: str | None = None,
                       retries: int = 2) -> Json:
        return self.c.call(self.a.replace_answer(run_id, inference, content=content, tool_calls=tool_calls,
                                                 new_thread_id=new_thread_id, retries=retries))


class SyncAgents:
    """`client.agents` (see `agentlog.client.aio.Agents`)."""

    def __init__(self, client: SyncClient) -> None:
        self.c, self.a = client, client.aio.agents

    def list(self) -> JsonList:
        return self.c.call(self.a.list())


class SyncProfiles:
    """`client.profiles` (see `agentlog.client.aio.Profiles`)."""

    def __init__(self, client: SyncClient) -> None:
        self.c, self.a = client, client.aio.profiles

    def state(self, profile_id: str, *, at: int | None = None, history: bool = False) -> Json:
        return self.c.call(self.a.state(profile_id, at=at, history=history))


def get_sync_client(url: str | None = None, *, token: str | None = None, timeout: float = 60.0) -> SyncClient:
    """The blocking client of the API at `url` (default `$AGENTLOG_URL`, else
    http://127.0.0.1:8480), with bearer `token` (default `$AGENTLOG_API_TOKEN`)."""
    return SyncClient(url or os.environ.get(URL_ENV) or DEFAULT_URL,
                      token=token if token is not None else os.environ.get(TOKEN_ENV), timeout=timeout)


__all__ = ["LoopThread", "SyncAgents", "SyncClient", "SyncRuns", "SyncThreads", "get_sync_client"]
