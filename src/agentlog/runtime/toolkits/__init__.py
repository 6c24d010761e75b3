"""Tools that reach beyond the process: MCP servers, remote A2A agents, sub-agents."""
