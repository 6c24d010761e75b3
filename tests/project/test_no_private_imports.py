"""No module of src/agentlog imports another module's private names (`_x`).

A leading underscore says "only this module relies on it": a private name imported elsewhere is a
dependency that the name hides, so a change made "safely" inside one module breaks another. A name
that other modules need is public (no underscore). The one allowance is the convention of
temporalio and msgspec: a package may keep private modules (`pkg/_impl.py`) whose names its own
modules share freely, with the public ones re-exported by the package.

The check reads the source with `ast` (nothing is imported): `from agentlog.m import _x`
(absolute or relative, at any depth of the file), `from agentlog.pkg import _module`, and
`m._x` where `m` is a module bound by an import.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

#: (importing module, module imported from, name) allowed to cross anyway: none. An entry must
#: say why; a stale one fails the test, so the list only shrinks.
ALLOWED: set[tuple[str, str, str]] = set()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _modules(root: Path = SRC) -> dict[str, Path]:
    """Module name -> file, for the `agentlog` package under `root`."""
    found = {}
    for path in sorted((root / "agentlog").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _package(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _shared_privately(importer: str, importer_path: Path, source: str) -> bool:
    """A private module's names, used by a module of the same package (temporalio's convention)."""
    return source.rpartition(".")[2].startswith("_") and source.rpartition(".")[0] == _package(importer, importer_path)


def private_imports(modules: dict[str, Path]) -> list[tuple[str, str, str, int]]:
    """(importer, source module, private name, line) for every cross-module private import."""
    found = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        bound: dict[str, str] = {}  # local name -> agentlog module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = _package(module, path).split(".")
                    base = base[: len(base) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                if source.split(".")[0] != "agentlog":
                    continue
                for alias in node.names:
                    target = f"{source}.{alias.name}"
                    if target in modules:
                        bound[alias.asname or alias.name] = target
                        if _private(alias.name) and _package(module, path) != source:
                            found.append((module, source, alias.name, node.lineno))
                    elif _private(alias.name) and not _shared_privately(module, path, source):
                        found.append((module, source, alias.name, node.lineno))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "agentlog" and alias.asname:
                        bound[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                    and _private(node.attr) and bound[node.value.id] != module
                    and not _shared_privately(module, path, bound[node.value.id])):
                found.append((module, bound[node.value.id], node.attr, node.lineno))
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    modules = _modules()
    assert len(modules) > 100  # the scan sees the package
    found = private_imports(modules)
    offending = sorted(f"{modules[m]}:{line}: {name} from {source}" for m, source, name, line in found
                       if (m, source, name) not in ALLOWED)
    assert not offending, "private names imported across modules (make them public):\n" + "\n".join(offending)
    # an allowance nobody needs any more goes, so that the list only shrinks
    stale = ALLOWED - {(m, source, name) for m, source, name, _ in found}
    assert not stale, f"allowed but no longer imported (remove from ALLOWED): {sorted(stale)}"


def test_the_check_sees_each_form(tmp_path: Path) -> None:
    """The scan flags each form it claims to (guards the test above against passing vacuously)."""
    pkg = tmp_path / "agentlog" / "pkg"
    pkg.mkdir(parents=True)
    (tmp_path / "agentlog" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from agentlog.pkg._impl import _shared, public\n")
    (pkg / "_impl.py").write_text("_shared = 1\npublic = 2\n")
    (pkg / "a.py").write_text("_hidden = 1\n")
    (pkg / "sibling.py").write_text("from agentlog.pkg._impl import _shared\n")
    (pkg / "b.py").write_text(
        "from agentlog.pkg.a import _hidden\n"
        "from .a import _hidden as again\n"
        "from agentlog.pkg import a\n"
        "def f():\n"
        "    from agentlog.pkg import _impl\n"
        "    return a._hidden, _impl._shared\n")
    (tmp_path / "agentlog" / "other.py").write_text(
        "from agentlog.pkg import _impl\n"
        "from agentlog.pkg._impl import _shared\n")
    assert sorted(private_imports(_modules(tmp_path))) == [
        # a private module and its private names, from outside its package
        ("agentlog.other", "agentlog.pkg", "_impl", 1),
        ("agentlog.other", "agentlog.pkg._impl", "_shared", 2),
        # the absolute, relative and attribute forms (the lazy import of the package's own
        # private module, and its names, are the allowed convention)
        ("agentlog.pkg.b", "agentlog.pkg.a", "_hidden", 1),
        ("agentlog.pkg.b", "agentlog.pkg.a", "_hidden", 2),
        ("agentlog.pkg.b", "agentlog.pkg.a", "_hidden", 6),
    ]
