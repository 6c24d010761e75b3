"""The asyncio client of the agentlog HTTP API (aiohttp).

    client = get_client("http://127.0.0.1:8480", token="tok")
    run = await client.runs.create("deployer", "ship it")
    view = await client.runs.wait(run["run_id"])          # waiting for a human, or done
    await client.runs.approve(run["run_id"])
    await client.aclose()

Answers are the API's JSON bodies as dicts (the OpenAPI document at `/openapi.json` describes
them); failures are `agentlog.client.errors` classes. One aiohttp session per client, opened on
the first request (in the running loop) and closed by `aclose()` / `async with`.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.parse
import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing
from typing import Any, TypedDict, Unpack

import aiohttp

from agentlog.client.errors import ClientError, Conflict, ConnectionFailed, Unavailable, api_error
from agentlog.client.sse import StreamEvent, frames

#: Where `get_client()` looks when given no URL / token (the CLI reads the same variables).
URL_ENV = "AGENTLOG_URL"
TOKEN_ENV = "AGENTLOG_API_TOKEN"
DEFAULT_URL = "http://127.0.0.1:8480"

#: What `runs.approve` / `runs.deny` record as the decision's result: what the inspector page and
#: the docs' curl lines send, and what a permission `ask` reads (`{"approved": false}` is a denial).
APPROVED: dict[str, Any] = {"approved": True}
DENIED: dict[str, Any] = {"approved": False}


def always_answer(approved: bool) -> dict[str, Any]:
    """The answer to a permission approval that also keeps a standing rule on the thread ("always
    allow / deny this tool"): `{"approved": ..., "always": true}`, recorded with action `resume`."""
    return {"approved": approved, "always": True}

Json = dict[str, Any]
#: (`list` is a method name in the classes below)
JsonList = list[Json]
Messages = str | Sequence[str | Mapping[str, Any]]


class RunOptions(TypedDict, total=False):
    """What `runs.create` sends with a run besides its agent and messages, all optional."""

    #: The thread to run on (a new one when not given).
    thread_id: str | None
    #: The run's id; chosen by the client when not given, so that a retry runs it once.
    run_id: str | None
    #: The owner of a new thread (a tenant's prefix).
    resource_id: str | None
    #: The run this one continues.
    parent_run_id: str | None
    #: Decisions for the waiting parent's suspended calls (a `decision_id` is added when missing).
    decisions: Sequence[Mapping[str, Any]]
    #: `{model, system_prompt, options, allowed_tools, excluded_tools}`, within what the agent allows.
    overrides: Mapping[str, Any] | None
    #: `[{description, value}]`, shown to the model.
    context: Sequence[Mapping[str, str]]
    #: Merged into the thread's state.
    state: Mapping[str, Any] | None
    #: How many times a 503 or a lost answer is sent again (default 2).
    retries: int


def _params(**values: Any) -> dict[str, str]:
    """Query parameters without the unset ones; booleans as the API spells them."""
    out = {}
    for key, value in values.items():
        if value is None:
            continue
        out[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


def _body(**values: Any) -> Json:
    return {k: v for k, v in values.items() if v is not None}


class AsyncClient:
    """The API at `url`, with bearer `token` when the server has `--tokens`. `timeout` bounds
    every request but the event streams (which last as long as the run or thread goes on);
    `max_reconnects` is how many times in a row a broken stream is resumed (`Last-Event-ID`);
    `stream_idle` is how long a stream may stay silent (the server sends a heartbeat every 15 s by
    default) before it counts as broken, so a server gone without closing is noticed."""

    def __init__(self, url: str, *, token: str | None = None, timeout: float = 60.0,
                 max_reconnects: int = 5, stream_idle: float = 60.0,
                 headers: Mapping[str, str] | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.max_reconnects = max_reconnects
        self.stream_idle = stream_idle
        self.headers = dict(headers or {})
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self._session: aiohttp.ClientSession | None = None
        self.threads = Threads(self)
        self.runs = Runs(self)
        self.agents = Agents(self)
        self.profiles = Profiles(self)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers=self.headers, timeout=aiohttp.ClientTimeout(
                total=None, connect=self.timeout, sock_connect=self.timeout))
        return self._session

    async def request(self, method: str, path: str, *, params: Mapping[str, str] | None = None,
                      json_body: Any = None) -> Any:
        """One API call: the JSON answer, or the typed error of the error answer."""
        try:
            async with asyncio.timeout(self.timeout):
                async with self.session().request(method, self.url + path, params=params,
                                                  json=json_body) as resp:
                    text = await resp.text()
                    if resp.status >= 400:
                        raise api_error(resp.status, text, reason=resp.reason or "error",
                                        retry_after=resp.headers.get("Retry-After"))
        except aiohttp.ClientError as exc:
            raise ConnectionFailed(f"the agentlog API at {self.url} did not answer: {exc}") from None
        except TimeoutError:
            raise ConnectionFailed(f"the agentlog API at {self.url} did not answer within {self.timeout}s") from None
        return json.loads(text) if text else None

    async def events(self, path: str, *, after: str | None = None, follow: bool = False) -> AsyncGenerator[StreamEvent, None]:
        """The SSE stream at `path` from after event id `after`. A connection that breaks (the
        server drops a client that falls behind, a proxy times out) is resumed after the last
        event received, with `Last-Event-ID`: nothing is lost or repeated. Ends when the server
        ends the stream."""
        last, failures, connected = after, 0, False
        while True:
            headers = {"Accept": "text/event-stream"}
            if last:
                headers["Last-Event-ID"] = last
            try:
                idle = aiohttp.ClientTimeout(total=None, connect=self.timeout, sock_connect=self.timeout,
                                             sock_read=self.stream_idle)
                async with self.session().get(self.url + path, params=_params(follow=follow or None),
                                              headers=headers, timeout=idle) as resp:
                    if resp.status >= 400:
                        raise api_error(resp.status, await resp.text(), reason=resp.reason or "error")
                    connected = True
                    async for frame in frames(resp.content):
                        if frame.event == "error":
                            raise api_error(None, frame.data)
                        event = StreamEvent.of(frame)
                        last, failures = event.id or last, 0
                        yield event
                return
            except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
                if connected is False:  # never reached the server: nothing to resume
                    raise ConnectionFailed(f"the agentlog API at {self.url} did not answer: {exc}") from None
                failures += 1
                if failures > self.max_reconnects:
                    raise ConnectionFailed(f"the event stream {path} broke {failures} times in a row: {exc}") from None
                await asyncio.sleep(min(0.05 * 2 ** failures, 2.0))  # back off before reconnecting

    async def health(self) -> Json:
        """`GET /health`: readiness (NATS connected, projection lag)."""
        return await self.request("GET", "/health")


class Threads:
    """`client.threads`: the conversation threads (`/v1/threads`)."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def create(self, thread_id: str | None = None, *, resource_id: str | None = None,
                     metadata: Mapping[str, Any] | None = None, parent_thread_id: str | None = None) -> Json:
        """A new thread: `{"thread": ThreadView, "seq"}`."""
        body = _body(thread_id=thread_id, resource_id=resource_id, parent_thread_id=parent_thread_id,
                     metadata=dict(metadata) if metadata is not None else None)
        return await self.client.request("POST", "/v1/threads", json_body=body)

    async def get(self, thread_id: str, *, min_seq: int | None = None) -> Json:
        """The thread's view; `min_seq` waits (bounded) until the views include that commit."""
        return await self.client.request("GET", f"/v1/threads/{thread_id}",
                                         params=_params(min_seq=min_seq))

    async def list(self, *, limit: int = 50, offset: int = 0, resource_id: str | None = None,
                   parent_thread_id: str | None = None, min_seq: int | None = None, order: str | None = None) -> Json:
        """A page of live threads, newest first (`order="asc"`: oldest first): `{"threads",
        "total", "limit", "offset", "order"}`."""
        return await self.client.request("GET", "/v1/threads", params=_params(
            limit=limit, offset=offset, resource_id=resource_id, parent_thread_id=parent_thread_id,
            min_seq=min_seq, order=order))

    async def update(self, thread_id: str, metadata: Mapping[str, Any], *,
                     expected_version: int | None = None) -> Json:
        """Merge `metadata` (a `None` value removes the key): `{"thread", "seq"}`."""
        return await self.client.request("PATCH", f"/v1/threads/{thread_id}",
                                         json_body=_body(metadata=dict(metadata), expected_version=expected_version))

    async def delete(self, thread_id: str, *, reason: str | None = None,
                     expected_version: int | None = None) -> Json:
        """Tombstone the thread: `{"thread_id", "deleted": true, "seq"}`."""
        return await self.client.request("DELETE", f"/v1/threads/{thread_id}",
                                         params=_params(reason=reason, expected_version=expected_version))

    async def messages(self, thread_id: str, *, after: str | None = None, limit: int = 50,
                       run_id: str | None = None, visibility: str | None = None) -> Json:
        """Messages in log order, each with its event id: `{"messages", "next_after"}` (pass
        `next_after` as `after` for the next page)."""
        return await self.client.request("GET", f"/v1/threads/{thread_id}/messages",
                                         params=_params(after=after, limit=limit, run_id=run_id,
                                                        visibility=visibility))

    async def state(self, thread_id: str, *, at: str | None = None) -> Json:
        """The thread's state, now or as of event id `at` (time travel): `{"thread_id", "at",
        "version", "state"}`, and `warning` when `at` is past the thread's last event."""
        return await self.client.request("GET", f"/v1/threads/{thread_id}/state",
                                         params=_params(at=at))

    async def revoke(self, thread_id: str, tool: str, *, verdict: str | None = None) -> Json:
        """Remove the standing permission rules of `tool` on the thread ("always allow / deny"
        answers): `{"thread_id", "removed", "permissions", "seq"}`."""
        return await self.client.request("DELETE", f"/v1/threads/{thread_id}/permissions",
                                         params=_params(tool=tool, verdict=verdict))

    async def fork(self, thread_id: str, at: str, *, new_thread_id: str | None = None,
                   state: Mapping[str, Any] | None = None,
                   state_patch: Sequence[Mapping[str, Any]] | None = None,
                   replace_message: Mapping[str, Any] | None = None,
                   metadata: Mapping[str, Any] | None = None) -> Json:
        """A new thread from this one's messages and state as of event id `at` (its lineage in
        `forked_from`): `{"thread_id", "thread", "seq"}`. `state` replaces the fork's state,
        `state_patch` (RFC 6902 ops) edits it; `replace_message` (`{"id", "content"[, "role"]}`)
        changes one message of the copied history. Start runs on it like on any thread."""
        body = _body(at=at, new_thread_id=new_thread_id, state=dict(state) if state is not None else None,
                     state_patch=[dict(op) for op in state_patch] if state_patch is not None else None,
                     replace_message=dict(replace_message) if replace_message is not None else None,
                     metadata=dict(metadata) if metadata is not None else None)
        return await self.client.request("POST", f"/v1/threads/{thread_id}/fork", json_body=body)

    async def diff(self, thread_id: str, other_thread_id: str) -> Json:
        """Two threads compared event by event from their fork point: `{"a", "b", "common",
        "a_events", "b_events", "rows": [{"kind", "a", "b"}]}` (`kind`: same, changed, only_a,
        only_b; each side `{"id", "type", "event"}` or null)."""
        return await self.client.request("GET", f"/v1/threads/{thread_id}/diff/{other_thread_id}")

    def stream(self, thread_id: str, *, after: str | None = None, follow: bool = False) -> AsyncGenerator[StreamEvent, None]:
        """The thread's events from the log (after event id `after`); `follow` keeps tailing."""
        return self.client.events(f"/v1/threads/{thread_id}/events", after=after, follow=follow)


class Runs:
    """`client.runs`: start, read, follow and steer runs (`/v1/runs`)."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def create(self, agent_id: str, messages: Messages = (), **options: Unpack[RunOptions]) -> Json:
        """Start a run of `agent_id` (a new thread unless `thread_id`): `{"thread_id", "run_id",
        "seq"}`. `messages`: a string (one user message) or a list of strings / `{role, content}`;
        `options`: the rest of the start (`RunOptions`).

        Idempotent: the run id is chosen here when not given, so a start sent again runs once. A
        create that got no answer (`ConnectionFailed`) or a 503 (`Unavailable`: no worker took
        the start in time, which the gateway then withdrew, or NATS was away) is sent again with
        the same run id, up to `retries` times (after the server's `Retry-After`, at most 5 s);
        if an earlier attempt had started the run, the answer says `"duplicate": true`. Every
        error raised names the run id (`.run_id`): creating with it again is safe."""
        run_id = options.get("run_id") or uuid.uuid4().hex
        overrides, state = options.get("overrides"), options.get("state")
        body = _body(agent_id=agent_id, messages=_messages(messages), thread_id=options.get("thread_id"),
                     run_id=run_id, resource_id=options.get("resource_id"), parent_run_id=options.get("parent_run_id"),
                     decisions=[_decision(d) for d in options.get("decisions", ())] or None,
                     overrides=dict(overrides) if overrides is not None else None,
                     context=[dict(c) for c in options.get("context", ())] or None,
                     state=dict(state) if state is not None else None)
        return await self._post_again("/v1/runs", body, options.get("retries", 2), run_id=run_id)

    async def _post_again(self, path: str, body: Json, retries: int, *, run_id: str | None = None) -> Json:
        """POST `body` (an idempotent request: its ids chosen) to `path`; sent again, the same,
        after no answer (`ConnectionFailed`) or a 503 (`Unavailable`), up to `retries` times
        (after the server's `Retry-After`, at most 5 s). Errors name `run_id` when given."""
        attempt = 0
        while True:
            try:
                answer: Json = await self.client.request("POST", path, json_body=body)
                return answer
            except ClientError as exc:
                exc.run_id = exc.run_id or run_id
                if not isinstance(exc, (Unavailable, ConnectionFailed)) or attempt >= retries:
                    raise
                wait = exc.retry_after if isinstance(exc, Unavailable) and exc.retry_after is not None else 1.0
            attempt += 1
            await asyncio.sleep(min(max(wait, 0.0), 5.0))  # the server's pacing (Retry-After) between attempts

    async def get(self, run_id: str, *, min_seq: int | None = None) -> Json:
        """The run's view (status, calls, usage); `min_seq` waits until the views include it."""
        return await self.client.request("GET", f"/v1/runs/{run_id}",
                                         params=_params(min_seq=min_seq))

    async def list(self, *, thread_id: str | None = None, status: str | None = None, agent_id: str | None = None,
                   parent_run_id: str | None = None, limit: int = 50, offset: int = 0,
                   min_seq: int | None = None, order: str | None = None) -> Json:
        """A page of runs, newest first (`order="asc"`: oldest first): `{"runs", "total", "limit",
        "offset", "order"}`; `status`: running, waiting, done or failed (ended in an error)."""
        return await self.client.request("GET", "/v1/runs", params=_params(
            thread_id=thread_id, status=status, agent_id=agent_id, parent_run_id=parent_run_id, limit=limit,
            offset=offset, min_seq=min_seq, order=order))

    def stream(self, run_id: str, *, after: str | None = None, follow: bool = True) -> AsyncGenerator[StreamEvent, None]:
        """The run's events from the log, from its start or after event id `after`. With `follow`
        (default) the stream goes on live and ends when the run waits for a human or finishes
        (`event.pauses`); after an approval, stream again with `after=` the last id to see the
        rest. A broken connection is resumed with `Last-Event-ID`."""
        return self.client.events(f"/v1/runs/{run_id}/events", after=after, follow=follow)

    async def wait(self, run_id: str, *, min_seq: int | None = None, timeout: float | None = None) -> Json:
        """The run's view once it is finished (`done` or `failed`), or `waiting` with a call no
        human has decided yet (a run whose decisions are recorded but not yet applied is still on
        its way). Reads the
        run's events from the log, then follows its thread's stream (no polling), and confirms
        each pause with a read as of that commit, so the view is never older than the
        log. `timeout` (seconds): `TimeoutError` if the run has not paused by then. `min_seq`: a
        commit the answer must include (e.g. the `seq` that `approve` answered)."""
        async with asyncio.timeout(timeout):
            return await self._wait(run_id, min_seq or 0)

    async def current(self, run_id: str, *, min_seq: int | None = None) -> Json:
        """The run's view as of its last commit in the log (`get` reads the views, which may lag
        the log unless given `min_seq`): its events are read to find that commit."""
        return (await self._current(run_id, min_seq or 0))[0]

    async def _current(self, run_id: str, min_seq: int) -> tuple[Json, StreamEvent]:
        last = None
        async for event in self.stream(run_id, follow=False):
            last = event
        if last is None:  # a run's stream has at least its RunStarted
            raise ConnectionFailed(f"the event stream of run {run_id!r} was empty")
        return await self._view_with(run_id, last.seq, min_seq), last

    async def _view_with(self, run_id: str, seen: int, min_seq: int) -> Json:
        """The run's view including commit `seen` of its thread (read from the log) and
        `min_seq`. A read without `min_seq` answers as of the thread's last commit in the log,
        which includes `seen`, folding the run from the log while the views lag; with `min_seq`
        the server waits for the views and answers 503 if they stay behind (a loaded machine,
        a restart). So `min_seq` is sent only for a position past what was seen."""
        return await self.get(run_id, min_seq=min_seq if min_seq > seen else None)

    async def _wait(self, run_id: str, min_seq: int) -> Json:
        view, last = await self._current(run_id, min_seq)
        if settled(view):
            return view
        # aclosing: returning mid-stream must close the connection now, not when the generator
        # is collected (the server would hold the follower, and its shutdown would wait for it)
        async with aclosing(self.client.threads.stream(view["thread_id"], after=last.id, follow=True)) as events:
            async for event in events:
                if event.run_id == run_id and event.pauses:
                    view = await self._view_with(run_id, event.seq, min_seq)
                    if settled(view):
                        return view
        raise ConnectionFailed(f"the event stream of run {run_id!r} ended before the run paused")

    async def inputs(self, run_id: str, *, decisions: Sequence[Mapping[str, Any]] = (),
                     messages: Messages = (), mode: str | None = None) -> Json:
        """`POST /v1/runs/{id}/inputs`: decisions for suspended calls and/or messages (which start
        the continuation run on the same thread): `{"thread_id", "run_id", "seq"}`. Messages for
        a run that is still running need a mode: `"steer"` (the run takes them at its next step
        boundary), `"follow_up"` (when it would otherwise end; the answer's `run_id` is then the
        run itself) or `"interrupt"` (cancel it, then continue)."""
        body = _body(decisions=[_decision(d) for d in decisions] or None, messages=_messages(messages) or None,
                     mode=mode)
        return await self.client.request("POST", f"/v1/runs/{run_id}/inputs",
                                         json_body=body)

    async def decide(self, run_id: str, decisions: Sequence[Mapping[str, Any]]) -> Json:
        """Record decisions `{"target_id": call_id, "action": "resume"|"cancel", "result", "reason"}`
        (a `decision_id`, the idempotency key, is generated when absent); the run continues."""
        return await self.inputs(run_id, decisions=decisions)

    async def pending(self, run_id: str) -> JsonList:
        """The run's calls waiting for a human (suspended, not yet decided), as of its last commit."""
        return pending_calls(await self.current(run_id))

    async def approve(self, run_id: str, call_ids: Sequence[str] | None = None, *, reason: str | None = None,
                      result: Any = APPROVED, always: bool = False) -> Json:
        """Approve `call_ids` (default: every pending call): action `resume`, result
        `{"approved": true}` unless given (`always`: `always_answer(True)`, a standing "always
        allow" of the tool on the thread). The result must answer each call's ticket
        (`InvalidRequest` `invalid_decision` otherwise, nothing recorded). `Conflict`
        (`run_not_waiting`) when nothing waits."""
        return await self._decide_all(run_id, call_ids, "resume", always_answer(True) if always else result, reason)

    async def deny(self, run_id: str, call_ids: Sequence[str] | None = None, *, reason: str | None = None,
                   result: Any = DENIED, always: bool = False) -> Json:
        """Deny `call_ids` (default: every pending call): action `cancel` (the tool does not run;
        the model is told a human turned it down, with `reason`), result `{"approved": false}`.
        `always`: a standing "always deny" of the tool on the thread, which the permission plugin
        records from action `resume` with `always_answer(False)` (the call is denied all the same)."""
        if always:
            return await self._decide_all(run_id, call_ids, "resume", always_answer(False), reason)
        return await self._decide_all(run_id, call_ids, "cancel", result, reason)

    async def resolve(self, run_id: str, call_id: str, action: str, result: Any = None) -> Json:
        """Resolve a call in doubt (it was running when its worker stopped, and its tool is not
        idempotent): `action` `mark_done` (the effect happened: `result` is recorded as the
        call's result), `retry` (run it again, same call id) or `cancel` (the model is told). A
        decision `resume` whose result answers the call's ticket; `InvalidRequest`
        (`invalid_decision`) for anything else, nothing recorded."""
        answer: dict[str, Any] = {"action": action}
        if action == "mark_done":
            answer["result"] = result
        accepted = await self.decide(run_id, [_body(target_id=call_id, action="resume", result=answer)])
        return {**accepted, "decided": [call_id], "action": "resume"}

    async def _decide_all(self, run_id: str, call_ids: Sequence[str] | None, action: str, result: Any,
                          reason: str | None) -> Json:
        targets = list(call_ids or [c["call_id"] for c in await self.pending(run_id)])
        if not targets:
            raise Conflict(f"run {run_id!r} has no call waiting for a decision", code="run_not_waiting")
        accepted = await self.decide(run_id, [_body(target_id=c, action=action, result=result, reason=reason)
                                              for c in targets])
        return {**accepted, "decided": targets, "action": action}

    async def cancel(self, run_id: str, *, reason: str | None = None) -> Json:
        """Cancel a running or waiting run: `{"thread_id", "run_id", "seq"}`."""
        return await self.client.request("POST", f"/v1/runs/{run_id}/cancel",
                                         json_body=_body(reason=reason))

    async def counterfactual(self, run_id: str, call_id: str, *, action: str = "resume", result: Any = None,
                             reason: str | None = None, decision_id: str | None = None,
                             new_thread_id: str | None = None, retries: int = 2) -> Json:
        """Branch the run at the decision of tool call `call_id` into a new thread and take this
        decision there instead ("what if the approver had denied?"): `{"thread_id", "run_id",
        "seq", "forked_from"}`. The new run resumes on a worker; wait for it like any run.

        Idempotent: the new thread's id is chosen here when not given, so a branch asked again
        is made once; no answer or a 503 is sent again, up to `retries` times (as `create`)."""
        decision = _body(action=action, result=result, reason=reason, decision_id=decision_id)
        body = _body(at={"decision": call_id}, decision=decision, new_thread_id=new_thread_id or uuid.uuid4().hex)
        return await self._post_again(f"/v1/runs/{run_id}/counterfactual", body, retries)

    async def replace_answer(self, run_id: str, inference: str | int, *, content: str = "",
                             tool_calls: Sequence[Mapping[str, Any]] = (), new_thread_id: str | None = None,
                             retries: int = 2) -> Json:
        """Branch the run at one of its model's answers (an assistant message id, or the number of
        the inference, 1-based) into a new thread whose run takes this answer instead (`content`
        and/or `tool_calls`: `{"name", "arguments"[, "id"]}`) and goes on from there on a worker:
        `{"thread_id", "run_id", "seq", "forked_from"}`. Idempotent and sent again as
        `counterfactual`."""
        answer = {"content": content, "tool_calls": [dict(c) for c in tool_calls]}
        body = _body(at={"inference": inference}, answer=answer, new_thread_id=new_thread_id or uuid.uuid4().hex)
        return await self._post_again(f"/v1/runs/{run_id}/counterfactual", body, retries)


class Agents:
    """`client.agents`: what the server can run (`/v1/agents`)."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def list(self) -> JsonList:
        """The agents: `{"id", "description", "tools"}` (`tools` is null on a gateway whose
        workers hold the app)."""
        doc = await self.client.request("GET", "/v1/agents")
        agents: JsonList = doc.get("agents") or []
        return agents


class Profiles:
    """`client.profiles`: the long-term state of a `resource_id`, shared by its threads
    (`/v1/profiles/{id}/state`)."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def state(self, profile_id: str, *, at: int | None = None, history: bool = False) -> Json:
        """The profile now, or as of sequence `at` of its stream (time travel): `{"profile_id",
        "at", "version", "state", "keys", "writes", ...}`; `history=True` adds its writes."""
        path = f"/v1/profiles/{urllib.parse.quote(profile_id, safe='')}/state"
        return await self.client.request("GET", path, params=_params(at=at, history=history or None))


#: The statuses of a finished run: `failed` when it ended in an error, else `done`.
FINISHED = ("done", "failed")


def settled(run: Mapping[str, Any]) -> bool:
    """Finished (done or failed), or waiting for a human (a pending call): what `runs.wait` waits for."""
    return run.get("status") in FINISHED or (run.get("status") == "waiting" and bool(pending_calls(run)))


def pending_calls(run: Mapping[str, Any]) -> list[Json]:
    """The calls of a run view that wait for a human: suspended and not yet decided."""
    return [c for c in (run.get("calls") or {}).values() if c.get("status") == "suspended" and not c.get("decision")]


def _messages(messages: Messages) -> Any:
    if isinstance(messages, str):
        return messages
    return [m if isinstance(m, str) else dict(m) for m in messages]


def _decision(decision: Mapping[str, Any]) -> Json:
    return {"decision_id": uuid.uuid4().hex, **decision}


def get_client(url: str | None = None, *, token: str | None = None, timeout: float = 60.0) -> AsyncClient:
    """The async client of the API at `url` (default `$AGENTLOG_URL`, else http://127.0.0.1:8480),
    with bearer `token` (default `$AGENTLOG_API_TOKEN`)."""
    return AsyncClient(url or os.environ.get(URL_ENV) or DEFAULT_URL,
                       token=token if token is not None else os.environ.get(TOKEN_ENV), timeout=timeout)


__all__ = ["APPROVED", "DENIED", "FINISHED", "Agents", "AsyncClient", "RunOptions", "Runs", "Threads", "always_answer",
           "get_client", "pending_calls", "settled"]
