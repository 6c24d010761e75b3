"""agentlog projections."""
