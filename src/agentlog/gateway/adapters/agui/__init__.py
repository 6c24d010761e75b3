"""AG-UI: the translator between the log's run events and AG-UI events, and the parser of
`RunAgentInput` (`translator`, pure); the session that serves one request (`session`)."""
