"""The NATS micro service `agentlog` (DESIGN 5.2): the HTTP API over request/reply.

    service = await start_nats_service(store, views, runner, dispatcher)   # on the runtime's connection
    ...; await service.stop()
    # nats req agentlog.api.runs.start '{"agent_id": "calc", "messages": "hi"}'

Endpoints `agentlog.api.<group>.<op>` (runs.start|inputs|counterfactual|cancel|get|list, threads.create|fork|diff|revoke|get|list|
messages, agents.list, profiles.get) take the HTTP JSON bodies, with the path id as a field (`run_id` / `thread_id`) and
query parameters as fields too. They call the very functions the HTTP handlers call
(`agentlog.gateway.operations.operations`), and errors are the HTTP answers: micro error headers
`Nats-Service-Error: <message>`, `Nats-Service-Error-Code: <HTTP status>`, and the JSON body
`{"error", "code"[, "detail"]}`. Success answers are the HTTP success bodies.

Auth: NATS's own account permissions decide who may publish on `agentlog.api.>`; when tokens are
configured (same spec as HTTP), a request must also carry an `Authorization: Bearer <token>`
header, and tenant scoping applies as over HTTP. Discoverable with `$SRV.PING|INFO|STATS.agentlog`.
The endpoints share one queue group, so any number of gateways serve one API.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.micro import add_service
from nats.micro.request import Request
from nats.micro.service import Service
from pydantic import BaseModel

from agentlog.eventlog.jetstream.store import JetStreamEventStore, flush_subscriptions
from agentlog.gateway.operations import branches
from agentlog.gateway.operations import operations as ops
from agentlog.gateway.operations import profiles as profiles_api
from agentlog.gateway.operations import threads as threads_api
from agentlog.gateway.operations.auth import Authenticator, Principal, resolve_tokens
from agentlog.gateway.operations.dispatch import Dispatcher
from agentlog.gateway.operations.errors import ApiError, answer
from agentlog.gateway.operations.json_input import parse_json
from agentlog.gateway.operations.metrics import Metrics
from agentlog.gateway.operations.models import (
    AgentsQuery,
    CancelRunRequest,
    CounterfactualRequest,
    CreateThread,
    DiffRequest,
    ForkThreadRequest,
    ListRunsQuery,
    ListThreadsQuery,
    ProfileStateRequest,
    RevokeRequest,
    RunInputsRequest,
    RunRef,
    StartRunBody,
    ThreadMessagesRequest,
    ThreadRef,
)
from agentlog.gateway.operations.services import Runner, Services, Settings
from agentlog.projections.store import ViewStore

SERVICE_NAME = "agentlog"
SERVICE_VERSION = "0.1.0"
API_PREFIX = "agentlog.api"
QUEUE_GROUP = "agentlog-api"
#: Largest accepted request (bytes), as HTTP's `max_body`; bigger -> 413.
MAX_REQUEST = 1024 * 1024

_encode = msgspec.json.Encoder().encode

Operation = Callable[[Services, Principal, Any], Awaitable[Any]]


def _op_table(dispatcher: Dispatcher, catalog: list[dict[str, Any]] | None = None,
              ) -> dict[str, dict[str, tuple[type[BaseModel], Operation]]]:
    """group -> op -> (request model, operation). The one list of endpoints. `catalog`: the
    agents of the app when the server knows it (else what the dispatcher knows)."""
    async def start(svc: Services, who: Principal, b: StartRunBody) -> Any:
        return ops.accepted(await ops.start_run(svc, who, dispatcher, b))

    async def inputs(svc: Services, who: Principal, b: RunInputsRequest) -> Any:
        return ops.accepted(await ops.run_inputs(svc, who, dispatcher, b.run_id, b))

    async def cancel(svc: Services, who: Principal, b: CancelRunRequest) -> Any:
        return ops.accepted(await ops.cancel_run(svc, who, dispatcher, b.run_id, b))

    async def agents(_svc: Services, _who: Principal, _b: AgentsQuery) -> Any:
        return {"agents": catalog if catalog is not None else dispatcher.agent_catalog()}

    return {
        "runs": {
            "start": (StartRunBody, start),
            "inputs": (RunInputsRequest, inputs),
            "counterfactual": (CounterfactualRequest,
                               lambda svc, who, b: branches.counterfactual(svc, who, dispatcher, b.run_id, b)),
            "cancel": (CancelRunRequest, cancel),
            "get": (RunRef, lambda svc, who, b: ops.get_run(svc, who, b.run_id, b)),
            "list": (ListRunsQuery, ops.list_runs),
        },
        "threads": {
            "create": (CreateThread, ops.create_thread),
            "fork": (ForkThreadRequest, lambda svc, who, b: ops.fork_thread(svc, who, b.thread_id, b)),
            "diff": (DiffRequest, lambda svc, who, b: branches.diff(svc, who, b.thread_id, b.other_thread_id)),
            "revoke": (RevokeRequest, lambda svc, who, b: threads_api.revoke(svc, who, b.thread_id, b)),
            "get": (ThreadRef, lambda svc, who, b: ops.get_thread(svc, who, b.thread_id, b)),
            "list": (ListThreadsQuery, ops.list_threads),
            "messages": (ThreadMessagesRequest, lambda svc, who, b: ops.thread_messages(svc, who, b.thread_id, b)),
        },
        "agents": {
            "list": (AgentsQuery, agents),
        },
        "profiles": {
            "get": (ProfileStateRequest, lambda svc, who, b: profiles_api.profile_state(svc, who, b.profile_id, b)),
        },
    }


def endpoint_subjects() -> list[str]:
    """Every endpoint subject (documentation, tests)."""
    return [f"{API_PREFIX}.{g}.{op}" for g, table in _op_table(None).items() for op in table]  # type: ignore[arg-type]


def _decode(data: bytes) -> Any:
    if len(data) > MAX_REQUEST:
        raise ApiError(413, "too_large", f"request is {len(data)} bytes, over {MAX_REQUEST}")
    if not data.strip():
        return {}
    return parse_json(data)


def _header_line(text: str) -> str:
    """A header value must be one line."""
    return " ".join(text.split())[:500] or "error"


class ApiService:
    """Binds the operation table to micro endpoints; one handler shape for all of them."""

    def __init__(self, svc: Services, dispatcher: Dispatcher, auth: Authenticator,
                 catalog: list[dict[str, Any]] | None = None) -> None:
        self.svc = svc
        self.auth = auth
        self.table = _op_table(dispatcher, catalog)

    def handler(self, group: str, op: str) -> Callable[[Request], Awaitable[None]]:
        model, operation = self.table[group][op]
        subject = f"{API_PREFIX}.{group}.{op}"

        async def handle(req: Request) -> None:
            try:
                who = self.auth.authenticate((req.headers or {}).get("Authorization"))
                body = model.model_validate(_decode(req.data))
                result = await operation(self.svc, who, body)
                await req.respond(_encode(result))
            except Exception as exc:  # noqa: BLE001 - every failure is an answer, as over HTTP
                code, error, _headers = answer(exc, {"subject": subject})
                await req.respond_error(str(code), _header_line(error["error"]), data=_encode(error))

        return handle

    async def register(self, service: Service) -> None:
        api = service.add_group(name=API_PREFIX, queue_group=QUEUE_GROUP)
        for group, table in self.table.items():
            sub = api.add_group(name=group, queue_group=QUEUE_GROUP)
            for op, (model, _operation) in table.items():
                await sub.add_endpoint(
                    name=f"{group}-{op}", subject=op, handler=self.handler(group, op),
                    metadata={"request": model.__name__},
                )


async def start_nats_service(
    store: JetStreamEventStore,
    views: ViewStore,
    runner: Runner,
    dispatcher: Dispatcher,
    *,
    auth_tokens: str | Mapping[str, str | None] | None = "",
    settings: Settings | None = None,
    metrics: Metrics | None = None,
    nc: NATS | None = None,
    version: str = SERVICE_VERSION,
    catalog: list[dict[str, Any]] | None = None,
) -> Service:
    """Start the `agentlog` micro service on `nc` (default: the store's connection, the one the
    runtime uses). `auth_tokens` as for `create_app` (`None` reads AGENTLOG_TOKENS; "" = off);
    `catalog`: what `agents.list` answers when the app is known (`agentlog.runtime.agent_catalog`).
    Returns the nats-py `Service`; `await service.stop()` to leave."""
    svc = Services(store=store, views=views, runner=runner, metrics=metrics or Metrics(),
                   settings=settings or Settings())
    api = ApiService(svc, dispatcher, Authenticator(resolve_tokens(auth_tokens)), catalog)
    service = await add_service(nc or store.nc, name=SERVICE_NAME, version=version,
                                description="agentlog API over NATS request/reply (DESIGN 5.2)")
    await api.register(service)
    await flush_subscriptions(nc or store.nc)  # requests from other connections must find us
    return service


__all__ = ["API_PREFIX", "ApiService", "SERVICE_NAME", "endpoint_subjects", "start_nats_service"]
