"""Are an app's models ready to answer? Checked by the processes that run them (`agentlog serve`,
`agentlog worker`) when they start, so a missing key or provider SDK is one line at start, not a
failed run later.

Every model an agent may use (its model, fallbacks, pool, the models a request may choose) is
resolved through the runtime's registry, which builds `provider:model` ids as it would for a run,
and asked what it lacks (`setup_problems()`, a method of the provider models; a model without it,
such as a `ScriptedModel` or the user's own, lacks nothing). A name nobody registered is left to
the run that asks for it (its error says which names exist).
"""

from __future__ import annotations

from collections.abc import Iterable

from agentlog.eventlog.errors import AgentlogError
from agentlog.runtime.agents.spec import AgentSpec, ModelRegistry

__all__ = ["ModelSetupError", "check_models", "model_setup_problems"]


class ModelSetupError(AgentlogError):
    """Models of the app cannot answer as set up (a key unset, an SDK not installed): the message
    lists each, with its agent and model, and how to fix it."""

    code = "model_setup"
    usage_error = True


def _uses(agent: AgentSpec) -> list[object]:
    """The models `agent` may run on, each once, in the order a run would try them."""
    refs = [agent.model, *agent.fallback_models, *(agent.pool.models if agent.pool else ()), *agent.overrides.models]
    unique: list[object] = []
    for ref in refs:
        if not any(ref is seen or (isinstance(ref, str) and ref == seen) for seen in unique):
            unique.append(ref)
    return unique


def model_setup_problems(agents: Iterable[AgentSpec], models: ModelRegistry) -> list[str]:
    """One line per problem: `agent 'a', model 'openai:gpt-4o-mini': OPENAI_API_KEY is not set`."""
    found: list[str] = []
    for agent in agents:
        for ref in _uses(agent):
            try:
                model = models.resolve(ref)  # type: ignore[arg-type]
            except (LookupError, ValueError):
                continue
            check = getattr(model, "setup_problems", None)
            name = ref if isinstance(ref, str) else getattr(model, "name", type(model).__name__)
            for problem in check() if callable(check) else ():
                found.append(f"agent {agent.id!r}, model {name!r}: {problem}")
    return list(dict.fromkeys(found))


def check_models(agents: Iterable[AgentSpec], models: ModelRegistry) -> None:
    """Raise `ModelSetupError` listing every problem of `model_setup_problems`, if any."""
    problems = model_setup_problems(agents, models)
    if problems:
        raise ModelSetupError("the app's models cannot answer as set up: " + "; ".join(problems))
