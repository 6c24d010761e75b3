"""The app the deployment runs (`--app agents:app`, from this folder): replace it with yours.

`announcer` drafts a release announcement and sends it once a human approves the `send_email`
call. Its model is scripted, so the deployment runs with no API key; for a real one, name a
`provider:model` id (`openai:gpt-4o-mini`, with OPENAI_API_KEY or OPENAI_BASE_URL in the
workers' environment) instead.
"""

from __future__ import annotations

from agentlog import AgentSpec, App, PermissionPlugin, ScriptedModel, ToolContext, Turn, tool


@tool
def send_email(to: str, subject: str, ctx: ToolContext) -> str:
    """Send an email (a human approves every one)."""
    ctx.set("/sent", {"to": to, "subject": subject})
    return f"sent {subject!r} to {to}"


# position="conversation": each run's turn comes from its own conversation, so one model serves
# every run, on whichever worker takes it
model = ScriptedModel([
    Turn.tool("send_email", {"to": "team@example.com", "subject": "Release 1.4.2 is out"},
              text="Drafted the announcement; sending it."),
    "The announcement is sent.",
], position="conversation")

app = App(
    agents=[AgentSpec(id="announcer", description="Announces releases by email (a human approves).",
                      model=model, tools=["send_email"], plugins=[PermissionPlugin(ask=["send_email"])],
                      max_rounds=4)],
    tools=[send_email],
)
