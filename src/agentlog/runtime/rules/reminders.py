"""Reminders: declarative rules that put a message in the model's context after a matching
tool call, at most once every `cooldown` inferences.

    ReminderPlugin([{"tool": "Bash(git push*)", "output": {"status": "error"},
                     "message": "A push failed: run `git status` before trying again.", "cooldown": 3}])

or, in a config file, the agent's section `reminder` (the plugin's `config_model`):

    plugins: ["agentlog.runtime.rules.reminders:ReminderPlugin"]
    sections:
      reminder:
        rules:
          - {tool: "deploy", output: {status: success}, message: "Tell the user the deploy URL."}

A rule matches a finished call when its `tool` pattern (`agentlog.runtime.rules.patterns`: a name,
a glob, argument conditions, a regex) matches the call and its `output` matches the result:
`any`, or a `status` (success / error / pending / any) and a `content` glob over the result's
text (the value's JSON for a non-string value, the message of an error). The message is a keyed
context message (`AddContext(key="reminder:<name>", cooldown=...)`): recorded with the call's
completion and shown at the next inference, so resume and replay show it at the same step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from typing import Any, Literal

import msgspec
import pydantic

from agentlog.eventlog.events import ToolCall
from agentlog.runtime.plugins import Action, AddContext, PhaseContext, Plugin
from agentlog.runtime.rules.patterns import ToolPattern, parse_pattern
from agentlog.runtime.tools import ToolResult

_encode = msgspec.json.Encoder().encode


class ReminderOutput(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    status: Literal["success", "error", "pending", "any"] = "any"
    #: A glob over the result's text; None: any.
    content: str | None = None

    def matches(self, result: ToolResult) -> bool:
        if self.status != "any" and result.status != self.status:
            return False
        if self.content is None:
            return True
        if result.status == "error":
            text = result.error or ""
        else:
            text = result.value if isinstance(result.value, str) else _encode(result.value).decode()
        return fnmatchcase(text, self.content)


class ReminderRule(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    #: Names the rule (its context message's key is `reminder:<name>`); default `rule-<n>`.
    name: str | None = None
    #: A tool pattern: which calls the rule is about.
    tool: str
    output: Literal["any"] | ReminderOutput = "any"
    message: str = pydantic.Field(min_length=1)
    #: Inferences to wait after showing the message before it may be shown again (0: each time).
    cooldown: int = pydantic.Field(default=0, ge=0)
    _pattern: ToolPattern | None = pydantic.PrivateAttr(default=None)

    @pydantic.field_validator("tool")
    @classmethod
    def _tool_parses(cls, v: str) -> str:
        parse_pattern(v)  # a PatternError is a ValueError: a validation error naming the field
        return v

    def model_post_init(self, _context: Any) -> None:
        self._pattern = parse_pattern(self.tool)

    def matches(self, call: ToolCall, result: ToolResult) -> bool:
        assert self._pattern is not None
        if not self._pattern.matches(call.name, call.arguments):
            return False
        return self.output == "any" or self.output.matches(result)


class ReminderConfig(pydantic.BaseModel):
    """The `reminder` section of an agent: its rules (after those the plugin was built with)."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    rules: list[ReminderRule] = []


RuleInput = ReminderRule | Mapping[str, Any]


class ReminderPlugin(Plugin):
    """AfterToolExecute: each rule matching the finished call adds its message to the model's
    context for the next inference (see the module docstring)."""

    id = "reminder"
    config_model = ReminderConfig

    def __init__(self, rules: Iterable[RuleInput] = ()) -> None:
        self.rules = tuple(r if isinstance(r, ReminderRule) else ReminderRule.model_validate(dict(r)) for r in rules)

    def after_tool_execute(self, ctx: PhaseContext, call: ToolCall, result: ToolResult) -> list[Action]:
        config = ctx.config if isinstance(ctx.config, ReminderConfig) else ReminderConfig()
        out: list[Action] = []
        for index, rule in enumerate([*self.rules, *config.rules]):
            if rule.matches(call, result):
                out.append(AddContext(rule.message, key=f"reminder:{rule.name or f'rule-{index}'}",
                                      cooldown=rule.cooldown))
        return out


__all__ = ["ReminderConfig", "ReminderOutput", "ReminderPlugin", "ReminderRule"]
