"""Code lives in the room that a contributor would look in (docs/DESIGN.md "Where things live").

Each name below has one home; a module that only re-exports another's names, or product code that
only the tests use, is not a home. The check reads module specs (nothing is started).
"""

from __future__ import annotations

import importlib
import importlib.util
import pathlib

import pytest

#: Modules that are not part of the product: test helpers live in tests/, and a name is imported
#: from its real home rather than from a module that re-exports it.
GONE = [
    "agentlog.gateway.adapters.frontend",  # frontend tool stubs: tests/support/frontend_stubs.py
    # re-exports of agentlog.gateway.operations.{services,auth}; the aiohttp side is http.requests
    "agentlog.gateway.http.context",
    "agentlog.gateway.http.auth",
    # moved into the runtime's rooms (imported from there, no shim at the old path)
    "agentlog.runtime.admission",  # inputs/
    "agentlog.runtime.run_input",  # inputs/
    "agentlog.runtime.frontend",  # inputs/
    "agentlog.runtime.agent",  # agents/spec.py
    "agentlog.runtime.handoff",  # agents/
    "agentlog.runtime.skills",  # toolkits/
]


#: How many modules the root of `agentlog.runtime` may hold before the next one must go in a room.
RUNTIME_ROOT_LIMIT = 15


def test_runtime_root_is_small() -> None:
    """The runtime's root keeps the modules many rooms share; the rest live in rooms (loop/, inputs/,
    agents/, ...) whose names say what is inside."""
    runtime = importlib.util.find_spec("agentlog.runtime")
    assert runtime is not None and runtime.submodule_search_locations
    root = pathlib.Path(next(iter(runtime.submodule_search_locations)))
    modules = sorted(p.stem for p in root.glob("*.py") if p.stem != "__init__")
    assert len(modules) <= RUNTIME_ROOT_LIMIT, modules
    for room in (p for p in root.iterdir() if p.is_dir() and p.name != "__pycache__"):
        assert (room / "__init__.py").is_file(), f"{room.name}/ is not a package"


#: The runtime's public face: what the gateway may import (the package's own names, and these rooms).
RUNTIME_FACE = {"inputs", "workers", "models", "replay", "config"}


def test_the_gateway_contract_closes_every_room_of_the_runtime_but_its_face() -> None:
    """The import-linter contract that keeps the gateway on the runtime's public face forbids every
    other module and room of `agentlog.runtime`: one added later is closed too, or named here."""
    import tomllib

    pyproject = tomllib.loads((pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    [contract] = [c for c in pyproject["tool"]["importlinter"]["contracts"]
                  if c.get("source_modules") == ["agentlog.gateway"]]
    runtime = importlib.util.find_spec("agentlog.runtime")
    assert runtime is not None and runtime.submodule_search_locations
    root = pathlib.Path(next(iter(runtime.submodule_search_locations)))
    rooms = {p.stem for p in root.glob("*.py") if p.stem != "__init__"}
    rooms |= {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}
    assert {"loop", "loading"} <= rooms
    closed = {m.removeprefix("agentlog.runtime.") for m in contract["forbidden_modules"]}
    assert closed == rooms - RUNTIME_FACE


@pytest.mark.parametrize("module", GONE)
def test_module_is_not_shipped(module: str) -> None:
    assert importlib.util.find_spec(module) is None, f"{module} should not be in the product"


#: (name, its home, modules that must not define it too).
HOMES = [
    # an HTTP server: the gateway's http room, not the runtime (which speaks no HTTP)
    ("serve_metrics", "agentlog.gateway.http.metrics", ["agentlog.runtime.telemetry"]),
    # what a handler reads off the request, next to the middleware that puts the caller there
    ("SERVICES", "agentlog.gateway.http.requests", []),
    ("services", "agentlog.gateway.http.requests", []),
    ("principal", "agentlog.gateway.http.requests", []),
    ("auth_middleware", "agentlog.gateway.http.requests", []),
]


@pytest.mark.parametrize(("name", "home", "elsewhere"), HOMES)
def test_name_has_one_home(name: str, home: str, elsewhere: list[str]) -> None:
    assert hasattr(importlib.import_module(home), name)
    for module in elsewhere:
        assert not hasattr(importlib.import_module(module), name), f"{name} belongs in {home}, not {module}"
