"""`--app module:attr`: load the user's application (its agents, tools and models).

agentlog never guesses what an application is; the attribute named by `module:attr` must be one
of these, so a typo or a wrong object fails at once with a clear, typed error instead of deep
inside a run:

1. an `agentlog.runtime.App`: `App(agents=[...], tools=[...], models={"name": model})`;
2. a `runtime.Runtime` (made on another store, e.g. at import time, its parts are re-wired onto
   the command's store: `agentlog.cli.assembly.build_runtime`);
3. agents alone: a `runtime.AgentRegistry` or a list/tuple of `AgentSpec` (no tools, models by
   instance), wrapped in an `App`;
4. a callable `factory(store) -> any of the above`: for apps that build models or clients per
   process; it is called with the command's `EventStore` once the store is open.

`serve`, `gateway` and `worker` all go through `resolve_app`, so every form works for every
command.

Any object with `agents` and `tools` attributes (and optionally `models`) also works (duck
typing, like `Runtime` itself). The module is imported with the current directory on `sys.path`,
like `python -m`, so `--app myproject.agents:app` works from the project root.

Errors (all `AppLoadError`, a usage error: the CLI exits 2 with one red line):
`InvalidAppSpec` (not `module:attr`), `AppModuleNotFound`, `AppImportFailed` (the module raised
while importing), `AppAttributeMissing`, `AppWrongType`.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentlog.eventlog.errors import AgentlogError
from agentlog.eventlog.store import EventStore

if TYPE_CHECKING:
    # Not imported at run time: importing `runtime` binds its module-level loggers to whatever
    # structlog config exists then, and the CLI must configure logging first.
    pass

__all__ = [
    "AppAttributeMissing", "AppConfigInvalid", "AppImportFailed", "AppLoadError", "AppModuleNotFound", "AppWrongType",
    "InvalidAppSpec", "load_app", "resolve_app",
]


class AppLoadError(AgentlogError):
    """The `--app` target could not be loaded; the message says what to fix."""

    code = "app_load_error"


class InvalidAppSpec(AppLoadError, ValueError):
    code = "invalid_app_spec"


class AppModuleNotFound(AppLoadError, LookupError):
    code = "app_module_not_found"


class AppImportFailed(AppLoadError):
    code = "app_import_failed"


class AppAttributeMissing(AppLoadError, LookupError):
    code = "app_attribute_missing"


class AppWrongType(AppLoadError, TypeError):
    code = "app_wrong_type"


#: What `load_app` returns: an app now, or a factory to call with the store.
AppSource = Any


def _is_app(obj: Any) -> bool:
    """An `App`, a `Runtime`, or anything else with `agents` and `tools` (a module has neither)."""
    return not isinstance(obj, type) and hasattr(obj, "agents") and hasattr(obj, "tools")


def _as_app(obj: Any) -> Any | None:
    """`obj` as an app-like object, or None: agents alone (an `AgentRegistry`, a list or tuple
    of `AgentSpec`) become an `App` without tools."""
    if _is_app(obj):
        return obj
    from agentlog.runtime import AgentRegistry, AgentSpec, App

    if isinstance(obj, AgentRegistry):
        return App(agents=list(obj))
    if isinstance(obj, (list, tuple)) and obj and all(isinstance(a, AgentSpec) for a in obj):
        return App(agents=list(obj))
    return None


def _parse(spec: str) -> tuple[str, str]:
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr or not all(p.isidentifier() for p in module.split(".")) or not all(
        p.isidentifier() for p in attr.split(".")
    ):
        raise InvalidAppSpec(f"--app must look like module:attr (e.g. myproject.agents:app), not {spec!r}")
    return module, attr


class AppConfigInvalid(AppLoadError):
    code = "app_config_invalid"


def load_app(spec: str) -> AppSource:
    """Import `module` and get `attr` (dotted attrs allowed). Returns an app-like object or a
    factory; raises an `AppLoadError` subclass. Does not call a factory (that needs the store).
    A path ending in .yaml/.yml/.json is a declarative configuration (`agentlog.runtime.config`)."""
    if spec.lower().endswith((".yaml", ".yml", ".json")):
        from agentlog.runtime.config import ConfigError, load_config

        try:
            return load_config(spec)
        except ConfigError as exc:
            raise AppConfigInvalid(str(exc)) from None
    module_name, attr = _parse(spec)
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise AppModuleNotFound(f"no module named {module_name!r} (from --app {spec}; run from the "
                                    f"project root or install the package)") from None
        raise AppImportFailed(f"importing {module_name!r} failed: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the user's module raised while importing
        raise AppImportFailed(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AppAttributeMissing(f"module {module_name!r} has no attribute {attr!r}") from None
        except Exception as exc:  # noqa: BLE001 - a module __getattr__ that raised
            raise AppImportFailed(f"getting {attr!r} from {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    if _as_app(obj) is None and not callable(obj):
        raise AppWrongType(_wrong_type(spec, obj))
    return obj


def _wrong_type(spec: str, obj: Any) -> str:
    return (f"{spec} is a {type(obj).__name__}; expected an agentlog App, a Runtime, agents (an "
            f"AgentRegistry or a list of AgentSpec), or a callable factory(store) returning one")


def resolve_app(source: AppSource, store: EventStore, spec: str = "--app") -> Any:
    """The app-like object (`agents`, `tools`[, `models`]): `source` itself, or what its factory
    returns for `store`. Raises `AppWrongType` / `AppImportFailed`."""
    app = _as_app(source)
    if app is not None:
        return app
    factory: Callable[[EventStore], Any] = source
    try:
        obj = factory(store)
    except Exception as exc:  # noqa: BLE001 - the user's factory raised
        raise AppImportFailed(f"calling {spec}(store) failed: {type(exc).__name__}: {exc}") from None
    app = _as_app(obj)
    if app is None:
        raise AppWrongType(f"{spec}(store) returned a {type(obj).__name__}; expected an agentlog App, a Runtime "
                           f"or agents")
    return app
