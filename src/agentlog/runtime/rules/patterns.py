"""Tool-call patterns: which calls a permission rule or a reminder rule applies to.

    read_file                        the tool `read_file`
    file_*                           any tool matching the glob (`*` any run of characters, `?` one)
    /mcp__(gh|gl)__.*/               any tool whose whole name matches the regex
    Bash(npm *)                      tool `Bash` whose primary argument matches the glob
    Edit(file_path ~ "src/**")       tool `Edit` whose argument `file_path` matches the glob
    Bash(command =~ "(?i)rm")        ... whose `command` contains a match of the regex
    Edit(file_path ~ "src/*", mode = "w")   conditions joined by commas must all hold

Operators on a named argument: `=` equal, `!=` not equal, `~` glob, `!~` no glob match, `=~` the
regex is found, `!=~` it is not. A field may name a nested argument (`options.mode`); a value is
a double-quoted JSON string, or a bare word (no spaces, commas, quotes or parentheses). A
condition on an argument the call lacks does not hold (nor does its negation: a rule about `path`
says nothing of a call without one). Non-string arguments are compared as their JSON text. The
primary argument is the call's first argument, in the order the model sent them (recorded in the
log, so a replay matches the same way).

`parse_pattern` turns the text into a `ToolPattern` (raising `PatternError` for anything else);
`ToolPattern.matches(name, arguments)` is pure. Globs use `fnmatch` (case-sensitive), the same
globs the rest of agentlog's tool lists use.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Literal

import msgspec

from agentlog.eventlog.errors import AgentlogError

Op = Literal["=", "!=", "~", "!~", "=~", "!=~"]
OPS: tuple[Op, ...] = ("!=~", "=~", "!=", "!~", "=", "~")  # longest first, for the tokenizer
#: The field of a primary-argument condition (`Bash(npm *)`).
PRIMARY = ""

_encode = msgspec.json.Encoder().encode


class PatternError(AgentlogError, ValueError):
    """A tool pattern that does not parse (the message says where)."""

    code = "invalid_tool_pattern"


@dataclass(frozen=True, slots=True)
class Condition:
    """One test on an argument: `field` (dotted path; `PRIMARY` for the first argument) `op` `value`."""

    field: str
    op: Op
    value: str

    def holds(self, arguments: Mapping[str, Any]) -> bool:
        found, value = _argument(arguments, self.field)
        if not found:
            return False
        text = value if isinstance(value, str) else _encode(value).decode()
        op = self.op
        if op in ("=", "!="):
            hit = text == self.value
        elif op in ("~", "!~"):
            hit = fnmatchcase(text, self.value)
        else:
            hit = re.search(self.value, text) is not None
        return hit if op in ("=", "~", "=~") else not hit

    def render(self) -> str:
        value = json.dumps(self.value, ensure_ascii=False)
        return value if self.field == PRIMARY else f"{self.field} {self.op} {value}"


@dataclass(frozen=True, slots=True)
class ToolPattern:
    """A parsed pattern: a tool-name glob or (`regex`) a whole-name regex, and conditions on the
    call's arguments that must all hold."""

    tool: str
    regex: bool = False
    conditions: tuple[Condition, ...] = ()

    def matches_name(self, name: str) -> bool:
        return re.fullmatch(self.tool, name) is not None if self.regex else fnmatchcase(name, self.tool)

    def matches(self, name: str, arguments: Mapping[str, Any] | None = None) -> bool:
        if not self.matches_name(name):
            return False
        args = arguments or {}
        return all(c.holds(args) for c in self.conditions)

    @property
    def exact_name(self) -> str | None:
        """The one tool name this pattern can match, if it names one (no glob, no regex)."""
        if self.regex or any(ch in self.tool for ch in "*?["):
            return None
        return self.tool

    def render(self) -> str:
        """The pattern's text: `parse_pattern(p.render()) == p`."""
        head = f"/{self.tool}/" if self.regex else self.tool
        if not self.conditions:
            return head
        return f"{head}({', '.join(c.render() for c in self.conditions)})"


def _argument(arguments: Mapping[str, Any], field: str) -> tuple[bool, Any]:
    if field == PRIMARY:
        for first in arguments.values():
            return True, first
        return False, None
    value: Any = arguments
    for part in field.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value


