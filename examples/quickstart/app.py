from agentlog import AgentSpec, App, PermissionPlugin, ScriptedModel, Turn, tool


@tool
def deploy(env: str) -> str:
    "Deploy the current release to an environment."
    return f"deployed to {env}"


# A scripted model needs no API key. For a real one, name it instead: model="openai:gpt-4o-mini".
model = ScriptedModel([Turn.tool("deploy", {"env": "staging"}), Turn.text("Deployed to staging.")],
                      position="conversation", loop=True)

app = App(
    agents=[AgentSpec(id="ops", model="scripted", tools=["deploy"],
                      plugins=[PermissionPlugin(ask=["deploy"])])],   # a human approves every deploy
    tools=[deploy],
    models={"scripted": model},
)
