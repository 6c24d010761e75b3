"""The apps of `test_replay`'s recorded runtime scenarios, for `agentlog replay --verify --app
tests.apps.replay_scenarios_app:<name>` (tests/cli/test_cli_replay_all.py).

The runtime-loop scenarios (test_runtime_scenarios, test_runtime_stop) build their agents, tools
and models inside the test function, so the only way to get "the app that made the run" is the one
`test_replay` uses: run the scenario as written (its own asserts included) with `Runtime.start`
wrapped, and keep the Runtime that started each run. `record(name, store, nats_server)` does that
and registers the writers here; the module-level `__getattr__` then answers:

- `<name>`: the Runtime that wrote the scenario's first run;
- `<name>__run<k>`: the Runtime that wrote its k-th run (0-based, in start order);
- `tampered__<name>` / `tampered__<name>__run<k>`: the same agents with every tool changed to
  return another value (same name, schema and description: the model request is unchanged).

`<name>` is the `test_replay` case id with `[mode]` written `__mode`, e.g.
`test_cancel_while_a_tool_runs__sequential`. Replay never uses a Runtime's own store, and answers
the model from the log, so the writer Runtime is exactly what `verify_run` is given in-process.
Names are importable only after `record()` ran in this process (the CLI is invoked in-process).
"""

from __future__ import annotations

import inspect
from typing import Any

from agentlog.runtime import Runtime
from agentlog.runtime.tools import Tool

from tests.runtime.test_replay import _scenario_cases


def attr_name(case_id: str) -> str:
    """`test_x[mode]` -> `test_x__mode` (an identifier: `--app` wants `module:attr`)."""
    return case_id.replace("[", "__").replace("]", "")


#: name -> (scenario coroutine function, its kwargs), exactly `test_replay`'s cases.
CASES: dict[str, tuple[Any, dict[str, Any]]] = {attr_name(p.id): tuple(p.values) for p in _scenario_cases()}  # type: ignore[misc]

#: attr -> the Runtime that started that run (filled by `record`).
WRITERS: dict[str, Runtime] = {}


async def record(name: str, store: Any, nats_server: Any) -> list[tuple[str, str]]:
    """Run scenario `name` on `store` as `test_replay` does; returns [(run_id, attr)] per run."""
    scenario, kwargs = CASES[name]
    started: list[tuple[str, Runtime]] = []
    original_start = Runtime.start

    async def recording_start(self: Runtime, *args: Any, **kw: Any) -> Any:
        handle = await original_start(self, *args, **kw)
        started.append((handle.run_id, self))
        return handle

    Runtime.start = recording_start  # type: ignore[method-assign]
    try:
        wanted = inspect.signature(scenario).parameters
        fixtures = {"store": store, "nats_server": nats_server}
        await scenario(**{k: v for k, v in fixtures.items() if k in wanted}, **kwargs)
    finally:
        Runtime.start = original_start  # type: ignore[method-assign]
    out = []
    for k, (run_id, rt) in enumerate(started):
        attr = name if k == 0 else f"{name}__run{k}"
        WRITERS[attr] = WRITERS[f"{name}__run{k}"] = rt
        out.append((run_id, attr))
    return out


def _changed(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return {"tampered": value}
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + " (tampered)"
    return {"tampered": value}


def tamper(t: Tool) -> Tool:
    """`t` with the same name, description and arguments, returning another value."""
    fn = t.function
    if t.is_async:
        async def changed(*args: Any, **kwargs: Any) -> Any:
            return _changed(await fn(*args, **kwargs))
    else:
        def changed(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
            return _changed(fn(*args, **kwargs))
    return Tool(t.name, t.description, t.args_model, changed, t.context_param)


def __getattr__(name: str) -> Runtime:
    if name.startswith("__"):
        raise AttributeError(name)
    base = name.removeprefix("tampered__")
    rt = WRITERS.get(base)
    if rt is None:
        raise AttributeError(f"{name}: no recorded scenario {base!r} in this process (call record() first)")
    if base == name:
        return rt
    return Runtime(None, agents=list(rt.agents._agents.values()), tools=[tamper(t) for t in rt.tools])  # type: ignore[arg-type]  # noqa: SLF001
