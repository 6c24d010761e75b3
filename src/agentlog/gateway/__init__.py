"""Every way into agentlog from outside a process: the operations every transport shares,
the HTTP API, the NATS micro service and the protocol adapters (AG-UI, AI SDK, A2A, MCP, ACP)."""
