"""Protocol stream verifiers (AG-UI event rules, AI SDK v6 UI message stream rules) and the
client-side reducers the tests apply to the streams. Test code only: nothing in `src/agentlog/`
imports this package, so product code cannot lean on its own checker."""
