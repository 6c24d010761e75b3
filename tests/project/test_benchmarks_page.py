"""docs/benchmarks.md: every figure of its table stands beside the command that produces it, a
script of this repo with options (and `--only` sections) that script has (read from its source,
nothing is run); every script of scripts/bench_*.py is listed."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "benchmarks.md"


def _table(heading: str) -> list[list[str]]:
    """The rows (cells) of the first table after `## heading`."""
    text = PAGE.read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break  # the end of the first table
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    return [c for c in cells[2:] if c]  # without the header and its rule


def test_every_figure_has_a_command_of_a_script_with_those_options() -> None:
    rows = _table("Figures")
    assert len(rows) >= 10
    for figure, _agentlog, _peer, command in rows:
        m = re.fullmatch(r"`\.venv(?:-bench)?/bin/python (scripts/\w+\.py)((?: --[a-z-]+(?: [\w,]+)?)*)`", command)
        assert m, f"{figure!r}: no command of a script beside it: {command!r}"
        script = ROOT / m[1]
        assert script.is_file(), f"{figure!r}: {m[1]} does not exist"
        source = script.read_text()
        options = set(re.findall(r"add_argument\(\s*\"(--[a-z-]+)\"", source))
        for option in re.findall(r"--[a-z-]+", m[2]):
            assert option in options, f"{figure!r}: {m[1]} has no {option}"
        only = re.search(r"--only ([\w,]+)", m[2])
        if only:
            sections = re.search(r"^SECTIONS = \((.*)\)$", source, re.M)
            assert sections, f"{m[1]} names no SECTIONS"
            for section in only[1].split(","):
                assert f'"{section}"' in sections[1], f"{figure!r}: {m[1]} has no section {section!r}"


def test_every_bench_script_is_listed() -> None:
    listed = {row[0].strip("`") for row in _table("Every benchmark script")}
    scripts = {f"scripts/{p.name}" for p in (ROOT / "scripts").glob("bench_*.py")}
    assert scripts <= listed, sorted(scripts - listed)
