"""Permission plugin: allow / deny / ask rules on tool names and named arguments.

Rules are glob patterns (`fnmatch`, case-sensitive): `{"tool": "fs_*", "args": {"path": "/etc/*"}}`
matches a call of any `fs_*` tool whose `path` argument matches `/etc/*` (non-string arguments are
matched on their JSON text). Precedence: deny > ask > allow; with no match the configurable
`default` (allow or deny) applies. Every verdict is recorded as `ToolCallGated{call_id,
verdict, rule}` by the loop, and a deny fails the call with a result that tells the model why.

`ask` suspends the call with a ticket (resume mode replay_tool_call, response schema
`{"approved": bool}`). When the human's decision comes back, the loop replays the call through
this gate with `PhaseContext.decision` set: an approval is recorded as `allow` (same rule) and the
tool runs; `approved: false` is recorded as `deny` and the model is told a human turned it down.
The plugin holds nothing between the two: the decision is in the log.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from typing import Any, Literal

import msgspec
import pydantic

from agentlog.log.events import SuspendTicket, ToolCall

from .hitl import is_approved
from .plugins import Gate, PhaseContext, Plugin

Verdict = Literal["allow", "deny", "ask"]

#: What an approval answer looks like (the ticket's response schema).
APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}, "reason": {"type": "string"}},
    "required": ["approved"],
}
_encode = msgspec.json.Encoder().encode


class PermissionRule(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    tool: str = "*"
    args: dict[str, str] = {}
    #: Recorded as `ToolCallGated.rule`; defaults to a readable form of the rule.
    name: str | None = None

    def matches(self, call: ToolCall) -> bool:
        if not fnmatchcase(call.name, self.tool):
            return False
        for key, pattern in self.args.items():
            if key not in call.arguments:
                return False
            value = call.arguments[key]
            text = value if isinstance(value, str) else _encode(value).decode()
            if not fnmatchcase(text, pattern):
                return False
        return True

    def label(self, verdict: str) -> str:
        if self.name:
            return self.name
        args = ",".join(f"{k}={v}" for k, v in sorted(self.args.items()))
        return f"{verdict}:{self.tool}" + (f"({args})" if args else "")


RuleInput = PermissionRule | Mapping[str, Any] | str


def _rules(rules: Iterable[RuleInput]) -> tuple[PermissionRule, ...]:
    out = []
    for r in rules:
        if isinstance(r, PermissionRule):
            out.append(r)
        elif isinstance(r, str):
            out.append(PermissionRule(tool=r))
        else:
            out.append(PermissionRule.model_validate(dict(r)))
    return tuple(out)


def decide(
    call: ToolCall, allow: Iterable[PermissionRule], deny: Iterable[PermissionRule], default: Verdict,
    ask: Iterable[PermissionRule] = (),
) -> tuple[Verdict, str]:
    """The pure decision: (verdict, rule label). deny > ask > allow > default."""
    for rule in deny:
        if rule.matches(call):
            return "deny", rule.label("deny")
    for rule in ask:
        if rule.matches(call):
            return "ask", rule.label("ask")
    for rule in allow:
        if rule.matches(call):
            return "allow", rule.label("allow")
    return default, f"default:{default}"


class PermissionPlugin(Plugin):
    """`PermissionPlugin(allow=["read_*"], ask=["deploy"], deny=[{"tool": "fs_*", "args": {"path":
    "/etc/*"}}], default="deny")`. A rule may be a tool glob string, a dict, or a `PermissionRule`."""

    id = "permission"

    def __init__(
        self, *, allow: Iterable[RuleInput] = (), deny: Iterable[RuleInput] = (), ask: Iterable[RuleInput] = (),
        default: Verdict = "allow",
    ) -> None:
        if default not in ("allow", "deny"):
            # ask-by-default is `ask=["*"]` (then allow rules never match: ask beats allow)
            raise ValueError(f"default must be 'allow' or 'deny', not {default!r}")
        self.allow = _rules(allow)
        self.deny = _rules(deny)
        self.ask = _rules(ask)
        self.default: Verdict = default

    def before_tool_execute(self, ctx: PhaseContext, call: ToolCall) -> list[Gate]:
        verdict, rule = decide(call, self.allow, self.deny, self.default, self.ask)
        if verdict == "deny":
            reason = f"permission denied: tool {call.name!r} is not allowed here (rule {rule})"
            return [Gate(verdict="deny", rule=rule, reason=reason)]
        if verdict == "ask":
            decision = ctx.decision
            if decision is not None and decision.action == "resume":
                if is_approved(decision.result):
                    return [Gate(verdict="allow", rule=rule)]
                why = decision.reason or (decision.result.get("reason") if isinstance(decision.result, dict) else None)
                reason = f"permission denied by a human: tool {call.name!r} was not approved" + (f" ({why})" if why else "")
                return [Gate(verdict="deny", rule=rule, reason=reason)]
            ticket = SuspendTicket(
                id=call.id, action="approve", message=f"Allow tool {call.name!r} to run? (rule {rule})",
                parameters={"tool": call.name, "arguments": call.arguments}, response_schema=APPROVAL_SCHEMA,
                resume_mode="replay_tool_call",
            )
            return [Gate(verdict="ask", rule=rule, reason=ticket.message, ticket=ticket)]
        return [Gate(verdict="allow", rule=rule)]
