"""Run-context snapshots: the pure format, and the stores that keep them."""
