"""ACP (Agent Client Protocol): an agentlog agent for editors that drive agents on stdio
(`agent`, served by `agentlog acp`)."""
