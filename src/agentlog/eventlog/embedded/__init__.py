"""The embedded default: a real nats-server per data dir, started and revived by agentlog."""
