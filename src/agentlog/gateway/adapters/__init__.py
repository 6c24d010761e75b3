"""Protocol adapters (AG-UI, AI SDK v6 UI message stream): pure translators between agentlog's
canonical run events and each protocol's wire shapes, plus request parsers and stream verifiers.
No I/O here: the HTTP and NATS routes feed events in and write what comes out."""
