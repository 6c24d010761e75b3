"""docs/DESIGN.md describes the code as built: every module it names exists.

A contributor places a change with its "Where things live" table and its sections, so a path or
module name there that no longer exists sends them to the wrong room. This extracts every
`agentlog/...` path and every dotted `agentlog.x.y` name from the file and checks each against
the tree: a path is a file or folder under `src/`; a dotted name is a module or package, or a
name defined in one (`agentlog.runtime.loading.RunLoader`). NATS subjects and metadata keys that
share the `agentlog.` prefix (`agentlog.ev.<thread>.<run>`, `agentlog.api.runs.start`) are not
module names and are left out by their first token.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DESIGN = REPO / "docs" / "DESIGN.md"

#: First tokens after `agentlog.` that name NATS subjects or metadata keys, never modules.
NOT_MODULES = {"ev", "pf", "live", "cmd", "ctl", "dlq", "api", "archived", "branch", "resumed", "ag-ui", "ai-sdk"}

PATH = re.compile(r"(?<![\w/.])(?:src/)?(agentlog/[\w./-]*[\w/])")
DOTTED = re.compile(r"(?<![\w/.-])agentlog(?:\.[A-Za-z_][\w-]*)+")


def paths(text: str) -> set[str]:
    return {m.group(1).rstrip("/") for m in PATH.finditer(text)}


def dotted_names(text: str) -> set[str]:
    return {m.group(0).rstrip(".") for m in DOTTED.finditer(text)
            if m.group(0).split(".")[1] not in NOT_MODULES}


def resolves(name: str) -> bool:
    """`name` is a module, or an attribute chain of the longest module prefix of it."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_extraction_sees_paths_and_module_names() -> None:
    text = ("a new event -> `agentlog/eventlog/events.py`, folder `agentlog/runtime/loop/`; "
            "module `agentlog.runtime.loading.RunLoader`, subject `agentlog.ev.<thread>.<run>`, "
            "endpoint `agentlog.api.runs.start`.")
    assert paths(text) == {"agentlog/eventlog/events.py", "agentlog/runtime/loop"}
    assert dotted_names(text) == {"agentlog.runtime.loading.RunLoader"}
    assert resolves("agentlog.runtime.loading.RunLoader")
    assert not resolves("agentlog.log.store")
    assert not resolves("agentlog.runtime.loading.NoSuchLoader")


def test_every_module_docs_design_names_exists() -> None:
    text = DESIGN.read_text()
    found_paths, found_names = paths(text), dotted_names(text)
    assert len(found_paths) > 20 and len(found_names) > 20, "the design names the modules it describes"
    missing = sorted(p for p in found_paths if not (REPO / "src" / p).exists())
    unresolved = sorted(n for n in found_names if not resolves(n))
    assert not missing and not unresolved, f"docs/DESIGN.md names what does not exist: {missing + unresolved}"


def test_design_opens_with_where_things_live() -> None:
    """The first section after the title is the table a contributor places a change with."""
    headings = re.findall(r"^## (.+)$", DESIGN.read_text(), re.M)
    assert headings[0] == "Where things live"
