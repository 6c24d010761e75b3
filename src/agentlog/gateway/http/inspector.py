"""The two API routes the run inspector page (`/ui`) needs beyond the read API.

* `GET /v1/runs/{id}/timeline?to=`: the `agentlog replay` report of the run (`agentlog.projections.timeline`:
  step groups, per-group state diffs, state and status as of `to`) plus the state diff of every
  event that changed state, so the page can time-travel event by event, and `spans`: the run's
  steps, inferences and tool calls with their start and end (what `agentlog trace --json` prints,
  `agentlog.runtime.telemetry`), as of `to`, which the page draws as a waterfall. Read-only,
  folded from the log (exact, no projection lag).
* `POST /v1/runs/{id}/verify`: `agentlog replay --verify` over HTTP (`agentlog.runtime.replay.verify.verify_run`)
  with the gateway's own app, every tool answered from the log. Answers the replay report: `ok`, or
  the first divergence. A gateway without an app in its process (role `gateway`, queue dispatch
  only) answers 409 `verify_unavailable`.

Why tools are always answered from the log here: a re-executed tool is a real side effect (a
deploy, a payment, an email) run without the approval the recorded run needed, by anyone whose
token can read the run. `{"tools_from_log": false}` is refused (400 `reexecution_refused`) rather
than ignored, so a caller who wanted re-execution learns it did not happen. Re-running tools is an
operator's choice made in their own process: `agentlog replay RUN --verify --reexecute-tools NAME`.

Both are tenant-checked like every run read (`runs._run_from_log`: other tenants' runs are 404).
"""

from __future__ import annotations

from typing import Any

import structlog
from aiohttp import web
from pydantic import Field

from agentlog.eventlog.events import Position
from agentlog.gateway.http.errors import ApiError
from agentlog.gateway.http.replies import reply
from agentlog.gateway.http.requests import principal, services
from agentlog.gateway.http.routing import Route, parse_body, parse_query, path_id
from agentlog.gateway.http.runs import run_from_log
from agentlog.gateway.operations.models import EventId, Model, Query
from agentlog.projections.timeline import build_replay, event_state_diffs
from agentlog.runtime import records_json, spans_from_commits

log = structlog.get_logger("agentlog.gateway.http.inspector")

#: Upper bound of one verified replay: the loop is re-driven from the log, so this only trips on
#: an app that hangs (a replayed tool that never returns, or one waiting on a missing recording).
VERIFY_TIMEOUT_S = 30.0


class TimelineQuery(Query):
    to: EventId | None = Field(default=None, description="time travel: the run as of this event id")


class VerifyBody(Model):
    tools_from_log: bool = Field(
        default=True,
        description="tools are always answered from their recorded results over HTTP; false is refused "
                    "(400 reexecution_refused): re-execution is `agentlog replay --verify --reexecute-tools`")


#: The machine code of a verify request that asks for tools to run for real.
REEXECUTION_REFUSED = "reexecution_refused"


async def run_timeline(request: web.Request) -> web.Response:
    svc, who = services(request), principal(request)
    run_id = path_id(request, kind="run_id")
    q = parse_query(request, TimelineQuery)
    _commits, thread_id, _running = await run_from_log(svc, who, run_id)
    thread_commits = [c async for c in svc.store.read_thread(thread_id)]
    report = build_replay(run_id, thread_commits, Position.parse(q.to) if q.to else None)
    out = report.to_json()
    diffs = event_state_diffs(report, thread_commits)
    for group in out["steps"]:
        for event in group["events"]:
            event["state_diff"] = diffs.get(event["id"], [])
    upto = report.to.seq if report.to is not None else None
    out["spans"] = records_json(spans_from_commits(
        run_id, (c for c in thread_commits if upto is None or c.seq <= upto)))
    return reply(out)


#: The app verified replay runs with: a process that runs the app (`serve`) sets its `Runtime`
#: here.
REPLAY_APP = web.AppKey("agentlog.replay_app", object)


def replay_app(app: web.Application) -> Any:
    """What this gateway can replay with (anything with `agents` and `tools`): `REPLAY_APP`. None
    when the runs execute elsewhere (`agentlog gateway`: no app in this process)."""
    candidate = app.get(REPLAY_APP)
    if candidate is not None and hasattr(candidate, "agents") and hasattr(candidate, "tools"):
        return candidate
    return None


