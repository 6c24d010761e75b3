"""HTTP routes of the protocol adapters (DESIGN 5.1), plugged in with
`create_app(..., extra_routes=adapters.routes.ROUTES)`.

    POST /v1/ag-ui/agents/{agent_id}/runs     RunAgentInput -> AG-UI events (SSE, official encoder)
    POST /v1/ag-ui/agents/{agent_id}/connect  reconnect to the thread's run: snapshots, then the rest
    GET  /v1/ag-ui/threads/{id}/messages      the thread as AG-UI messages
    GET  /v1/agents                           the agents a client can run (ids, descriptions, tools)
    POST /v1/ai-sdk/agents/{agent_id}/runs    useChat body -> UI message stream (SSE, [DONE])
    GET  /v1/ai-sdk/runs/{id}/stream          the run's current turn replayed from the log
    GET  /v1/ai-sdk/threads/{id}/messages     the thread as AI SDK UI messages

The handlers only parse, pull the first event (so an unknown / other-tenant thread is still a
404 JSON answer, not a 200 stream), then encode and write; what a request does is decided in
`session` so the NATS transport (`nats_routes`) behaves the same. Invalid bodies are 400 with
field detail; everything after the headers (resume mismatches, run conflicts, failed runs) is a
protocol error event inside the stream. Streams go through `agentlog.gateway.http.sse.Pump`: a bounded
queue (a stalled client is dropped, the run goes on) and heartbeat comments.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, TypeVar

from ag_ui import core as ag
from ag_ui.encoder import EventEncoder
from aiohttp import web

from agentlog.eventlog.errors import AgentlogError
from agentlog.gateway.adapters import session
from agentlog.gateway.adapters.agui import session as agui_session
from agentlog.gateway.adapters.aisdk import session as aisdk_session
from agentlog.gateway.adapters.aisdk import translator as aisdk
from agentlog.gateway.adapters.common import AdapterInputError, guarded
from agentlog.gateway.http.errors import ApiError
from agentlog.gateway.http.replies import reply
from agentlog.gateway.http.requests import principal, services
from agentlog.gateway.http.routing import Route, path_id
from agentlog.gateway.http.sse import Pump
from agentlog.gateway.operations.auth import Principal
from agentlog.gateway.operations.json_input import parse_json

_ENCODER = EventEncoder()
_Request = TypeVar("_Request")


async def _json_body(request: web.Request) -> Any:
    raw = await request.read()
    return parse_json(raw) if raw else None


def _bad_input(exc: AdapterInputError) -> ApiError:
    return ApiError(400, exc.code, str(exc), detail=[{"field": exc.field, "message": str(exc), "type": exc.code}])


async def _stream(request: web.Request, events: AsyncGenerator[Any, None], encode: Callable[[Any], str],
                  on_error: Callable[[BaseException], Any], headers: dict[str, str],
                  tail: bytes = b"") -> web.StreamResponse:
    """Pull the first event (typed errors before it are JSON answers), then stream the rest;
    whatever fails after the headers ends the stream with `on_error`'s event (`guarded`)."""
    first: list[Any] = []
    failed: list[BaseException] = []
    try:
        first.append(await events.__anext__())
    except StopAsyncIteration:
        pass
    except AdapterInputError as exc:
        raise _bad_input(exc) from None
    except (AgentlogError, ApiError):
        raise
    except Exception as exc:  # noqa: BLE001 - unexpected: still an error event in the stream
        failed.append(exc)

    async def source() -> AsyncIterator[Any]:
        for ev in first:
            yield ev
        if failed:
            raise failed[0]
        async for ev in events:
            yield ev

    async def frames() -> AsyncIterator[bytes]:
        try:
            async for frame in guarded(source(), encode, on_error, path=request.path):
                yield frame.encode()
            if tail:
                yield tail
        finally:
            with contextlib.suppress(Exception):
                await events.aclose()

    svc = services(request)
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)
    outcome = await Pump(frames(), response.write, queue_size=svc.settings.sse_queue,
                         heartbeat=svc.settings.sse_heartbeat, stall=svc.settings.sse_stall).run()
    if outcome != "end" and request.transport is not None:
        request.transport.close()
        return response
    with contextlib.suppress(ConnectionError):
        await response.write_eof()
    return response


_SSE = {"Content-Type": _ENCODER.get_content_type(), "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def _run_stream(request: web.Request, parse: Callable[[Any], _Request],
                      events_of: Callable[[session.Backend, str, _Request, Principal], AsyncGenerator[Any, None]],
                      encode: Callable[[Any], str], on_error: Callable[[BaseException], Any],
                      headers: dict[str, str], tail: bytes = b"") -> web.StreamResponse:
    """A protocol's request for the path's agent: parse the body (`parse`; a bad one is a 400),
    then stream `events_of(backend, agent, request, principal)` in the protocol's encoding."""
    svc, who = services(request), principal(request)
    agent_id = path_id(request, "agent_id", "agent_id")
    try:
        req = parse(await _json_body(request))
    except AdapterInputError as exc:
        raise _bad_input(exc) from None
    backend = session.backend_of(svc.store, svc.dispatcher)
    return await _stream(request, events_of(backend, agent_id, req, who), encode, on_error, headers, tail)


async def _visible_thread(request: web.Request) -> session.ThreadLog:
    """The path's thread as the caller may see it; 404 when there is none."""
    svc, who = services(request), principal(request)
    thread_id = path_id(request)
    thread = await session.load_thread(svc.store, thread_id, who)
    if thread.view is None:
        raise ApiError(404, "thread_not_found", f"thread {thread_id!r} not found")
    return thread


