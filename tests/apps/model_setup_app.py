"""An app whose agents name provider models by id (`--app tests.apps.model_setup_app:app`), for
tests/runtime/test_model_setup.py: `writer` on `openai:` (Chat Completions, key OPENAI_API_KEY unless
OPENAI_BASE_URL names another server), `reviewer` on `anthropic:` (the SDK, ANTHROPIC_API_KEY),
and `local` on a scripted model, which needs nothing."""

from __future__ import annotations

from agentlog import AgentSpec, App, ScriptedModel

app = App(agents=[
    AgentSpec(id="writer", model="openai:gpt-4o-mini"),
    AgentSpec(id="reviewer", model="anthropic:claude-test", fallback_models=["openai:gpt-4o-mini"]),
    AgentSpec(id="local", model=ScriptedModel(["hi"], position="conversation")),
])
