"""Every NATS subject and stream name agentlog uses, in one place."""

from __future__ import annotations

import hashlib

from agentlog.eventlog.ids import THREAD_LEVEL_RUN

PREFIX = "agentlog"
EVENTS_STREAM = "AGENTLOG_EVENTS"
EVENTS_SUBJECTS = f"{PREFIX}.ev.>"
ALL_EVENTS = EVENTS_SUBJECTS


#: Profiles (long-term state shared by the threads of one resource_id) have a stream of their
#: own, one subject per profile: its optimistic concurrency scope.
PROFILES_STREAM = "AGENTLOG_PROFILES"
PROFILE_SUBJECTS = f"{PREFIX}.pf.>"


def profile_subject(profile_id: str) -> str:
    """`agentlog.pf.<sha256 of the profile id>`: a profile id is any resource_id (up to 256
    characters of anything), so its subject token is its digest, never the id itself."""
    return f"{PREFIX}.pf.{hashlib.sha256(profile_id.encode()).hexdigest()}"


def event_subject(thread_id: str, run_id: str | None) -> str:
    return f"{PREFIX}.ev.{thread_id}.{run_id or THREAD_LEVEL_RUN}"


def thread_filter(thread_id: str) -> str:
    """All commits of one thread, across its runs: the OCC scope of the thread."""
    return f"{PREFIX}.ev.{thread_id}.>"


def run_filter(run_id: str) -> str:
    """All commits of one run; run ids are unique, so the thread token can be a wildcard."""
    return f"{PREFIX}.ev.*.{run_id}"


def live_subject(thread_id: str, run_id: str) -> str:
    """Core NATS (not persisted): token deltas and tool progress."""
    return f"{PREFIX}.live.{thread_id}.{run_id}"


def view_changes_subject(view_prefix: str = PREFIX) -> str:
    """Core NATS (not persisted): what each projection batch of the view set `view_prefix` (its KV
    buckets' prefix) changed, published by the writer for every other gateway
    (`agentlog.projections.notices`)."""
    return f"{PREFIX}.views.{view_prefix}"


#: The app name of a process not given one. Its commands keep the subjects agentlog used before
#: apps had names (`agentlog.cmd.<thread>`), so existing queues, workers and gateways go on.
DEFAULT_APP = "default"


def command_subject(thread_id: str, app: str | None = None) -> str:
    """Where commands for `thread_id` are queued for the workers of `app`: `agentlog.cmd.<app>.<thread>`,
    or `agentlog.cmd.<thread>` for the default app. A worker takes only its app's (`commands_filter`)."""
    if app is None or app == DEFAULT_APP:
        return f"{PREFIX}.cmd.{thread_id}"
    return f"{PREFIX}.cmd.{app}.{thread_id}"


def commands_filter(app: str | None = None) -> str:
    """Every command subject of `app` (and of no other app: the default app's subjects have one
    token less, so the two wildcards never overlap, as a work queue's consumers must not)."""
    if app is None or app == DEFAULT_APP:
        return f"{PREFIX}.cmd.*"
    return f"{PREFIX}.cmd.{app}.*"


def parse_event_subject(subject: str) -> tuple[str, str | None]:
    """`agentlog.ev.<thread>.<run>` -> (thread_id, run_id or None for thread-level)."""
    parts = subject.split(".")
    if len(parts) != 4 or parts[0] != PREFIX or parts[1] != "ev":
        raise ValueError(f"not an agentlog event subject: {subject!r}")
    run = parts[3]
    return parts[2], (None if run == THREAD_LEVEL_RUN else run)
