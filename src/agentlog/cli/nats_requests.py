"""`agentlog nats req|sub`: the NATS API from a shell, without the Go `nats` CLI.

What a NATS protocol client of agentlog does (`nats req agentlog.api.runs.start ...`, `nats sub
agentlog.live.<thread>.<run>`), done with nats-py and the CLI's usual connection options, so the
docs' NATS examples run on any machine that has agentlog installed. The login is a role of the
deployment (`agentlog.eventlog.roles`): `req` logs in as `client`, the login to hand to applications,
which may only call the API and the adapters; `sub` as `readonly`, since `client` may receive on
its own inboxes only and live output is not per-tenant. On the data dir's embedded server the
password is read from the data dir (`passwords.<user>` in its credentials.json); on a server
named by `--nats URL` it is `--password` (or the URL's `user:password@`, `--creds`, `--token`).

`req` prints the answer's body as received. A publish the login may not make is named as soon as
the server refuses it (not after `--timeout`: a refused request gets no answer). A micro service error (the `Nats-Service-Error-Code`
header) is one line `error [<code>]: <message>` on stderr, exit 2 for a 4xx and 1 otherwise, like
the `run` commands. `--stream` reads the many answers of an adapter subject (AG-UI, AI SDK over
NATS) until their empty end marker. `sub` prints one line per message; it says `listening on
<subject>` on stderr once the server has its subscription, so a script can start it and then
make something happen.
"""

from __future__ import annotations

import asyncio
import json
import sys
import weakref
from typing import Annotated, Any

import nats.errors
import typer
from nats.aio.client import Client as NATS
from rich.console import Console
from rich.text import Text

from agentlog.cli.core import (
    CredsOpt,
    DataDirOpt,
    NatsOpt,
    TimeoutOpt,
    TokenOpt,
    app,
    connection_options,
    group,
    guard,
    run_main,
)
from agentlog.cli.runs import ApiRejected
from agentlog.eventlog.embedded.server import DEFAULT_DATA_DIR
from agentlog.eventlog.errors import AgentlogError, PermissionDenied, StoreUnavailable
from agentlog.eventlog.jetstream.connection import DENIED_HOOKS, flush_subscriptions
from agentlog.eventlog.roles import ROLES, Role
from agentlog.gateway.operations.connection import open_nats

nats_app = group("The NATS API with nats-py: request/reply (req) and subscriptions (sub); no Go `nats` CLI needed.")
app.add_typer(nats_app, name="nats")

#: The error header of a NATS micro service answer (its value: the HTTP-like status).
ERROR_CODE_HEADER = "Nats-Service-Error-Code"
ERROR_HEADER = "Nats-Service-Error"


class UsageError(AgentlogError):
    """A bad argument of `agentlog nats` (an unknown login)."""

    code = "usage_error"
    usage_error = True


def _user(name: str) -> Role:
    if name not in ROLES:
        raise UsageError(f"--user must be one of {', '.join(ROLES)} (the deployment's logins), not {name!r}")
    return name  # narrowed to a Role by the check above


def _headers(given: list[str]) -> dict[str, str]:
    headers = {}
    for item in given:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            raise UsageError(f"--header takes 'NAME: VALUE', not {item!r}")
        headers[name.strip()] = value.strip()
    return headers


UserOpt = Annotated[str, typer.Option(
    "--user", metavar="ROLE", envvar="AGENTLOG_NATS_USER",
    help=f"Log in as this role: {', '.join(ROLES)}.")]
PasswordOpt = Annotated[str | None, typer.Option(
    "--password", envvar="AGENTLOG_NATS_PASSWORD",
    help="The login's password. Default on the data dir's embedded server: passwords.<role> in its "
         "credentials.json.")]
ApiTokenOpt = Annotated[str | None, typer.Option(
    "--api-token", envvar="AGENTLOG_API_TOKEN",
    help="The API's bearer token (sent as the `Authorization` header), when the server has --tokens.")]


def _rejected(headers: dict[str, str], data: bytes) -> ApiRejected:
    """A micro service error answer as the CLI's typed error (the body is `{"error", "code"}`)."""
    status = headers.get(ERROR_CODE_HEADER, "500")
    try:
        doc = json.loads(data) if data else {}
    except ValueError:
        doc = {}
    doc = doc if isinstance(doc, dict) else {}
    code = int(status) if status.isdigit() else 500
    return ApiRejected(code, str(doc.get("code") or f"http_{code}"),
                       str(doc.get("error") or headers.get(ERROR_HEADER) or "error"))


def _refused(nc: NATS, what: str) -> AgentlogError | None:
    """The server's permissions violation for `what` on this connection, if it reported one."""
    error = nc.last_error
    if error is not None and "permissions violation" in str(error).lower():
        return _denied(str(error).removeprefix("nats: "), what)
    return None


def _denied(violation: str, what: str) -> PermissionDenied:
    return PermissionDenied(f"{violation}: the login may not {what} "
                            f"(see `agentlog.eventlog.roles` for what each role may do)")


class _Denials:
    """The publishes the server refuses on one connection, as they are reported (its error
    callback, `DENIED_HOOKS`): `refused(subject)` is done once a publish to `subject` is."""

    def __init__(self, nc: NATS) -> None:
        self._waiting: dict[str, asyncio.Future[None]] = {}
        DENIED_HOOKS[nc] = weakref.WeakMethod(self._denied)

    def _denied(self, subject: str) -> None:
        refused = self.refused(subject)
        if not refused.done():
            refused.set_result(None)

    def refused(self, subject: str) -> asyncio.Future[None]:
        if subject not in self._waiting:
            self._waiting[subject] = asyncio.get_running_loop().create_future()
        return self._waiting[subject]


