"""Helpers for tests of agentlog apps (and agentlog's own tests and benchmarks); never imported by
product code (an import-linter contract keeps it that way).

    from agentlog.testing import RecordingModel, assert_recorded_runs_verify, generate_history, history_of_size, stored

- `RecordingModel(model)`: wraps a model and keeps the request of every completed inference,
  for `agentlog.runtime.replay.verify.verify_run(..., requests=recorder.requests)` on logs without
  request digests and for tests that want the full request in a divergence.
- `generate_history(rng, ...)` / `history_of_size(rng, events)`: plausible synthetic thread
  histories (valid protocol, interleaved threads) for property tests and benchmarks of views;
  `stored(commits)` numbers them like the log does (`agentlog.testing.synth`).
- `assert_recorded_runs_verify(path_or_dir, app)` / `verify_recorded_runs(...)`: every run of a
  folder of recordings (`agentlog export` files) verified against the app as it is now; fails
  naming the first differing event of each run that diverged (`agentlog.testing.recorded`).

For scripted models (no LLM) see `agentlog.ScriptedModel` / `agentlog.Turn`; for a real
nats-server in tests, `agentlog.EmbeddedNatsServer`.
"""

from __future__ import annotations

from agentlog.testing.recorded import (
    RecordedRunsReport,
    assert_recorded_runs_verify,
    verify_recorded_runs,
    verify_recorded_runs_async,
)
from agentlog.testing.recording import RecordingModel
from agentlog.testing.synth import generate_history, history_of_size, stored

__all__ = ["RecordedRunsReport", "RecordingModel", "assert_recorded_runs_verify", "generate_history", "history_of_size",
           "stored", "verify_recorded_runs", "verify_recorded_runs_async"]
