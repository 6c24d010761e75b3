"""Permission plugin: allow / deny / ask rules on tool names and named arguments.

Rules are glob patterns (`fnmatch`, case-sensitive): `{"tool": "fs_*", "args": {"path": "/etc/*"}}`
matches a call of any `fs_*` tool whose `path` argument matches `/etc/*` (non-string arguments are
matched on their JSON text). A rule written as a string is a tool pattern
(`agentlog.runtime.rules.patterns`): `"read_*"`, `"Bash(npm *)"` (the primary argument),
`'Edit(file_path ~ "src/**")'` (a named argument's glob), `'Bash(command =~ "(?i)rm")'` (a
regex), `"/mcp__(gh|gl)__.*/"` (a regex on the tool name); a dict may give one as `pattern`.
Precedence: deny > ask > allow; with no match the configurable
`default` (allow or deny) applies. Every verdict is recorded as `ToolCallGated{call_id,
verdict, rule}` by the loop, and a deny fails the call with a result that tells the model why.

`ask` suspends the call with a ticket (resume mode replay_tool_call, response schema
`{"approved": bool}`). When the human's decision comes back, the loop replays the call through
this gate with `PhaseContext.decision` set: an approval is recorded as `allow` (same rule) and the
tool runs; `approved: false` is recorded as `deny` and the model is told a human turned it down.
The plugin holds nothing between the two: the decision is in the log.

Standing permissions: an answer with `"always": true` (`{"approved": true, "always": true}`, or
false) also stores a rule in the thread state under `agentlog.permissions` (`{"allow": [rule],
"deny": [rule]}`, each rule `{"tool", "args"}`; the answer's optional `args` patterns narrow it),
committed with the decision's gate as a `StatePatched`, so resume and replay read it from the
log. From then on, on this thread: a standing deny fails a matching call without asking (and a
tool denied whatever its arguments is hidden from the model), a standing allow lets a call the
rules would ask about run. A configured deny still wins over a standing allow. Revoke a rule by
removing it from the state (`DELETE /v1/threads/{id}/permissions`, `agentlog thread revoke`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from typing import Any, Literal

import msgspec
import pydantic

from agentlog.eventlog.events import SuspendTicket, ToolCall
from agentlog.runtime.loop.hitl import APPROVAL_SCHEMA, is_approved
from agentlog.runtime.plugins import Action, ExcludeTools, Gate, PatchState, PhaseContext, Plugin
from agentlog.runtime.rules.patterns import ToolPattern, parse_pattern

Verdict = Literal["allow", "deny", "ask"]

# An approval's answer may also carry `always` and `args`, the standing-rule options below; they
# stay out of APPROVAL_SCHEMA so that forms built from it, like the inspector's, still send just an
# approval.
#: The thread-state key of the standing rules.
STANDING_KEY = "agentlog.permissions"
_encode = msgspec.json.Encoder().encode


class PermissionRule(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    tool: str = "*"
    args: dict[str, str] = {}
    #: A tool pattern (`agentlog.runtime.rules.patterns`: `Bash(npm *)`, `Edit(file_path ~
    #: "src/**")`, `/mcp__(gh|gl)__.*/`), checked as well as `tool` and `args`.
    pattern: str | None = None
    #: Recorded as `ToolCallGated.rule`; defaults to a readable form of the rule.
    name: str | None = None
    _parsed: ToolPattern | None = pydantic.PrivateAttr(default=None)

    @pydantic.field_validator("pattern")
    @classmethod
    def _pattern_parses(cls, v: str | None) -> str | None:
        if v is not None:
            parse_pattern(v)  # PatternError is a ValueError: a validation error naming the field
        return v

    def model_post_init(self, _context: Any) -> None:
        self._parsed = parse_pattern(self.pattern) if self.pattern is not None else None

    def matches(self, call: ToolCall) -> bool:
        if not fnmatchcase(call.name, self.tool):
            return False
        if self._parsed is not None and not self._parsed.matches(call.name, call.arguments):
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
        if self.pattern is not None and self.tool == "*" and not self.args:
            return f"{verdict}:{self.pattern}"
        args = ",".join(f"{k}={v}" for k, v in sorted(self.args.items()))
        return f"{verdict}:{self.tool}" + (f"({args})" if args else "") + (f"[{self.pattern}]" if self.pattern else "")

    @classmethod
    def from_text(cls, text: str) -> PermissionRule:
        """A rule from a tool pattern: a plain glob is a `tool` rule, anything else (argument
        conditions, a regex) a `pattern` rule. Raises `PatternError`."""
        parsed = parse_pattern(text)
        if not parsed.regex and not parsed.conditions:
            return cls(tool=parsed.tool)
        return cls(pattern=text.strip())


RuleInput = PermissionRule | Mapping[str, Any] | str


def _rules(rules: Iterable[RuleInput]) -> tuple[PermissionRule, ...]:
    out = []
    for r in rules:
        if isinstance(r, PermissionRule):
            out.append(r)
        elif isinstance(r, str):
            out.append(PermissionRule.from_text(r))
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


def standing_rules(state: Mapping[str, Any]) -> tuple[tuple[PermissionRule, ...], tuple[PermissionRule, ...]]:
    """(allow, deny) standing rules of a thread state; malformed entries are ignored (the state
    is anyone's to write, a bad entry must not break every later call)."""
    stored = state.get(STANDING_KEY)
    out: dict[str, list[PermissionRule]] = {"allow": [], "deny": []}
    if isinstance(stored, Mapping):
        for verdict in out:
            for raw in stored.get(verdict) or ():
                try:
                    rule = PermissionRule.model_validate(raw)
                except pydantic.ValidationError:
                    continue
                out[verdict].append(PermissionRule(tool=rule.tool, args=rule.args, name=f"standing:{rule.label(verdict)}"))
    return tuple(out["allow"]), tuple(out["deny"])


def remember(state: Mapping[str, Any], verdict: str, call: ToolCall, result: Any) -> PatchState:
    """The state patch that stores a standing rule for `call`'s tool (narrowed by the answer's
    `args` patterns), replacing an equal rule of the other verdict."""
    args = result.get("args") if isinstance(result, Mapping) else None
    rule = {"tool": call.name, **({"args": {str(k): str(v) for k, v in args.items()}}
                                  if isinstance(args, Mapping) and args else {})}
    stored = state.get(STANDING_KEY)
    current = dict(stored) if isinstance(stored, Mapping) else {}
    other = "deny" if verdict == "allow" else "allow"
    kept = {v: [r for r in (current.get(v) or []) if r != rule] for v in ("allow", "deny")}
    value = {**current, verdict: [*kept[verdict], rule], other: kept[other]}
    return PatchState(ops=({"op": "add", "path": "/" + STANDING_KEY, "value": value},))


def _always(result: Any) -> bool:
    return isinstance(result, Mapping) and result.get("always") is True


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

    def before_inference(self, ctx: PhaseContext) -> list[Action]:
        """Tools a standing rule denies whatever their arguments are not offered to the model."""
        _allow, deny = standing_rules(ctx.state)
        hidden = tuple(sorted({r.tool for r in deny if not r.args and "*" not in r.tool and "?" not in r.tool}))
        return [ExcludeTools(names=hidden)] if hidden else []

    def before_tool_execute(self, ctx: PhaseContext, call: ToolCall) -> list[Action]:
        verdict, rule = decide(call, self.allow, self.deny, self.default, self.ask)
        if verdict == "deny":
            reason = f"permission denied: tool {call.name!r} is not allowed here (rule {rule})"
            return [Gate(verdict="deny", rule=rule, reason=reason)]
        standing_allow, standing_deny = standing_rules(ctx.state)
        for standing in standing_deny:
            if standing.matches(call):
                label = standing.label("deny")
                return [Gate(verdict="deny", rule=label,
                             reason=f"permission denied: tool {call.name!r} is denied on this thread (rule {label})")]
        if verdict == "ask":
            decision = ctx.decision
            if decision is not None and decision.action == "resume":
                approved = is_approved(decision.result)
                remembered = ([remember(ctx.state, "allow" if approved else "deny", call, decision.result)]
                              if _always(decision.result) else [])
                if approved:
                    return [Gate(verdict="allow", rule=rule), *remembered]
                why = decision.reason or (decision.result.get("reason") if isinstance(decision.result, dict) else None)
                reason = f"permission denied by a human: tool {call.name!r} was not approved" + (f" ({why})" if why else "")
                return [Gate(verdict="deny", rule=rule, reason=reason), *remembered]
            for standing in standing_allow:
                if standing.matches(call):
                    return [Gate(verdict="allow", rule=standing.label("allow"))]
            ticket = SuspendTicket(
                id=call.id, action="approve", message=f"Allow tool {call.name!r} to run? (rule {rule})",
                parameters={"tool": call.name, "arguments": call.arguments}, response_schema=APPROVAL_SCHEMA,
                resume_mode="replay_tool_call",
            )
            return [Gate(verdict="ask", rule=rule, reason=ticket.message, ticket=ticket)]
        return [Gate(verdict="allow", rule=rule)]