async def _unless_refused(denials: _Denials, subject: str, answer: Any) -> Any:
    """Await `answer` (the request or the next message), unless the publish to `subject` is
    refused first: then `PermissionDenied`, at once."""
    answering = asyncio.ensure_future(answer)
    refused = denials.refused(subject)
    try:
        await asyncio.wait((answering, refused), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not answering.done():
            answering.cancel()
            await asyncio.gather(answering, return_exceptions=True)
    if answering.done() and not answering.cancelled():
        return answering.result()
    raise _denied(f'Permissions Violation for Publish to "{subject}"', f"publish to {subject}")


def _write(data: bytes) -> None:
    sys.stdout.write(data.decode(errors="replace") + "\n")
    sys.stdout.flush()


async def _request(nc: NATS, subject: str, payload: bytes, headers: dict[str, str] | None, timeout: float) -> None:
    try:
        msg = await _unless_refused(_Denials(nc), subject,
                                    nc.request(subject, payload, timeout=timeout, headers=headers))
    except nats.errors.NoRespondersError:
        raise StoreUnavailable(f"nothing answers on {subject} (is `agentlog serve` or `agentlog gateway` "
                               f"running on this NATS?)") from None
    except nats.errors.TimeoutError:
        raise _refused(nc, f"publish to {subject}") or StoreUnavailable(
            f"no answer on {subject} within {timeout:g}s") from None
    if (msg.headers or {}).get(ERROR_CODE_HEADER):
        raise _rejected(dict(msg.headers or {}), msg.data)
    _write(msg.data)


async def _stream(nc: NATS, subject: str, payload: bytes, headers: dict[str, str] | None, timeout: float) -> None:
    """Many answers on one inbox until the empty end marker; `timeout` bounds the wait for each."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    denials = _Denials(nc)
    try:
        await flush_subscriptions(nc, timeout)
        if (refused := _refused(nc, f"receive on {inbox}")) is not None:
            raise refused
        await nc.publish(subject, payload, reply=inbox, headers=headers)
        while True:
            try:
                msg = await _unless_refused(denials, subject, sub.next_msg(timeout=timeout))
            except nats.errors.TimeoutError:
                raise _refused(nc, f"publish to {subject}") or StoreUnavailable(
                    f"no answer on {subject} within {timeout:g}s") from None
            if (msg.headers or {}).get(ERROR_CODE_HEADER):
                raise _rejected(dict(msg.headers or {}), msg.data)
            if not msg.data:
                return
            _write(msg.data)
    finally:
        await sub.unsubscribe()


@nats_app.command("req")
def nats_req(
    subject: Annotated[str, typer.Argument(help="The subject, e.g. agentlog.api.runs.start or $SRV.INFO.agentlog.")],
    body: Annotated[str, typer.Argument(help="The request body (the API takes JSON).")] = "",
    stream: Annotated[bool, typer.Option("--stream", help="Print every answer until the end marker (the AG-UI and "
                                                           "AI SDK subjects answer with many).")] = False,
    header: Annotated[list[str] | None, typer.Option(
        "--header", "-H", metavar="'NAME: VALUE'", help="A request header (repeatable), e.g. 'Agentlog-Agent: deployer' "
                                                         "for the adapter subjects.")] = None,
    user: UserOpt = "client", password: PasswordOpt = None, api_token: ApiTokenOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 10.0,
) -> None:
    """Send BODY to SUBJECT and print the answer (as the `client` login by default)."""
    options = connection_options(nats, creds, token, data_dir, timeout, use="running")
    headers = guard(lambda: _headers(header or [])) | ({"Authorization": f"Bearer {api_token}"} if api_token else {})
    role = guard(lambda: _user(user))

    async def main() -> None:
        async with open_nats(options, role, password) as nc:
            send = _stream if stream else _request
            await send(nc, subject, body.encode(), headers or None, timeout)

    run_main(main)


@nats_app.command("sub")
def nats_sub(
    subject: Annotated[str, typer.Argument(help="The subject (wildcards * and > allowed), e.g. "
                                                "agentlog.live.<thread>.<run>.")],
    count: Annotated[int, typer.Option("--count", min=0, help="Exit after this many messages (0: until Ctrl-C).")] = 0,
    user: UserOpt = "readonly", password: PasswordOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 10.0,
) -> None:
    """Print the messages on SUBJECT, one line each (as the `readonly` login by default)."""
    options = connection_options(nats, creds, token, data_dir, timeout, use="running")
    role = guard(lambda: _user(user))

    async def main() -> None:
        async with open_nats(options, role, password) as nc:
            messages: asyncio.Queue[bytes] = asyncio.Queue()

            async def received(msg: Any) -> None:
                messages.put_nowait(msg.data)

            await nc.subscribe(subject, cb=received)
            await flush_subscriptions(nc, timeout)
            if (refused := _refused(nc, f"subscribe to {subject}")) is not None:
                raise refused
            err = Console(stderr=True, highlight=False, soft_wrap=True)
            err.print(Text(f"listening on {subject} as {role}", style="dim"))
            seen = 0
            while not count or seen < count:
                _write(await messages.get())
                seen += 1

    run_main(main)
