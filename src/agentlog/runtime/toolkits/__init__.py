"""Toolkits: tools (and the plugins that offer them) built from something outside the agent's own
code: MCP servers, remote A2A agents, sub-agents, skill folders (SKILL.md)."""
