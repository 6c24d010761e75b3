"""Deferred tools: an agent with hundreds of tools (a large MCP catalog) offers the model only
a `tool_search` tool for most of them, and the tools the model finds with it from then on.

`AgentSpec.deferred_tools` names the agent's tools (names or globs) that are deferred. They are
not offered to the model until promoted; `tool_search` (added to the agent's tools, built here,
registered by the `Runtime`) answers a query with the matching tools' schemas, and the system
prompt names the deferred tools not promoted yet (`loadable_note`):

- `select:read_file,write_file` those tools, by name;
- `+github issue` keywords: every word is looked for in a tool's name and description (a `+`
  word must be in the name), tools ranked by how many match; at most `MAX_RESULTS`.

The tools it returns are promoted: it adds them to the thread state under `PROMOTED_KEY` (a
`StatePatched` of the call), so they are offered from the next inference on, in this run and the
thread's later ones, and a resume or a replay reads the promotion from the log. A deferred tool
the model calls without searching first still runs (its arguments are validated as usual).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any

import pydantic

from agentlog.runtime.models.base import ToolSpec
from agentlog.runtime.tools import Tool, ToolContext, ToolResult

#: The search tool's name.
TOOL_SEARCH = "tool_search"
#: The thread-state key of the promoted tools: a list of tool names.
PROMOTED_KEY = "agentlog.deferred_tools"
#: The most tools one keyword search returns (`select:` returns every tool it names).
MAX_RESULTS = 5


def is_deferred(name: str, patterns: Sequence[str]) -> bool:
    return name != TOOL_SEARCH and any(fnmatchcase(name, p) for p in patterns)


def promoted(state: Mapping[str, Any]) -> frozenset[str]:
    """The tools promoted on this thread (a malformed entry promotes nothing: the state is
    anyone's to write)."""
    value = state.get(PROMOTED_KEY)
    if not isinstance(value, list):
        return frozenset()
    return frozenset(v for v in value if isinstance(v, str))


def hidden(names: Iterable[str], patterns: Sequence[str], state: Mapping[str, Any]) -> frozenset[str]:
    """Which of `names` are deferred and not promoted (not offered to the model now)."""
    if not patterns:
        return frozenset()
    up = promoted(state)
    return frozenset(n for n in names if is_deferred(n, patterns) and n not in up)


def loadable_note(names: Sequence[str]) -> str:
    """The line of the system prompt that names the tools `tool_search` can load (empty: none)."""
    if not names:
        return ""
    return f"Tools you can load with {TOOL_SEARCH} (not loaded yet): {', '.join(names)}."


def search(catalog: Sequence[ToolSpec], query: str, limit: int = MAX_RESULTS) -> list[ToolSpec]:
    """The catalog's tools a query finds, best first (pure; see the module docstring)."""
    query = query.strip()
    if query.lower().startswith("select:"):
        wanted = [w.strip() for w in query[len("select:"):].split(",") if w.strip()]
        by_name = {t.name: t for t in catalog}
        return [by_name[w] for w in dict.fromkeys(wanted) if w in by_name]
    words = [w for w in query.lower().split() if w.strip("+")]
    required = [w[1:] for w in words if w.startswith("+")]
    terms = [w.lstrip("+") for w in words]
    scored = []
    for index, spec in enumerate(catalog):
        name, text = spec.name.lower(), f"{spec.name} {spec.description}".lower()
        if any(r not in name for r in required):
            continue
        score = sum(2 if t in name else 1 for t in terms if t in text)
        if score:
            scored.append((-score, index, spec))
    return [spec for _, _, spec in sorted(scored, key=lambda s: (s[0], s[1]))[:limit]]


class _SearchArgs(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    query: str = pydantic.Field(min_length=1, max_length=1000, description=(
        "Keywords to look for in the tools' names and descriptions (a word starting with + must be in the "
        "name), or select:name1,name2 to load tools by name."))


class ToolSearch(Tool):
    """`tool_search`: finds deferred tools of the calling agent and promotes them. Pure but for
    the state patch it records: a replay may run it."""

    def __init__(self) -> None:
        async def tool_search(query: str, ctx: ToolContext) -> ToolResult:
            return run_search(query, ctx)

        super().__init__(TOOL_SEARCH, _DESCRIPTION, _SearchArgs, tool_search, "ctx", category="tools",
                         label="Search tools")


_DESCRIPTION = ("Find tools to use, by keywords or by name, and load them: the tools found are available "
                "to you from your next turn on.")


def run_search(query: str, ctx: ToolContext) -> ToolResult:
    """Search the calling agent's deferred tools and promote the ones found (a state patch)."""
    patterns = list(getattr(ctx.agent, "deferred_tools", ()) or ())
    catalog = [t.spec for name, t in ctx.agent_tools.items() if is_deferred(name, patterns)]
    found = search(catalog, query)
    if not found:
        return ToolResult.success({"tools": [], "note": "no deferred tool matches; try other words"})
    state = ctx.state
    already = [n for n in (state.get(PROMOTED_KEY) or []) if isinstance(n, str)] \
        if isinstance(state.get(PROMOTED_KEY), list) else []
    new = [t.name for t in found if t.name not in already]
    if new:
        ctx.set("/" + PROMOTED_KEY, [*already, *new])
    return ToolResult.success(
        {"tools": [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in found]},
        details={"promoted": new},
    )


__all__ = ["MAX_RESULTS", "PROMOTED_KEY", "TOOL_SEARCH", "ToolSearch", "hidden", "loadable_note", "is_deferred",
           "promoted", "search"]
