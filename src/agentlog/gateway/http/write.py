"""Run write routes (DESIGN 5.1): start, inputs (decisions / continuation messages), cancel.

    app = create_app(store, views, runner, dispatcher=dispatcher, extra_routes=write_routes(dispatcher))

The handlers only parse (pydantic models -> 400 with field detail), check tenancy and call
`agentlog.gateway.operations.operations`, which calls the `Dispatcher`: the same path the NATS service and the
protocol adapters take, so in-process and queued execution answer alike. Answers are 202 with
`{thread_id, run_id, seq}`; `seq` is the commit that made the request visible, for `min_seq`. A
retry of a request already taken is 200 with `duplicate: true` (a start is one when its
`run_id` already started); a start a worker took but has not started yet adds `status:
"queued"`. A start no worker took in time is 503 `dispatch_timeout`: withdrawn, it will not run.
`POST /v1/runs` with `Accept: text/event-stream` streams the new run's events instead, from the
log, until it finishes or suspends.
"""

from __future__ import annotations

from aiohttp import web

from agentlog.gateway.http import sse
from agentlog.gateway.http.replies import reply
from agentlog.gateway.http.requests import principal, services
from agentlog.gateway.http.routing import Route, parse_body, path_id
from agentlog.gateway.http.runs import follow_run, pauses, run_from_log
from agentlog.gateway.operations import branches
from agentlog.gateway.operations import operations as ops
from agentlog.gateway.operations.dispatch import Dispatcher
from agentlog.gateway.operations.models import CancelRunBody, CounterfactualBody, RunInputsBody, StartRunBody

_ACCEPTED = {
    "type": "object",
    "properties": {"thread_id": {"type": "string"}, "run_id": {"type": "string"}, "seq": {"type": "integer"},
                   "duplicate": {"type": "boolean"}, "status": {"type": "string", "enum": ["queued"]}},
    "required": ["thread_id", "run_id", "seq"],
}


def wants_sse(request: web.Request) -> bool:
    return "text/event-stream" in request.headers.get("Accept", "")


def write_routes(dispatcher: Dispatcher) -> list[Route]:
    """The write `Route`s bound to `dispatcher` (pass them as `create_app(extra_routes=...)`)."""

    async def start_run(request: web.Request) -> web.StreamResponse:
        svc, who = services(request), principal(request)
        body = await parse_body(request, StartRunBody)
        done = await ops.start_run(svc, who, dispatcher, body)
        if not wants_sse(request) or done.queued:  # a queued start has no events to stream yet
            return reply(ops.accepted(done), status=200 if done.duplicate else 202)
        commits, thread_id, running = await run_from_log(svc, who, done.run_id)
        live = await follow_run(request, svc, done.run_id, thread_id, commits) if running else None
        frames = sse.positioned_events(commits, live, None, keep=lambda c: c.commit.run_id == done.run_id,
                                       stop=pauses)
        return await sse.stream(request, frames, queue_size=svc.settings.sse_queue,
                                heartbeat=svc.settings.sse_heartbeat, stall=svc.settings.sse_stall)

    async def run_inputs(request: web.Request) -> web.Response:
        svc, who = services(request), principal(request)
        run_id = path_id(request, kind="run_id")
        body = await parse_body(request, RunInputsBody)
        done = await ops.run_inputs(svc, who, dispatcher, run_id, body)
        return reply(ops.accepted(done), status=200 if done.duplicate else 202)

    async def cancel_run(request: web.Request) -> web.Response:
        svc, who = services(request), principal(request)
        run_id = path_id(request, kind="run_id")
        body = await parse_body(request, CancelRunBody)
        return reply(ops.accepted(await ops.cancel_run(svc, who, dispatcher, run_id, body)), status=202)

    async def counterfactual(request: web.Request) -> web.Response:
        svc, who = services(request), principal(request)
        run_id = path_id(request, kind="run_id")
        body = await parse_body(request, CounterfactualBody)
        return reply(await branches.counterfactual(svc, who, dispatcher, run_id, body), status=201)

    return [
        Route("POST", "/v1/runs/{id}/counterfactual", counterfactual,
              "Branch the run at a decision into a new thread and take another decision there (the new run "
              "resumes on a worker; its thread's forked_from names the run and the call)", "runs",
              body=CounterfactualBody, status=201, errors=(404, 409, 503),
              response={"type": "object", "properties": {
                  "thread_id": {"type": "string"}, "run_id": {"type": "string"}, "seq": {"type": "integer"},
                  "forked_from": {"type": "object"}}, "required": ["thread_id", "run_id", "seq", "forked_from"]}),
        Route("POST", "/v1/runs", start_run,
              "Start a run (202 with ids and seq; 200 with duplicate: true for a run_id already started; SSE of "
              "its events with Accept: text/event-stream)", "runs",
              body=StartRunBody, response=_ACCEPTED, status=202, errors=(403, 404, 409, 413, 503)),
        Route("POST", "/v1/runs/{id}/inputs", run_inputs,
              "Decisions for suspended calls and/or messages (a continuation run); 200 for a duplicate",
              "runs", body=RunInputsBody, response=_ACCEPTED, status=202, errors=(404, 409, 413, 503)),
        Route("POST", "/v1/runs/{id}/cancel", cancel_run, "Cancel a running or waiting run", "runs",
              body=CancelRunBody, response=_ACCEPTED, status=202, errors=(404, 409, 503)),
    ]


__all__ = ["write_routes", "wants_sse"]
