"""AI SDK v6 (`useChat`): the translator between the log's run events and UI message stream
parts, and the parser of its request body (`translator`, pure); a regeneration as a fork
(`regenerate`); the session that serves one request (`session`)."""
