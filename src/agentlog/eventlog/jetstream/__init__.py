"""The JetStream event store: one stream, one message per commit, and its parts (wire
format, requests, live tail, archive, large payloads, limits, retention)."""
