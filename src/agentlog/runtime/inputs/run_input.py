"""What a client sends with a run besides its messages, and what an agent lets it change.

    run_input = RunInput(overrides=RunOverrides(model="small", options={"temperature": 0.2}),
                         context=[ContextEntry(description="page", value="/billing")],
                         state={"draft": "..."}, forwarded_props={...})
    await runtime.start("support", "hi", run_input=run_input)

Everything here is recorded in the run-start commit (`RunStarted.overrides`, `.context`,
`.forwarded_props`, and the client's state as a `StatePatched` with source `client`), so a
resume on another worker and `replay --verify` rebuild the same model requests from the log
alone: the loop reads these values only from its folded context, never from the request.

Why a policy: a request must not be able to pick any model of the registry (cost), rewrite the
agent's instructions, or pass provider options the operator did not mean to expose. An agent
allows nothing by default; `OverridePolicy` names what it allows, and a request asking for
anything else is refused before anything is written (`OverrideNotAllowed`, HTTP 400
`override_not_allowed`).

Why the client's state is a merge of its top-level keys and not a replacement: AG-UI clients
send their whole state with every request, and one that keeps none sends `{}`; replacing the
thread's state with it would wipe what the agent and its tools wrote. A key the client sends
with a value other than the thread's is set (an RFC 6902 `add`); nothing is removed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any, NamedTuple

import msgspec
import pydantic

from agentlog.eventlog.errors import AgentlogError
from agentlog.eventlog.events import ContextEntry, ReplacedAnswer, RunOverrides


class OverridePolicy(pydantic.BaseModel):
    """What a request may change of an agent for one run (`AgentOptions.overrides`)."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    #: Model registry names a request may choose (the agent's own model is always allowed).
    models: list[str] = []
    #: May a request replace the system prompt?
    system_prompt: bool = False
    #: Provider option keys a request may set (merged over `model_options`), e.g. temperature.
    options: list[str] = []
    #: May a request narrow the agent's tools for its run (`allowed_tools` / `excluded_tools`)?
    tools: bool = False


class OverrideScope(NamedTuple):
    """What a run's overrides are checked against: its agent's model name, override policy and,
    when known, tool names (`check_overrides`; None: tool names are not checked)."""

    model_name: str
    policy: OverridePolicy
    tools: Sequence[str] | None = None


class OverrideNotAllowed(AgentlogError, ValueError):
    """A request asked for an override its agent does not allow (nothing was written)."""

    code = "override_not_allowed"

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class InvalidRunInput(AgentlogError, ValueError):
    """Run input that can never be committed (bad message shape, text that is not valid UTF-8,
    a run input of the wrong shape)."""

    code = "invalid_input"


