"""Tool patterns (agentlog.runtime.rules.patterns) and the permission rules written with them:
parsing round-trips, each operator means what it says (hypothesis against fnmatch / re), bad
patterns are typed errors, and the permission plugin and config use them."""

from __future__ import annotations

import json
import re
from fnmatch import fnmatchcase
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from agentlog.eventlog.events import ToolCall
from agentlog.runtime.config import ConfigError, parse_config
from agentlog.runtime.permission import PermissionPlugin, PermissionRule, decide
from agentlog.runtime.rules.patterns import PRIMARY, Condition, PatternError, ToolPattern, parse_pattern

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
fields = st.lists(names, min_size=1, max_size=3).map(".".join)
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
globs = st.text(st.sampled_from("ab/*?._- "), min_size=1, max_size=8)
ops = st.sampled_from(["=", "!=", "~", "!~", "=~", "!=~"])
regexes = st.sampled_from(["rm", "(?i)rm", "^src/", r"\d+", "a|b", ".*"])


@st.composite
def conditions(draw: Any) -> Condition:
    op = draw(ops)
    value = draw(regexes) if op in ("=~", "!=~") else draw(texts)
    return Condition(draw(fields), op, value)


@st.composite
def patterns(draw: Any) -> ToolPattern:
    regex = draw(st.booleans())
    tool = draw(st.sampled_from([r"mcp__(gh|gl)__.*", r"[a-z]+", r"Bash"])) if regex else draw(
        st.text(st.sampled_from("ab_*?"), min_size=1, max_size=6))
    conds = draw(st.lists(conditions(), max_size=3))
    if conds and draw(st.booleans()):
        conds = [Condition(PRIMARY, "~", draw(globs)), *conds]
    return ToolPattern(tool=tool, regex=regex, conditions=tuple(conds))


@given(patterns())
def test_a_rendered_pattern_parses_back_to_itself(pattern: ToolPattern) -> None:
    assert parse_pattern(pattern.render()) == pattern


@given(names, names)
def test_a_name_without_wildcards_matches_exactly_itself(tool: str, other: str) -> None:
    p = parse_pattern(tool)
    assert p.exact_name == tool and p.matches(tool) and p.matches(other) == (other == tool)


@given(st.text(st.sampled_from("ab_*?"), min_size=1, max_size=6), names)
def test_a_tool_glob_matches_as_fnmatch(glob: str, name: str) -> None:
    assert parse_pattern(glob).matches(name) == fnmatchcase(name, glob)


@given(st.sampled_from([r"mcp__(gh|gl)__.*", r"[a-z]+", "read_.*"]), names)
def test_a_regex_tool_pattern_matches_the_whole_name(regex: str, name: str) -> None:
    assert parse_pattern(f"/{regex}/").matches(name) == (re.fullmatch(regex, name) is not None)


@given(fields, ops, texts, st.one_of(texts, st.integers(), st.booleans(), st.none()))
def test_each_operator_means_what_it_says(field: str, op: str, value: str, arg: Any) -> None:
    if op in ("=~", "!=~"):
        try:
            re.compile(value)
        except re.error:
            assume(False)
    text = f"Tool({field} {op} {json.dumps(value)})"
    pattern = parse_pattern(text)
    args: dict[str, Any] = {}
    cursor = args
    parts = field.split(".")
    for part in parts[:-1]:
        cursor = cursor.setdefault(part, {})
    cursor[parts[-1]] = arg
    seen = arg if isinstance(arg, str) else json.dumps(arg, separators=(",", ":"))
    base = op.replace("!", "") if op != "!=" else "="
    # only the operator's own meaning: a value that is no regex is fine for `=` and `~`
    expected = {"=": lambda: seen == value, "~": lambda: fnmatchcase(seen, value),
                "=~": lambda: re.search(value, seen) is not None}[base]()
    want = expected if not op.startswith("!") else not expected
    assert pattern.matches("Tool", args) == want
    assert not pattern.matches("Tool", {})  # an absent argument: neither the condition nor its negation
    assert not pattern.matches("Other", args)


