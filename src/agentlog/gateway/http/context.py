"""The services an aiohttp app was built with, on the app (`SERVICES`); what they are and the
reads every route needs are `agentlog.gateway.operations.services`.
"""

from __future__ import annotations

from aiohttp import web

from agentlog.gateway.operations.services import (
    Runner,
    Services,
    Settings,
    get_run_view,
    get_thread_view,
    thread_from_log,
    visible_run,
    visible_thread,
    wait_min_seq,
)

SERVICES = web.AppKey("agentlog.services", Services)


def services(request: web.Request) -> Services:
    return request.app[SERVICES]


__all__ = ["SERVICES", "Runner", "Services", "Settings", "get_run_view", "get_thread_view", "services", "thread_from_log",
           "visible_run", "visible_thread", "wait_min_seq"]