_BARE = re.compile(r"[^\s,()\"]+")
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*(?:\.[A-Za-z_][A-Za-z0-9_\-]*)*")


def parse_pattern(text: str) -> ToolPattern:
    """Parse a tool pattern (see the module docstring). Raises `PatternError`."""
    if not isinstance(text, str) or not text.strip():
        raise PatternError("a tool pattern is a non-empty string")
    s = text.strip()
    if s.startswith("/"):
        end = s.find("/", 1)
        while end != -1 and s[end - 1] == "\\":
            end = s.find("/", end + 1)
        if end == -1:
            raise PatternError(f"{text!r}: a regex tool pattern ends with '/'")
        tool, rest, regex = s[1:end], s[end + 1:].strip(), True
        _compile(tool, text)
    else:
        cut = s.find("(")
        tool, rest, regex = (s, "", False) if cut == -1 else (s[:cut].strip(), s[cut:], False)
        if not tool or any(ch.isspace() or ch in ",)\"" for ch in tool):
            raise PatternError(f"{text!r}: the tool name (or glob) comes first, without spaces")
    conditions: tuple[Condition, ...] = ()
    if rest:
        if not (rest.startswith("(") and rest.endswith(")")):
            raise PatternError(f"{text!r}: argument conditions are written in parentheses after the tool")
        conditions = _conditions(rest[1:-1], text)
    return ToolPattern(tool=tool, regex=regex, conditions=conditions)


def _compile(regex: str, text: str) -> None:
    try:
        re.compile(regex)
    except re.error as exc:
        raise PatternError(f"{text!r}: not a regular expression: {exc}") from None


def _conditions(body: str, text: str) -> tuple[Condition, ...]:
    out: list[Condition] = []
    i, n = 0, len(body)

    def skip() -> None:
        nonlocal i
        while i < n and body[i].isspace():
            i += 1

    def value() -> str:
        nonlocal i
        skip()
        if i < n and body[i] == '"':
            decoder = json.JSONDecoder()
            try:
                parsed, end = decoder.raw_decode(body, i)
            except ValueError:
                raise PatternError(f"{text!r}: an unterminated or malformed quoted value") from None
            i = end
            return str(parsed)
        m = _BARE.match(body, i)
        if m is None:
            raise PatternError(f"{text!r}: a value is missing")
        i = m.end()
        return m.group()

    skip()
    if i >= n:
        raise PatternError(f"{text!r}: empty parentheses")
    while True:
        skip()
        m = _FIELD.match(body, i)
        after = m.end() if m else i
        j = after
        while j < n and body[j].isspace():
            j += 1
        op = next((o for o in OPS if body.startswith(o, j)), None) if m else None
        if m is not None and op is not None:
            i = j + len(op)
            cond = Condition(m.group(), op, value())
            if op in ("=~", "!=~"):
                _compile(cond.value, text)
            out.append(cond)
        else:
            if out:
                raise PatternError(f"{text!r}: only the first condition may be a bare primary-argument glob")
            glob = _primary(body, i, text)
            out.append(Condition(PRIMARY, "~", glob[0]))
            i = glob[1]
        skip()
        if i >= n:
            return tuple(out)
        if body[i] != ",":
            raise PatternError(f"{text!r}: conditions are separated by commas")
        i += 1


def _primary(body: str, i: int, text: str) -> tuple[str, int]:
    """A primary-argument glob: a quoted string, or the raw text up to the next comma (spaces
    inside kept: `Bash(npm run *)`)."""
    if body[i] == '"':
        try:
            parsed, end = json.JSONDecoder().raw_decode(body, i)
        except ValueError:
            raise PatternError(f"{text!r}: an unterminated or malformed quoted value") from None
        return str(parsed), end
    end = body.find(",", i)
    end = len(body) if end == -1 else end
    glob = body[i:end].strip()
    if not glob or '"' in glob:
        raise PatternError(f"{text!r}: a primary-argument glob is missing or malformed")
    return glob, end


__all__ = ["PRIMARY", "Condition", "PatternError", "ToolPattern", "parse_pattern"]
