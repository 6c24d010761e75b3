"""Recorded runs as a test: verify every run of a folder of recordings (`agentlog export` files)
against the app as it is now, and fail with the first differing event of each run that diverged.

    from agentlog.testing import assert_recorded_runs_verify

    def test_recorded_runs_still_verify():
        assert_recorded_runs_verify("tests/recorded", "myproject.agents:app")

A prompt, tool description, tool list, model or loop change that would make a recorded run write
anything else (or ask its model anything else) fails the test. Tools are answered from their
recorded results unless `tools_from_log` says otherwise, as with `agentlog replay --verify`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentlog.eventlog.memory import MemoryEventStore
from agentlog.eventlog.recording import read_recording
from agentlog.gateway.operations.app_loader import load_app, resolve_app
from agentlog.runtime.replay.recorded import VerifyAllReport, verify_all

__all__ = ["RecordedRunsReport", "assert_recorded_runs_verify", "verify_recorded_runs", "verify_recorded_runs_async"]


@dataclass(frozen=True)
class RecordedRunsReport:
    """One `VerifyAllReport` per recording file, in file name order."""

    files: dict[Path, VerifyAllReport]

    @property
    def counts(self) -> dict[str, int]:
        total = dict.fromkeys(("verified", "diverged", "skipped"), 0)
        for report in self.files.values():
            for key, n in report.counts.items():
                total[key] += n
        return total

    @property
    def runs(self) -> int:
        return sum(len(r.runs) for r in self.files.values())

    @property
    def ok(self) -> bool:
        """No run diverged."""
        return all(r.ok for r in self.files.values())

    def failures(self, *, allow_skipped: bool = False) -> str:
        """What failed, per file: each diverged run with its first differing event (and each
        skipped run with its reason, unless `allow_skipped`). Empty when nothing did."""
        parts = []
        for path, report in self.files.items():
            bad = report.of("diverged") + ([] if allow_skipped else report.of("skipped"))
            if bad:
                parts.append(f"{path}: {report.summary()}\n" + "\n".join(v.explain() for v in bad))
        return "\n".join(parts)


def _recordings(path: str | Path, pattern: str) -> list[Path]:
    root = Path(path)
    if root.is_dir():
        return sorted(root.rglob(pattern))
    if not root.exists():
        raise FileNotFoundError(f"no recording at {root}")
    return [root]


async def verify_recorded_runs_async(path: str | Path, app: Any, *, tools_from_log: bool | Iterable[str] = True,
                                     pattern: str = "*.jsonl", timeout_s: float = 60.0) -> RecordedRunsReport:
    """Verify every run of the recording `path`, or of every `pattern` file under the folder
    `path`, with `app` (an `App`, a `Runtime`, anything with `agents` and `tools`, or a
    `module:attr` spec as `--app` takes). A file that does not read raises its `RecordingError`."""
    if isinstance(app, str):
        app = resolve_app(load_app(app), MemoryEventStore(), app)
    names = tools_from_log if isinstance(tools_from_log, bool) else list(tools_from_log)
    reports: dict[Path, VerifyAllReport] = {}
    for file in _recordings(path, pattern):
        recording = read_recording(file.read_bytes())
        reports[file] = await verify_all(recording, app, tools_from_log=names, timeout_s=timeout_s,
                                         source_name=str(file))
    return RecordedRunsReport(reports)


def verify_recorded_runs(path: str | Path, app: Any, *, tools_from_log: bool | Iterable[str] = True,
                         pattern: str = "*.jsonl", timeout_s: float = 60.0) -> RecordedRunsReport:
    """`verify_recorded_runs_async` for synchronous code (it runs its own event loop)."""
    return asyncio.run(verify_recorded_runs_async(path, app, tools_from_log=tools_from_log, pattern=pattern,
                                                  timeout_s=timeout_s))


def assert_recorded_runs_verify(path: str | Path, app: Any, *, allow_skipped: bool = False,
                                tools_from_log: bool | Iterable[str] = True, pattern: str = "*.jsonl",
                                timeout_s: float = 60.0) -> RecordedRunsReport:
    """`verify_recorded_runs`, raising `AssertionError` if a run diverged (the message names the
    first differing event of each), if one was skipped (its agent is gone from the app, say;
    unless `allow_skipped`), or if `path` holds no recorded run at all (a wrong path must not
    pass)."""
    report = verify_recorded_runs(path, app, tools_from_log=tools_from_log, pattern=pattern, timeout_s=timeout_s)
    if report.runs == 0:
        raise AssertionError(f"no recorded run in {path} (files matching {pattern!r})")
    failures = report.failures(allow_skipped=allow_skipped)
    if failures:
        c = report.counts
        raise AssertionError(f"{c['diverged']} of {report.runs} recorded run(s) diverged, {c['skipped']} skipped:\n"
                             f"{failures}")
    return report
