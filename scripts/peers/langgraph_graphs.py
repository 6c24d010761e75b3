"""The peer's side of scripts/bench_peers.py: the same workloads as LangGraph graphs, with a
scripted model (no network). Imported by the bench itself and, for the API server, named in the
`langgraph.json` the bench writes (`approval_forever`)."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def _asked(state: State) -> int:
    return sum(1 for m in state["messages"] if isinstance(m, AIMessage))


def _call(name: str, args: dict[str, Any], n: int, text: str = "") -> AIMessage:
    return AIMessage(content=text, tool_calls=[{"name": name, "args": args, "id": f"call{n}", "type": "tool_call"}],
                     id=f"ai{n}")


def _route(state: State) -> str:
    last = state["messages"][-1]
    return "tools" if isinstance(last, AIMessage) and last.tool_calls else END


def loop_graph(steps: int, checkpointer: Any) -> Any:
    """`steps` model turns: `steps - 1` calls of `work`, then an answer."""

    def agent(state: State) -> dict[str, Any]:
        n = _asked(state)
        if n < steps - 1:
            return {"messages": [_call("work", {"n": n}, n)]}
        return {"messages": [AIMessage(content="done", id=f"ai{n}")]}

    def tools(state: State) -> dict[str, Any]:
        call = state["messages"][-1].tool_calls[0]  # type: ignore[union-attr]
        return {"messages": [ToolMessage(content=str(call["args"]["n"] + 1), tool_call_id=call["id"])]}

    g = StateGraph(State)
    g.add_node("agent", agent)
    g.add_node("tools", tools)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", _route, ["tools", END])
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=checkpointer)


def approval_graph(checkpointer: Any = None, *, cycles: int | None = None) -> Any:
    """The model asks for approval after every answer (an `interrupt` in the tool), for ever, or
    answers after `cycles` approvals."""

    def agent(state: State) -> dict[str, Any]:
        n = _asked(state)
        if cycles is not None and n >= cycles:
            return {"messages": [AIMessage(content="all done", id=f"ai{n}")]}
        return {"messages": [_call("approve", {"why": f"cycle {n}"}, n, text=f"asking approval #{n}")]}

    def tools(state: State) -> dict[str, Any]:
        call = state["messages"][-1].tool_calls[0]  # type: ignore[union-attr]
        decision = interrupt({"call_id": call["id"], "why": call["args"]["why"]})
        return {"messages": [ToolMessage(content="approved" if decision.get("approved") else "denied",
                                         tool_call_id=call["id"])]}

    g = StateGraph(State)
    g.add_node("agent", agent)
    g.add_node("tools", tools)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", _route, ["tools", END])
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=checkpointer)


#: For the API server (`langgraph.json`): asks for approval after every answer, as
#: `scripts/bench_e2e.py`'s app does. The server supplies the checkpointer (in memory under
#: `langgraph dev`).
approval_forever = approval_graph()
