"""`tests.apps.protocol_app:app` changed in one way, for the recorded-runs tests
(tests/e2e/test_recorded_deployed.py): `--app tests.apps.recorded_app:prompt_changed` is the same
app whose agents were given a system prompt, which every recorded run of the protocol app must
diverge from at its first inference."""

from __future__ import annotations

from agentlog.runtime import App

from tests.apps import protocol_app

prompt_changed = App(
    agents=[a.model_copy(update={"system_prompt": "Answer in French."}) for a in protocol_app.app.agents],
    tools=list(protocol_app.app.tools), models=dict(protocol_app.app.models),
)
