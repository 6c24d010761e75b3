"""agentlog runtime."""