async def verify(request: web.Request) -> web.Response:
    from agentlog.runtime import UnknownAgent
    from agentlog.runtime.replay.verify import verify_run

    svc, who = services(request), principal(request)
    run_id = path_id(request, kind="run_id")
    body = await parse_body(request, VerifyBody)
    if not body.tools_from_log:
        raise ApiError(400, REEXECUTION_REFUSED,
                       "verified replay over HTTP never runs a tool (a side effect without its approval); "
                       "re-execute tools from your own process: agentlog replay RUN --verify --reexecute-tools NAME")
    _commits, thread_id, _running = await run_from_log(svc, who, run_id)
    app = replay_app(request.app)
    if app is None:
        raise ApiError(409, "verify_unavailable",
                       "this gateway runs no app in its process; "
                       "verify with `agentlog replay RUN --verify --app ...`")
    bound = log.bind(thread_id=thread_id, run_id=run_id)
    try:
        # not `agentlog.cli.logging.quiet()` (the CLI's): that is process-wide, and would mute every
        # other request of this server while the replay runs
        report = await verify_run(svc.store, run_id, app, tools_from_log=True,
                                  raise_on_divergence=False, timeout_s=VERIFY_TIMEOUT_S)
    except UnknownAgent as exc:
        raise ApiError(409, "app_mismatch",
                       f"this gateway's app cannot replay run {run_id!r}: {exc}") from None
    bound.info("run.verified", ok=report.ok, commits=report.commits_verified)
    return reply(report.to_json())


_TIMELINE = {"type": "object", "properties": {
    "run_id": {"type": "string"}, "thread_id": {"type": "string"}, "lineage": {"type": "object"},
    "to": {"type": ["string", "null"]}, "status": {"type": "string"},
    "termination": {"type": ["object", "null"]}, "usage": {"type": ["object", "null"]},
    "steps": {"type": "array", "items": {"type": "object", "properties": {
        "label": {"type": "string"}, "step": {"type": ["integer", "null"]},
        "first_event": {"type": "string"}, "last_event": {"type": "string"},
        "state_diff": {"type": "array", "items": {"type": "object"}},
        "events": {"type": "array", "items": {"type": "object", "properties": {
            "id": {"type": "string"}, "type": {"type": "string"}, "summary": {"type": "string"},
            "event": {"type": "object"}, "state_diff": {"type": "array", "items": {"type": "object"}}}}}}}},
    "state": {"type": "object"}, "warning": {"$ref": "#/components/schemas/PositionWarning"},
    "spans": {"type": "array", "description": "steps, inferences and tool calls (agentlog trace --json); "
                                              "end_ms null: still open",
              "items": {"type": "object", "properties": {
                  "key": {"type": "string"}, "parent": {"type": ["string", "null"]}, "name": {"type": "string"},
                  "start_ms": {"type": "integer"}, "end_ms": {"type": ["integer", "null"]},
                  "status": {"type": "string", "enum": ["ok", "error"]}, "error": {"type": ["string", "null"]},
                  "attributes": {"type": "object"}}}}}}
_VERIFIED = {"type": "object", "required": ["run_id", "ok", "status"], "properties": {
    "run_id": {"type": "string"}, "ok": {"type": "boolean"}, "status": {"type": "string"},
    "commits_verified": {"type": "integer"}, "commits_recorded": {"type": "integer"},
    "events_verified": {"type": "integer"}, "divergence": {"type": "object"}}}

ROUTES: list[Route] = [
    Route("GET", "/v1/runs/{id}/timeline", run_timeline,
          "A run's timeline from the log: steps, events, state diffs per step and per event (time travel), spans",
          "runs", query=TimelineQuery, response=_TIMELINE, errors=(404,)),
    Route("POST", "/v1/runs/{id}/verify", verify,
          "Verified replay of a run (replay --verify), tools answered from the log: ok or the first divergence",
          "runs", body=VerifyBody, response=_VERIFIED, errors=(400, 404, 409)),
]

__all__ = ["REEXECUTION_REFUSED", "REPLAY_APP", "ROUTES", "TimelineQuery", "VerifyBody", "replay_app"]