# -- AG-UI ---------------------------------------------------------------------------------------


async def agui_run(request: web.Request) -> web.StreamResponse:
    return await _run_stream(request, agui_session.parse, agui_session.events, _ENCODER.encode,
                             agui_session.error_event, _SSE)


async def agui_connect(request: web.Request) -> web.StreamResponse:
    """AG-UI `connect`: a client reconnecting to its thread's run (see `agui.session.connect`)."""
    return await _run_stream(request, agui_session.parse, agui_session.connect, _ENCODER.encode,
                             agui_session.error_event, _SSE)


async def agui_messages(request: web.Request) -> web.Response:
    thread = await _visible_thread(request)
    return reply({"thread_id": thread.thread_id, "messages": agui_session.history(thread)})


# -- AI SDK --------------------------------------------------------------------------------------


def _part(p: Any) -> str:
    return aisdk.encode(p)


async def aisdk_run(request: web.Request) -> web.StreamResponse:
    return await _run_stream(request, aisdk.parse_chat_request, aisdk_session.events, _part,
                             aisdk_session.error_part, dict(aisdk.HEADERS), aisdk.DONE.encode())


async def aisdk_stream(request: web.Request) -> web.StreamResponse:
    svc, who = services(request), principal(request)
    run_id = path_id(request, kind="run_id")
    backend = session.backend_of(svc.store, svc.dispatcher)
    return await _stream(request, aisdk_session.replay(backend, run_id, who), _part,
                         aisdk_session.error_part, dict(aisdk.HEADERS), aisdk.DONE.encode())


async def aisdk_messages(request: web.Request) -> web.Response:
    thread = await _visible_thread(request)
    branch = await aisdk_session.chat_branch(services(request).store, thread, principal(request))  # a regenerated chat: its fork
    return reply({"thread_id": thread.thread_id, "messages": aisdk_session.history(branch)})


# -- agents --------------------------------------------------------------------------------------


#: The catalog of the app this gateway serves, set by the server assembly (`agentlog.cli.assembly`)
#: whenever it knows the app (always in `serve`, with `--app` in `gateway`): the dispatcher of a
#: deployment is the work queue, which knows agent ids only.
AGENT_CATALOG = web.AppKey("agentlog.agent_catalog", list)


async def list_agents(request: web.Request) -> web.Response:
    catalog = request.app.get(AGENT_CATALOG)
    if catalog is None:
        dispatcher = services(request).dispatcher
        catalog = dispatcher.agent_catalog() if dispatcher is not None else []
    return reply({"agents": catalog})


_AGENTS = {"type": "object", "properties": {"agents": {"type": "array", "items": {
    "type": "object", "required": ["id", "description", "tools"], "properties": {
        "id": {"type": "string"}, "description": {"type": "string"},
        "tools": {"type": ["array", "null"], "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "description": {"type": "string"},
            "parameters": {"type": "object"}, "category": {"type": "string"}, "label": {"type": "string"},
            "idempotent": {"type": "boolean", "description": "false: an interrupted call goes in doubt"}}}},
        "plugins": {"type": "array", "description": "the agent's configurable plugins", "items": {
            "type": "object", "properties": {"id": {"type": "string"}, "config_key": {"type": "string"},
                                             "config_schema": {"type": "object"}}}}}}}}}

_MESSAGES = {"type": "object", "properties": {"thread_id": {"type": "string"},
                                              "messages": {"type": "array", "items": {"type": "object"}}}}

ROUTES: list[Route] = [
    Route("GET", "/v1/agents", list_agents, "The agents this gateway runs: ids, descriptions, tools",
          "agents", response=_AGENTS),
    Route("POST", "/v1/ag-ui/agents/{agent_id}/runs", agui_run,
          "AG-UI: run an agent on RunAgentInput (new messages, or resume[] for the waiting run, or "
          "tool messages answering pending frontend tool calls); AG-UI events as SSE", "ag-ui",
          body=ag.RunAgentInput, content_type="text/event-stream", errors=(404,)),
    Route("POST", "/v1/ag-ui/agents/{agent_id}/connect", agui_connect,
          "AG-UI connect: reconnect to the thread's run (RunAgentInput naming the thread): RUN_STARTED, "
          "the state and messages as of now, then the rest of the run from the log; AG-UI events as SSE",
          "ag-ui", body=ag.RunAgentInput, content_type="text/event-stream", errors=(404,)),
    Route("GET", "/v1/ag-ui/threads/{id}/messages", agui_messages, "AG-UI: the thread's messages",
          "ag-ui", response=_MESSAGES, errors=(404,)),
    Route("POST", "/v1/ai-sdk/agents/{agent_id}/runs", aisdk_run,
          "AI SDK v6: chat request -> UI message stream (SSE, ends with [DONE])", "ai-sdk",
          body=aisdk.ChatRequestBody, content_type="text/event-stream", errors=(404,)),
    Route("GET", "/v1/ai-sdk/runs/{id}/stream", aisdk_stream,
          "AI SDK v6: the run's current turn replayed from the log (resume-stream)", "ai-sdk",
          content_type="text/event-stream", errors=(404,)),
    Route("GET", "/v1/ai-sdk/threads/{id}/messages", aisdk_messages, "AI SDK v6: the thread as UI messages",
          "ai-sdk", response=_MESSAGES, errors=(404,)),
]

__all__ = ["AGENT_CATALOG", "ROUTES"]
