"""Permission plugin: allow / deny (and, next, ask) rules on tool names and named arguments.

Rules are glob patterns (`fnmatch`, case-sensitive): `{"tool": "fs_*", "args": {"path": "/etc/*"}}`
matches a call of any `fs_*` tool whose `path` argument matches `/etc/*` (non-string arguments are
matched on their JSON text). Precedence: any matching deny wins over any matching allow; with no
match the configurable `default` applies. Every verdict is recorded as `ToolCallGated{call_id,
verdict, rule}` by the loop, and a deny fails the call with a result that tells the model why.

`ask` is part of the vocabulary (`Gate(verdict="ask")` suspends the call with a ticket); the rule
list for it slots in between deny and allow when human-in-the-loop lands.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from typing import Any, Literal

import msgspec
import pydantic

from eventlog.events import ToolCall

from .plugins import Gate, PhaseContext, Plugin

Verdict = Literal["allow", "deny"]
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
    call: ToolCall, allow: Iterable[PermissionRule], deny: Iterable[PermissionRule], default: Verdict
) -> tuple[Verdict, str]:
    """The pure decision: (verdict, rule label). deny > allow > default."""
    for rule in deny:
        if rule.matches(call):
            return "deny", rule.label("deny")
    for rule in allow:
        if rule.matches(call):
            return "allow", rule.label("allow")
    return default, f"default:{default}"


class PermissionPlugin(Plugin):
    """`PermissionPlugin(allow=["read_*"], deny=[{"tool": "fs_*", "args": {"path": "/etc/*"}}],
    default="deny")`. A rule may be a tool glob string, a dict, or a `PermissionRule`."""

    id = "permission"

    def __init__(
        self, *, allow: Iterable[RuleInput] = (), deny: Iterable[RuleInput] = (), default: Verdict = "allow"
    ) -> None:
        if default not in ("allow", "deny"):
            raise ValueError(f"default must be 'allow' or 'deny', not {default!r}")
        self.allow = _rules(allow)
        self.deny = _rules(deny)
        self.default: Verdict = default

    def before_tool_execute(self, ctx: PhaseContext, call: ToolCall) -> list[Gate]:
        verdict, rule = decide(call, self.allow, self.deny, self.default)
        reason = None
        if verdict == "deny":
            reason = f"permission denied: tool {call.name!r} is not allowed here (rule {rule})"
        return [Gate(verdict=verdict, rule=rule, reason=reason)]
