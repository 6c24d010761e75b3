"""What defines an agent: `AgentSpec` and the registries the runtime resolves names from (`spec`),
and the handoffs by which one agent passes the thread to another (`handoff`).

Below the loop, which drives a spec and switches to a handoff's target (`loop.active_agent`): a
spec is configuration the loop runs on, so nothing here imports the loop, the facade or the
toolkits.
"""
