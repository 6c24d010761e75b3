"""A remote A2A agent as a sub-agent: a tool that sends its prompt to the agent over A2A (the
official a2a-sdk client) and completes with the remote task's answer.

    ask_researcher = remote_agent_tool("ask_researcher", "http://127.0.0.1:8080/a2a/researcher")
    Runtime(store, agents=[AgentSpec(id="boss", ..., tools=["ask_researcher"])], tools=[ask_researcher])

What enters the log is the call and its result, like any tool: resume and verified replay need
no remote agent (the tool carries `replay_from_log`, so replay answers it from the recorded
result). The remote task's progress (its status messages) goes to the call's live progress. A
remote task that needs input (A2A input-required) suspends the call with a ticket naming the
remote task (`use_decision_as_tool_result`: a human answers for it). A call re-run after a crash
sends the message again (at-least-once, like any tool; the message id is the call id, so a
server that deduplicates by message id sees one).
"""

from __future__ import annotations

from typing import Any

from agentlog.runtime.tools import Tool, ToolContext, ToolError, ToolResult

#: A2A task states (a2a.types.a2a_pb2.TaskState) by name, resolved on first use.
_COMPLETED, _INPUT_REQUIRED = "TASK_STATE_COMPLETED", "TASK_STATE_INPUT_REQUIRED"


def remote_agent_tool(name: str, url: str, *, card_path: str | None = None, description: str | None = None,
                      timeout: float = 300.0) -> Tool:
    """A tool `name(prompt)` that asks the A2A agent at `url` (its base URL; the card is read from
    `url + card_path`, default `/.well-known/agent-card.json`)."""

    async def call(prompt: str, ctx: ToolContext) -> ToolResult:
        import httpx
        from a2a.client import A2ACardResolver, ClientConfig, create_client
        from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest, TaskState
        from a2a.utils.errors import A2AError

        async with httpx.AsyncClient(timeout=timeout) as http:
            try:
                resolver = A2ACardResolver(http, url, card_path or "/.well-known/agent-card.json")
                card = await resolver.get_agent_card()
                client = await create_client(card, ClientConfig(streaming=card.capabilities.streaming,
                                                                httpx_client=http))
                request = SendMessageRequest(message=Message(
                    message_id=ctx.call_id, role=Role.ROLE_USER, parts=[Part(text=prompt)]))
                task = None
                async for event in client.send_message(request):
                    kind = event.WhichOneof("payload")
                    if kind == "task":
                        task = event.task
                    elif kind == "status_update" and task is not None:
                        task.status.CopyFrom(event.status_update.status)
                        text = _text(event.status_update.status.message.parts)
                        if text:
                            ctx.progress({"remote_task_id": task.id, "state": TaskState.Name(task.status.state),
                                          "text": text})
                    elif kind == "artifact_update" and task is not None:
                        task.artifacts.append(event.artifact_update.artifact)
                    elif kind == "message":
                        return ToolResult.success({"output": _text(event.message.parts)})
            except (A2AError, httpx.HTTPError, ValueError) as exc:
                raise ToolError(f"A2A agent at {url}: {type(exc).__name__}: {exc}") from None
        if task is None:
            raise ToolError(f"A2A agent at {url} answered no task")
        state = TaskState.Name(task.status.state)
        answer = _text([p for a in task.artifacts for p in a.parts]) or _text(task.status.message.parts)
        result = {"task_id": task.id, "context_id": task.context_id, "state": state, "output": answer,
                  "agent": card.name}
        if state == _COMPLETED:
            return ToolResult.success(result)
        if state == _INPUT_REQUIRED:
            return ToolResult.pending(
                ctx.call_id, action="remote_input", resume_mode="use_decision_as_tool_result",
                message=f"remote A2A agent {card.name} needs input: {_text(task.status.message.parts)}",
                parameters={"url": url, "task_id": task.id, "context_id": task.context_id},
            )
        return ToolResult.failure(f"remote A2A task {task.id} ended {state}", result)

    tool = Tool.from_function(call, name=name, description=description or f"Ask the remote A2A agent at {url}.")
    tool.replay_from_log = True  # a remote side effect: never re-sent by replay
    return tool


def _text(parts: Any) -> str:
    return "\n".join(p.text for p in parts if p.WhichOneof("content") == "text" and p.text)


__all__ = ["remote_agent_tool"]
