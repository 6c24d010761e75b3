"""Protocol adapters, one folder per protocol: `agui/` (AG-UI), `aisdk/` (AI SDK v6 UI message
stream), `a2a/` (A2A), `mcp/` (the agents as MCP tools), `acp/` (Agent Client Protocol).

Each protocol's translator (`agui.translator`, `aisdk.translator`, `a2a.mapping`) is pure: it
maps the log's run events to the protocol's wire shapes and parses its requests. The sessions do
the I/O: they read the thread from the log, start or decide runs through the dispatcher (an AI
SDK regeneration appends a fork: `aisdk.regenerate`) and follow the run (`session`, `source`).
HTTP (`routes`) and NATS (`nats_routes`) only deliver what the sessions yield.
"""
