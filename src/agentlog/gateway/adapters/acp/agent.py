"""An agentlog agent over the Agent Client Protocol (ACP, the `agent-client-protocol` package), for
editors that drive agents on stdio (`agentlog acp --app X`).

    initialize        the agent's capabilities (text prompts; sessions load by id)
    session/new       a new thread (session id = thread id)
    session/load      an existing thread (its id)
    session/prompt    a run of the agent on the thread with the prompt's text; the answer's text
                      streams as `agent_message_chunk`, tool calls as `tool_call` / `tool_call_update`;
                      a call that needs approval becomes `session/request_permission` (allow /
                      reject: the run's decision) and the run goes on; ends with `end_turn`
                      (`cancelled` when the run was cancelled, `refusal` when it failed). Only
                      for a session this connection created or loaded: any other id is refused
                      (-32602) before anything is written
    session/cancel    cancels the session's run in flight; a permission request still open is
                      answered `cancelled` by the client, and the turn ends `cancelled` without
                      a decision sent to the cancelled run

Runs go through the AG-UI session (`agui.session.events`), so starting, deciding and following a
run is the one tested path every adapter uses; this module only maps its events to ACP updates.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ag_ui import core as ag

from agentlog.eventlog.errors import AgentlogError
from agentlog.eventlog.ids import new_id
from agentlog.gateway.adapters import session
from agentlog.gateway.adapters.agui import session as agui_session

#: The permission options offered for an approval (their ids are what the client answers).
ALLOW, REJECT = "allow", "reject"


def _text(prompt: list[Any]) -> str:
    parts = [getattr(block, "text", None) for block in prompt]
    return "\n".join(p for p in parts if isinstance(p, str))


class AgentlogAcpAgent:
    """The ACP `Agent` of one agentlog agent (`agent_id`) over a session `Backend`."""

    def __init__(self, backend: session.Backend, agent_id: str, who: Any = None,
                 version: str = "") -> None:
        self.backend = backend
        self.agent_id = agent_id
        self.who = who
        self.version = version
        self.client: Any = None
        #: session id -> the run in flight (for session/cancel)
        self.running: dict[str, str] = {}
        #: the sessions this connection created or loaded (the only ones it prompts)
        self.sessions: set[str] = set()
        #: sessions whose turn was cancelled (session/cancel, or a permission answered `cancelled`)
        self.cancelled: set[str] = set()

    def on_connect(self, conn: Any) -> None:
        self.client = conn

    async def initialize(self, protocol_version: int, client_capabilities: Any = None, client_info: Any = None,
                         **kwargs: Any) -> Any:
        from acp import PROTOCOL_VERSION, InitializeResponse
        from acp.schema import AgentCapabilities, Implementation

        return InitializeResponse(protocol_version=min(protocol_version, PROTOCOL_VERSION),
                                  agent_capabilities=AgentCapabilities(load_session=True),
                                  agent_info=Implementation(name="agentlog", version=self.version or "0"))

    async def new_session(self, cwd: str, additional_directories: Any = None, mcp_servers: Any = None,
                          **kwargs: Any) -> Any:
        from acp.schema import NewSessionResponse

        session_id = new_id()
        self.sessions.add(session_id)
        return NewSessionResponse(session_id=session_id)

    async def load_session(self, cwd: str, session_id: str, mcp_servers: Any = None, **kwargs: Any) -> Any:
        from acp import RequestError
        from acp.schema import LoadSessionResponse

        try:
            thread = await session.load_thread(self.backend.store, session_id, self.who)
        except (AgentlogError, ValueError):
            thread = None
        if thread is None or thread.view is None:
            raise RequestError.invalid_params({"session_id": session_id, "reason": "unknown session"})
        self.sessions.add(session_id)
        return LoadSessionResponse()

    async def authenticate(self, method_id: str, **kwargs: Any) -> Any:
        return None

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        if session_id in self.running:
            self.cancelled.add(session_id)  # before any await: a permission answer may be next
        run_id = self.running.get(session_id)
        if run_id is not None:
            try:
                await self.backend.dispatcher.cancel(run_id, reason="cancelled by the ACP client")
            except AgentlogError:
                pass  # finished meanwhile

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> Any:
        from acp import PromptResponse, RequestError

        if session_id not in self.sessions:
            raise RequestError.invalid_params({"session_id": session_id, "reason": "unknown session: create it "
                                               "with session/new or load it with session/load"})
        self.cancelled.discard(session_id)
        text = _text(prompt)
        run_id = new_id()
        body: dict[str, Any] = {"threadId": session_id, "runId": run_id, "messages": [
            {"id": new_id(), "role": "user", "content": text}], "tools": [], "context": [], "state": {},
            "forwardedProps": {}}
        self.running[session_id] = run_id
        try:
            while True:
                outcome, interrupts = await self._drive(session_id, body)
                if outcome != "waiting":
                    return PromptResponse(stop_reason=outcome)  # type: ignore[arg-type]  # one of its literals
                resume = []
                for interrupt in interrupts:
                    allowed = await self._ask(session_id, interrupt)
                    if session_id in self.cancelled:  # the turn was cancelled: no decision for its run
                        await self.cancel(session_id)
                        return PromptResponse(stop_reason="cancelled")
                    resume.append({"interruptId": interrupt.id, "status": "resolved" if allowed else "cancelled",
                                   **({"payload": {"approved": True}} if allowed else {})})
                body = {"threadId": session_id, "runId": new_id(), "messages": [], "tools": [], "context": [],
                        "state": {}, "forwardedProps": {}, "resume": resume}
        finally:
            self.running.pop(session_id, None)

    async def _drive(self, session_id: str, body: dict[str, Any]) -> tuple[str, list[ag.Interrupt]]:
        """One AG-UI request, its events sent as ACP updates. Returns the stop reason (or
        `waiting` with the open interrupts)."""
        from acp import start_tool_call, update_agent_message_text, update_tool_call

        send: Callable[[Any], Any] = lambda update: self.client.session_update(session_id=session_id,  # noqa: E731
                                                                               update=update)
        req = agui_session.parse(body)
        calls: dict[str, str] = {}
        args: dict[str, str] = {}
        outcome, interrupts = "end_turn", []
        async for ev in agui_session.events(self.backend, self.agent_id, req, self.who):
            if isinstance(ev, ag.TextMessageContentEvent) and ev.delta:
                await send(update_agent_message_text(ev.delta))
            elif isinstance(ev, ag.ToolCallStartEvent):
                calls[ev.tool_call_id] = ev.tool_call_name
                args[ev.tool_call_id] = ""
            elif isinstance(ev, ag.ToolCallArgsEvent):
                args[ev.tool_call_id] = args.get(ev.tool_call_id, "") + ev.delta
            elif isinstance(ev, ag.ToolCallEndEvent):
                await send(start_tool_call(ev.tool_call_id, calls.get(ev.tool_call_id, "tool"), kind="other",
                                           status="pending", raw_input=_json(args.get(ev.tool_call_id, ""))))
            elif isinstance(ev, ag.ToolCallResultEvent):
                await send(update_tool_call(ev.tool_call_id, status="completed", raw_output=_json(ev.content)))
            elif isinstance(ev, ag.RunErrorEvent):
                outcome = "refusal"
            elif isinstance(ev, ag.RunFinishedEvent):
                result = ev.outcome
                if isinstance(result, ag.RunFinishedInterruptOutcome):
                    outcome, interrupts = "waiting", list(result.interrupts)
                elif isinstance(result, ag.RunFinishedCancelledOutcome):
                    outcome = "cancelled"
        return outcome, interrupts

    async def _ask(self, session_id: str, interrupt: ag.Interrupt) -> bool:
        """`session/request_permission` for one open call: True if the client allowed it."""
        from acp.schema import AllowedOutcome, PermissionOption, ToolCallUpdate

        meta = (interrupt.metadata or {}).get("agentlog", {})
        tool = ToolCallUpdate(tool_call_id=interrupt.id, title=interrupt.message or f"run {meta.get('toolName')}",
                              raw_input=meta.get("arguments"), status="pending")
        options = [PermissionOption(option_id=ALLOW, name="Allow", kind="allow_once"),
                   PermissionOption(option_id=REJECT, name="Reject", kind="reject_once")]
        answer = await self.client.request_permission(session_id=session_id, tool_call=tool, options=options)
        chosen = answer.outcome
        if getattr(chosen, "outcome", None) == "cancelled":  # the client cancelled the turn
            self.cancelled.add(session_id)
        return isinstance(chosen, AllowedOutcome) and chosen.option_id == ALLOW


def _json(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


__all__ = ["ALLOW", "REJECT", "AgentlogAcpAgent"]
