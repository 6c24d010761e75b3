"""The protocol adapters over NATS request/reply: the same sessions as the HTTP routes.

    agentlog.ag-ui.runs    body: RunAgentInput         header Agentlog-Agent: <agent id>
    agentlog.ai-sdk.runs   body: useChat request        header Agentlog-Agent: <agent id>

The requester subscribes to its reply inbox first, then publishes with `reply=inbox`. The inbox
receives the encoded events one message each (the AG-UI event JSON / the AI SDK part JSON, as
the HTTP `data:` lines carry them), then one empty-body message that ends the stream (SSE has the
connection end / `[DONE]` for that; NATS has no stream end of its own). An invalid request gets
exactly one error event (RUN_ERROR / `error` part) and the end marker; nothing is written.
Without the header the runtime's only agent is used (a multi-agent gateway needs the header).

Auth is the HTTP API's (`AGENTLOG_TOKENS`): with tokens configured a request
must carry `Authorization: Bearer <token>`; a tenant token only sees and creates threads whose
`resource_id` starts with its prefix (another tenant's thread answers like an unknown one). A
refused request gets one error event with the micro error headers (`Nats-Service-Error-Code`
401/403) and the end marker; nothing is written.

Why a queue group: any number of gateways can serve the subjects; each request is handled once.
Why a task per request: a long run must not hold up the subscription's other requests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

import structlog
from nats.aio.client import Client as NATS

from agentlog.eventlog.jetstream.store import flush_subscriptions
from agentlog.gateway.adapters import session
from agentlog.gateway.adapters.agui import session as agui_session
from agentlog.gateway.adapters.aisdk import session as aisdk_session
from agentlog.gateway.adapters.aisdk import translator as aisdk
from agentlog.gateway.adapters.common import AdapterInputError, guarded
from agentlog.gateway.operations.auth import Authenticator, Principal, resolve_tokens
from agentlog.gateway.operations.errors import ApiError
from agentlog.gateway.operations.json_input import parse_json

log = structlog.get_logger("agentlog.gateway.adapters.nats")

AGUI_SUBJECT = "agentlog.ag-ui.runs"
AISDK_SUBJECT = "agentlog.ai-sdk.runs"
AGENT_HEADER = "Agentlog-Agent"
QUEUE = "agentlog-adapters"
END = b""


def _agui_bytes(ev: Any) -> bytes:
    return ev.model_dump_json(by_alias=True, exclude_none=True).encode()


def _part_bytes(p: Any) -> bytes:
    return aisdk.encode(p)[len("data: "):-2].encode()


class AdapterService:
    """Serves both subjects on `nc` for `backend` (`session.Backend`). `start()`/`stop()`, or
    `async with`. `agent_ids`: the agents to default to when a request names none."""

    def __init__(self, nc: NATS, backend: session.Backend, *, default_agent: str | None = None,
                 auth_tokens: str | Mapping[str, str | None] | None = "") -> None:
        """`auth_tokens` as for `create_app` (`None` reads AGENTLOG_TOKENS; "" = no auth)."""
        self.nc = nc
        self.backend = backend
        self.default_agent = default_agent
        self.auth = Authenticator(resolve_tokens(auth_tokens))
        self._subs: list[Any] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._subs.append(await self.nc.subscribe(AGUI_SUBJECT, queue=QUEUE, cb=self._on_agui))
        self._subs.append(await self.nc.subscribe(AISDK_SUBJECT, queue=QUEUE, cb=self._on_aisdk))
        await flush_subscriptions(self.nc)  # requests from other connections must find us

    async def stop(self) -> None:
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs.clear()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self) -> AdapterService:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- per request -----------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _on_agui(self, msg: Any) -> None:
        self._spawn(self._serve(msg, self._agui, _agui_bytes, agui_session.error_event))

    async def _on_aisdk(self, msg: Any) -> None:
        self._spawn(self._serve(msg, self._aisdk, _part_bytes, aisdk_session.error_part))

    def _agent(self, msg: Any) -> str:
        agent = (msg.headers or {}).get(AGENT_HEADER) or self.default_agent
        if not agent:
            raise AdapterInputError(f"name the agent in the {AGENT_HEADER} header", AGENT_HEADER)
        return agent

    def _who(self, msg: Any) -> Principal:
        """The caller, as the HTTP auth middleware decides it (raises `ApiError` 401/403)."""
        return self.auth.authenticate((msg.headers or {}).get("Authorization"))

    def _agui(self, msg: Any) -> AsyncGenerator[Any, None]:
        who = self._who(msg)
        req = agui_session.parse(_body(msg.data))
        return agui_session.events(self.backend, self._agent(msg), req, who)

    def _aisdk(self, msg: Any) -> AsyncGenerator[Any, None]:
        who = self._who(msg)
        req = aisdk.parse_chat_request(_body(msg.data))
        return aisdk_session.events(self.backend, self._agent(msg), req, who)

    async def _serve(self, msg: Any, open_events: Callable[[Any], AsyncGenerator[Any, None]],
                     encode: Callable[[Any], bytes], error: Callable[[BaseException], Any]) -> None:
        if not msg.reply:
            return  # a publish without a reply inbox has nowhere to stream to
        events: AsyncGenerator[Any, None] | None = None
        try:
            try:
                events = open_events(msg)
            except ApiError as exc:  # refused by auth: the micro error headers say why
                await self.nc.publish(msg.reply, encode(error(exc)), headers={
                    "Nats-Service-Error": exc.message, "Nats-Service-Error-Code": str(exc.status)})
            except Exception as exc:  # noqa: BLE001 - typed or not, the requester must never hang
                await self.nc.publish(msg.reply, encode(error(exc)))
            else:
                async for frame in guarded(events, encode, error, subject=msg.subject):
                    await self.nc.publish(msg.reply, frame)
            await self.nc.publish(msg.reply, END)
        except Exception as exc:  # noqa: BLE001 - the connection went away mid-answer
            log.warning("adapter reply failed", error=str(exc))
        finally:
            if events is not None:
                with contextlib.suppress(Exception):
                    await events.aclose()


def _body(data: bytes) -> Any:
    return parse_json(data) if data else None


__all__ = ["AGENT_HEADER", "AGUI_SUBJECT", "AISDK_SUBJECT", "AdapterService", "END"]