@given(st.text(max_size=30))
def test_parsing_anything_either_works_or_is_a_pattern_error(text: str) -> None:
    try:
        parse_pattern(text)
    except PatternError as exc:
        assert exc.code == "invalid_tool_pattern"


@pytest.mark.parametrize("text, call, hit", [
    ("Bash(npm *)", ("Bash", {"command": "npm install left-pad"}), True),
    ("Bash(npm *)", ("Bash", {"command": "rm -rf /"}), False),
    ('Edit(file_path ~ "src/**")', ("Edit", {"file_path": "src/a/b.py", "text": "x"}), True),
    ('Edit(file_path ~ "src/**")', ("Edit", {"file_path": "docs/a.md"}), False),
    ('Bash(command =~ "(?i)rm")', ("Bash", {"command": "sudo RM -rf"}), True),
    ("/mcp__(gh|gl)__.*/", ("mcp__gl__issues", {}), True),
    ("/mcp__(gh|gl)__.*/", ("mcp__bb__issues", {}), False),
    ('Edit(file_path ~ "src/*", mode = w)', ("Edit", {"file_path": "src/x", "mode": "w"}), True),
    ('Edit(file_path ~ "src/*", mode = w)', ("Edit", {"file_path": "src/x", "mode": "r"}), False),
    ("fetch(opts.method = POST)", ("fetch", {"opts": {"method": "POST"}}), True),
    ("count(n = 3)", ("count", {"n": 3}), True),
])
def test_the_documented_patterns(text: str, call: tuple[str, dict[str, Any]], hit: bool) -> None:
    assert parse_pattern(text).matches(*call) is hit


@pytest.mark.parametrize("text", ["", "  ", "/unterminated", "/(/", "Bash(", "Bash()", 'Edit(p ~ "x)',
                                  'Bash(c =~ "(")', "Edit(a = b c)", "Edit(a = b, npm *)", "a b"])
def test_malformed_patterns_are_typed_errors(text: str) -> None:
    with pytest.raises(PatternError):
        parse_pattern(text)


def test_permission_rules_written_as_patterns() -> None:
    plugin = PermissionPlugin(allow=["Bash(npm *)", 'Edit(file_path ~ "src/**")'],
                              deny=['Bash(command =~ "(?i)\\\\brm\\\\b")', "/mcp__(gh|gl)__delete_.*/"], default="deny")
    call = lambda name, **args: ToolCall(id="c", name=name, arguments=args)  # noqa: E731
    verdict = lambda c: decide(c, plugin.allow, plugin.deny, plugin.default, plugin.ask)  # noqa: E731
    assert verdict(call("Bash", command="npm test")) == ("allow", "allow:Bash(npm *)")
    assert verdict(call("Bash", command="npm run rm")) == ("deny", 'deny:Bash(command =~ "(?i)\\\\brm\\\\b")')
    assert verdict(call("Edit", file_path="src/x.py")) == ("allow", 'allow:Edit(file_path ~ "src/**")')
    assert verdict(call("Edit", file_path="etc/passwd"))[0] == "deny"
    assert verdict(call("mcp__gh__delete_repo"))[0] == "deny"
    # a plain glob string stays a tool rule (the labels recorded before patterns existed)
    assert PermissionRule.from_text("fs_*") == PermissionRule(tool="fs_*")
    assert PermissionRule(pattern="Bash(npm *)").matches(call("Bash", cmd="npm ci"))


def test_a_bad_permission_pattern_in_a_config_names_it() -> None:
    text = "models: {m: {type: scripted, script: [x]}}\nagents: [{id: a, model: m, permissions: {deny: ['Bash(']}}]"
    with pytest.raises(ConfigError, match=r"permissions\.deny"):
        parse_config(text)
