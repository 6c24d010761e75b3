"""MCP: the app's agents as tools of an MCP server (`agent_tools`), served on the gateway over
streamable HTTP at `/v1/mcp` (`streamable_http`) and on stdio by `agentlog mcp`."""
