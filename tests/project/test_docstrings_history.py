"""Comments and docstrings say why the code is as it is, not how it got there.

History (which issue asked for a change, what the code "used to" do) lives in git and in the
docs' decision records (docs/design/); a reader of a module or a test needs the reason that holds today. This
scans the Python source of the package, the tests and the scripts, comments and docstrings
alike, for the marks such history leaves: issue references (`#12`, `issue 21`, `issue #14 item
2`), "used to", and "Before:" paragraphs. An upstream reference such as
`nats-io/nats-server#5281` names a fact about a dependency and is allowed.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Where the Python source is; this file is left out (its examples are the marks it looks for).
SOURCES = (ROOT / "src" / "agentlog", ROOT / "tests", ROOT / "scripts")

HISTORY = re.compile(
    r"(?<![\w./-])#\d+\b"        # an issue or PR number of this project (not owner/repo#N)
    r"|\bissues? #?\d+"          # "issue 21", "issue #12 item 2"
    r"|\bused to\b"              # "the loop used to ..."
    r"|(?-i:\bBefore:)",          # "Before: the gateway wrote ..." (a history paragraph)
    re.I,
)


def history_marks(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line of `text` that carries a history mark."""
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if HISTORY.search(line)]


def test_the_pattern_tells_history_from_upstream_references() -> None:
    assert history_marks("x = 1  # see issue #12 item 2")
    assert history_marks('"""Riding out an outage (issue 21)."""')
    assert history_marks("# the loop used to finish the run")
    assert history_marks("fixes #13")
    assert history_marks("Before: the gateway wrote ThreadCreated first.")
    assert not history_marks("acked before: the worker commits, then acks")
    assert not history_marks("#: (nats-io/nats-server#5281, shipped in v2.11.0).")
    assert not history_marks("a tool is used for that; headers['#x']")


def test_comments_and_docstrings_carry_no_history() -> None:
    here = Path(__file__).resolve()
    found = {
        f"{path.relative_to(ROOT)}:{n}": line
        for source in SOURCES
        for path in sorted(source.rglob("*.py"))
        if path != here
        for n, line in history_marks(path.read_text())
    }
    assert not found, "history belongs in git or the docs' decision records (docs/design/):\n" + "\n".join(
        f"  {where}: {line}" for where, line in found.items())