class RunInput(msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """A run's client input besides messages. `state`: the client's state (an object), merged
    into the thread's state at run start (`client_state_ops`)."""

    overrides: RunOverrides | None = None
    context: list[ContextEntry] = []
    forwarded_props: Any = None
    state: dict[str, Any] | None = None
    #: Answers the run takes instead of its model's at given steps (`RunStarted.answers`): a
    #: counterfactual branch's, recorded so that verified replay starts the run with them again.
    answers: list[ReplacedAnswer] = []

    @property
    def empty(self) -> bool:
        return (self.overrides is None and not self.context and self.forwarded_props is None
                and not self.state and not self.answers)


def as_run_input(value: RunInput | Mapping[str, Any] | None) -> RunInput | None:
    """A `RunInput` from itself or its JSON form (a command's); raises `InvalidRunInput` naming
    what is wrong. Empty input is None (nothing to record)."""
    if value is None:
        return None
    if not isinstance(value, RunInput):
        try:
            value = msgspec.convert(dict(value), RunInput)
        except (msgspec.ValidationError, TypeError) as exc:
            raise InvalidRunInput(f"run input: {exc}") from None
    overrides = value.overrides
    if overrides is not None and overrides.model is None and overrides.system_prompt is None \
            and not overrides.options and overrides.allowed_tools is None and not overrides.excluded_tools:
        value = msgspec.structs.replace(value, overrides=None)
    return None if value.empty else value


def run_input_wire(value: RunInput | None) -> dict[str, Any] | None:
    """The JSON form of a run input (for commands), None when there is none."""
    return None if value is None else msgspec.to_builtins(value)


def check_overrides(overrides: RunOverrides | None, policy: OverridePolicy, agent_model: str,
                    agent_tools: Sequence[str] | None = None) -> None:
    """Raise `OverrideNotAllowed` for anything `overrides` asks that `policy` does not allow.
    `agent_tools`: the agent's tool names, when known: a tool name or glob of the run's tool
    policy that matches none of them is refused too (a typo would silently change nothing)."""
    if overrides is None:
        return
    for field in ("allowed_tools", "excluded_tools"):
        names = getattr(overrides, field)
        if names is None or (field == "excluded_tools" and not names):
            continue
        if not policy.tools:
            raise OverrideNotAllowed("this agent does not let a request narrow its tools", field)
        unknown = [n for n in names if agent_tools is not None and not any(fnmatchcase(t, n) for t in agent_tools)]
        if unknown:
            raise OverrideNotAllowed(f"{field}: {', '.join(map(repr, unknown))} match(es) none of the agent's tools "
                                     f"({', '.join(agent_tools or ()) or 'none'})", field)
    if overrides.model is not None and overrides.model != agent_model and overrides.model not in policy.models:
        allowed = ", ".join([agent_model, *policy.models])
        raise OverrideNotAllowed(f"model {overrides.model!r} is not allowed for this agent (allowed: {allowed})",
                                 "model")
    if overrides.system_prompt is not None and not policy.system_prompt:
        raise OverrideNotAllowed("this agent does not allow its system prompt to be overridden", "system_prompt")
    refused = sorted(k for k in overrides.options if k not in policy.options)
    if refused:
        allowed = ", ".join(policy.options) or "none"
        raise OverrideNotAllowed(f"option(s) {', '.join(refused)} may not be set by a request (allowed: {allowed})",
                                 "options")


def tool_allowed(overrides: RunOverrides | None, name: str) -> bool:
    """Does the run's tool policy (its recorded overrides) let tool `name` be offered and run?"""
    if overrides is None:
        return True
    if overrides.allowed_tools is not None and not any(fnmatchcase(name, p) for p in overrides.allowed_tools):
        return False
    return not any(fnmatchcase(name, p) for p in overrides.excluded_tools)


def _pointer(key: str) -> str:
    return "/" + key.replace("~", "~0").replace("/", "~1")


def _key(path: str) -> str:
    return path[1:].replace("~1", "/").replace("~0", "~")


#: `StatePatched.source` of the client's state merged at run start.
CLIENT_STATE_SOURCE = "client"


def client_state_ops(state: Mapping[str, Any], client: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The patch that merges the client's state into the thread's: an `add` per top-level key
    whose value differs (in the client's key order); empty when nothing changes."""
    return [{"op": "add", "path": _pointer(k), "value": v}
            for k, v in (client or {}).items() if k not in state or state[k] != v]


def client_state_of(ops: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A client state that `client_state_ops` turns into `ops` again over the same thread state
    (verified replay passes it back to the run's start)."""
    return {_key(str(op["path"])): op.get("value") for op in ops}


#: The heading of the client's context in the system prompt.
CONTEXT_HEADING = "Context from the client:"


def context_text(context: Sequence[ContextEntry]) -> str:
    """The client's context as the system prompt shows it (empty when there is none)."""
    if not context:
        return ""
    return "\n".join([CONTEXT_HEADING, *(f"- {c.description}: {c.value}" for c in context)])


__all__ = ["CLIENT_STATE_SOURCE", "CONTEXT_HEADING", "InvalidRunInput", "OverrideNotAllowed", "OverridePolicy", "OverrideScope", "RunInput", "as_run_input", "check_overrides",
           "client_state_of", "client_state_ops", "context_text", "run_input_wire", "tool_allowed"]
