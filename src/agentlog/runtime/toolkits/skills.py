"""Skills: folders of instructions an agent loads when a task calls for them (the SKILL.md format
of Anthropic's Agent Skills).

A skill is a folder holding `SKILL.md`: YAML front matter with `name` and `description`, then a
markdown body (the instructions), plus any other files (references, templates, scripts) the body
points to. A `SkillCatalog` reads the folders once (names, descriptions, bodies and the list of
files; the files' contents are read when asked for). The model sees only the names and
descriptions, listed in the system prompt by `SkillsPlugin`, and loads what it needs with two
tools: `load_skill(name)` (the body, and the files it may read) and `read_skill_file(name,
path)` (one file, inside the skill's folder, size-limited, text only).

Everything the model learns of a skill arrives as a tool result, an event in the log like any
other: a resume, and a replay (which answers tools from the log), see exactly what it saw then
even if the folder changed since. The listing is part of the model request, so replay's request
digest notices a catalog whose names or descriptions changed.

Declared in the config file (`skills:` folders, and per agent `skills:` names or globs); from
Python: `SkillCatalog.load(...)`, `SkillsPlugin(catalog)` and `skill_tools(catalog)`.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from agentlog.eventlog.errors import AgentlogError
from agentlog.runtime.plugins import AddContext, HookResult, PhaseContext, Plugin
from agentlog.runtime.tools import Tool, ToolContext, ToolResult

SKILL_FILE = "SKILL.md"
#: Anthropic's limits on the front matter: a lowercase name of letters, digits and hyphens.
_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
MAX_DESCRIPTION = 1024
#: The largest file `read_skill_file` returns (bytes): a skill's files are prompts, not data sets.
MAX_FILE_BYTES = 256 * 1024
#: Files listed per skill at most (a folder with more is cut, and says so).
MAX_LISTED_FILES = 200


class SkillError(AgentlogError):
    """A problem with a skill; `code` says which (the tools return it as the result's value)."""

    code = "skill_error"


class InvalidSkill(SkillError):
    """A SKILL.md without valid front matter (name, description), or a duplicate name."""

    code = "invalid_skill"


class SkillNotFound(SkillError, LookupError):
    code = "skill_not_found"


class SkillFileNotFound(SkillError, LookupError):
    code = "skill_file_not_found"


class SkillPathInvalid(SkillError, ValueError):
    """A path that is absolute, climbs out of the skill's folder (`..`, a symlink), or is empty."""

    code = "skill_path_invalid"


class SkillFileTooLarge(SkillError):
    code = "skill_file_too_large"


class SkillFileNotText(SkillError):
    code = "skill_file_not_text"


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    #: The instructions: SKILL.md after its front matter.
    body: str
    #: The skill's folder (resolved).
    root: Path
    #: The other files of the folder, as POSIX paths relative to it, sorted.
    files: tuple[str, ...] = ()


def parse_skill_md(text: str, source: str = SKILL_FILE) -> tuple[dict[str, Any], str]:
    """Split SKILL.md into its front matter (a YAML mapping between `---` lines) and body.
    Raises `InvalidSkill` (naming `source`) for missing or malformed front matter."""
    import yaml

    lines = text.lstrip("\ufeff").splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        raise InvalidSkill(f"{source}: SKILL.md must start with YAML front matter between '---' lines")
    end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
    if end is None:
        raise InvalidSkill(f"{source}: the front matter has no closing '---' line")
    try:
        meta = yaml.safe_load("".join(lines[1:end])) or {}
    except yaml.YAMLError as exc:
        raise InvalidSkill(f"{source}: the front matter is not valid YAML: {exc}") from None
    if not isinstance(meta, dict):
        raise InvalidSkill(f"{source}: the front matter must be a mapping (name, description)")
    name, description = meta.get("name"), meta.get("description")
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise InvalidSkill(f"{source}: `name` must be 1-64 lowercase letters, digits or hyphens, got {name!r}")
    if not isinstance(description, str) or not description.strip() or len(description) > MAX_DESCRIPTION:
        raise InvalidSkill(f"{source}: `description` must be a non-empty string of at most {MAX_DESCRIPTION} characters")
    return meta, "".join(lines[end + 1:]).strip("\n")


def load_skill_dir(folder: Path) -> Skill:
    """One skill folder (holding SKILL.md). Raises `InvalidSkill`."""
    root = folder.resolve()
    skill_md = root / SKILL_FILE
    try:
        text = skill_md.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidSkill(f"{skill_md}: cannot read it: {exc}") from None
    meta, body = parse_skill_md(text, str(skill_md))
    files: list[str] = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if (p.is_file() and rel.as_posix() != SKILL_FILE and not any(part.startswith(".") for part in rel.parts)
                and p.resolve().is_relative_to(root)):  # only what `read_file` would return
            files.append(rel.as_posix())
    return Skill(name=meta["name"], description=meta["description"].strip(), body=body, root=root,
                 files=tuple(files[:MAX_LISTED_FILES]))


class SkillCatalog:
    """Skills by name, read from folders."""

    def __init__(self, skills: Iterable[Skill] = ()) -> None:
        self._skills: dict[str, Skill] = {}
        for skill in skills:
            if skill.name in self._skills:
                raise InvalidSkill(f"two skills are named {skill.name!r}: {self._skills[skill.name].root} and {skill.root}")
            self._skills[skill.name] = skill

    @classmethod
    def load(cls, *folders: str | Path) -> SkillCatalog:
        """Each folder is a skill (it holds SKILL.md) or a catalog of them (its subfolders that
        hold one; others are ignored). Raises `InvalidSkill` (a folder that does not exist, a
        bad SKILL.md, two skills with one name)."""
        skills: list[Skill] = []
        for folder in folders:
            path = Path(folder)
            if not path.is_dir():
                raise InvalidSkill(f"{path}: not a folder")
            if (path / SKILL_FILE).is_file():
                skills.append(load_skill_dir(path))
                continue
            skills += [load_skill_dir(sub) for sub in sorted(path.iterdir()) if (sub / SKILL_FILE).is_file()]
        return cls(skills)

    def names(self) -> list[str]:
        return sorted(self._skills)

    def __iter__(self) -> Iterator[Skill]:
        return iter([self._skills[n] for n in self.names()])

    def __len__(self) -> int:
        return len(self._skills)

    def get(self, name: str) -> Skill:
        try:
            return self._skills[name]
        except KeyError:
            raise SkillNotFound(f"no skill named {name!r} (skills: {', '.join(self.names()) or 'none'})") from None

    def select(self, patterns: Iterable[str]) -> list[str]:
        """The names matching `patterns` (names or globs), in catalog order; a pattern matching
        nothing raises `SkillNotFound` (a typo would otherwise hide a skill)."""
        names = self.names()
        out: list[str] = []
        for pattern in patterns:
            matched = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
            if not matched:
                raise SkillNotFound(f"no skill matches {pattern!r} (skills: {', '.join(names) or 'none'})")
            out += [n for n in matched if n not in out]
        return [n for n in names if n in out]

    def read_file(self, name: str, path: str, *, max_bytes: int = MAX_FILE_BYTES) -> str:
        """A file of skill `name`, by its path relative to the skill's folder. Raises
        `SkillNotFound`, `SkillPathInvalid` (absolute, `..`, out of the folder through a
        symlink), `SkillFileNotFound`, `SkillFileTooLarge`, `SkillFileNotText`."""
        skill = self.get(name)
        rel = PurePosixPath(path.replace("\\", "/"))
        if not path.strip() or rel.is_absolute() or ".." in rel.parts or re.match(r"^[A-Za-z]:", path):
            raise SkillPathInvalid(f"{path!r}: give a path inside the skill's folder, like {skill.files[0] if skill.files else 'reference.md'!r}")
        target = (skill.root / rel).resolve()
        if not target.is_relative_to(skill.root):
            raise SkillPathInvalid(f"{path!r} leads out of the skill's folder")
        if not target.is_file():
            listed = ", ".join(skill.files) or "none"
            raise SkillFileNotFound(f"skill {name!r} has no file {path!r} (files: {listed})")
        size = target.stat().st_size
        if size > max_bytes:
            raise SkillFileTooLarge(f"{path!r} is {size} bytes, more than the {max_bytes} a read may return")
        try:
            return target.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise SkillFileNotText(f"{path!r} is not UTF-8 text") from None


def skills_prompt(skills: Iterable[Skill]) -> str:
    """The system prompt section listing `skills` (names and descriptions only)."""
    lines = [
        "Skills: folders of instructions for particular tasks. When a task matches a skill's "
        "description, call load_skill(name) first and follow what it says; read the files it "
        "mentions with read_skill_file(name, path).",
    ]
    lines += [f"- {s.name}: {s.description}" for s in skills]
    return "\n".join(lines)


class SkillsPlugin(Plugin):
    """Lists the catalog's skills (or those named by `names`) in the system prompt of every
    inference (BeforeInference `AddContext`)."""

    id = "skills"

    def __init__(self, catalog: SkillCatalog, names: Collection[str] | None = None) -> None:
        self.catalog = catalog
        chosen = [s for s in catalog if names is None or s.name in names]
        self.text = skills_prompt(chosen) if chosen else ""

    def before_inference(self, ctx: PhaseContext) -> HookResult:
        return [AddContext(self.text)] if self.text else None


def _failure(exc: SkillError) -> ToolResult:
    return ToolResult.failure(str(exc), value={"code": exc.code})


def skill_tools(catalog: SkillCatalog, allowed: Mapping[str, Collection[str]] | None = None,
                *, max_bytes: int = MAX_FILE_BYTES) -> list[Tool]:
    """`load_skill` and `read_skill_file` over `catalog`. `allowed`: per agent id, the skills
    it may load (an agent it does not name may load none); None: every agent, every skill."""

    def check(name: str, ctx: ToolContext) -> Skill:
        skill = catalog.get(name)
        if allowed is not None and name not in allowed.get(ctx.agent_id, ()):
            raise SkillNotFound(f"no skill named {name!r} for agent {ctx.agent_id!r}")
        return skill

    async def load_skill(name: str, ctx: ToolContext) -> ToolResult:
        """Load a skill's instructions (its SKILL.md body) and the list of its other files."""
        try:
            skill = check(name, ctx)
        except SkillError as exc:
            return _failure(exc)
        text = skill.body
        if skill.files:
            text += "\n\nFiles of this skill (read them with read_skill_file):\n" + "\n".join(f"- {f}" for f in skill.files)
        return ToolResult.success(text)

    async def read_skill_file(name: str, path: str, ctx: ToolContext) -> ToolResult:
        """Read one file of a skill, by its path relative to the skill's folder."""
        try:
            check(name, ctx)
            return ToolResult.success(catalog.read_file(name, path, max_bytes=max_bytes))
        except SkillError as exc:
            return _failure(exc)

    return [Tool.from_function(load_skill), Tool.from_function(read_skill_file)]


__all__ = [
    "MAX_FILE_BYTES", "InvalidSkill", "Skill", "SkillCatalog", "SkillError", "SkillFileNotFound",
    "SkillFileNotText", "SkillFileTooLarge", "SkillNotFound", "SkillPathInvalid", "SkillsPlugin",
    "load_skill_dir", "parse_skill_md", "skill_tools", "skills_prompt",
]
