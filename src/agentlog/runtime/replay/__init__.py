"""Verified replay: re-execute a recorded run against its own log and say how it differs."""
