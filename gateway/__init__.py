"""agentlog gateway."""
