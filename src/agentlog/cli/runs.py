"""`agentlog run start|approve|deny|cancel|continue|show` and `agentlog agents`: drive runs of a
running agentlog.

The CLI never runs an agent itself here: it asks a running server (`agentlog serve` or
`gateway`) through its API, so every command takes the same path as any other client and gets
the same typed answers. Two transports behind one small protocol (`RunsApi`):

- HTTP with `--url http://127.0.0.1:8480` (or `$AGENTLOG_URL`), which wins when given: the Python
  client `agentlog.client` (the same JSON bodies on `/v1/runs...`, its typed errors turned into
  the same one-line answers);
- NATS otherwise: the micro service `agentlog.gateway.operations.runs.<op>` (src/agentlog/gateway/nats/service.py), reached
  with the usual connection options (`--nats/--creds/--token`, or the server running on
  `--data-dir`, never one started for the command), so whatever `ConnectionOptions`/`open_store`
  learn about finding a server, these commands learn too. With none of them, or nothing
  answering, the error names what was looked for (`NoServer`, `NoServerAnswers`).

`--api-token` is the API's bearer token (HTTP `Authorization`, or the same header on the NATS
request) when the server has tokens configured. An API error is one line `error [<code>]: ...`
with exit 2 for a 4xx (the request was wrong: unknown run, nothing pending, bad id) and 1 for
the rest. `--follow` prints the run's events until it suspends (waits for a human) or finishes;
it reads the log (NATS) or the run's SSE stream (HTTP), never polls. A run that stops to wait for
a human ends the output with the `run approve` / `run deny` commands that decide it. `approve`
records `{"approved": true}` as the decision's result and `deny` `{"approved": false}` (what the
inspector page and the API examples send), unless `--result` says otherwise; `--always` adds
`"always": true`, which a permission approval keeps as a standing rule of the thread.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from dataclasses import replace
from enum import StrEnum
from typing import Annotated, Any, NamedTuple, Protocol

import msgspec
import nats.errors
import typer
from rich.table import Table
from rich.text import Text

from agentlog.cli.core import (
    URL_ENV,
    ApiTokenOpt,
    CredsOpt,
    DataDirOpt,
    NatsOpt,
    TimeoutOpt,
    TokenOpt,
    UrlOpt,
    app,
    connection_options,
    format_time,
    group,
    guard,
    print_json,
    run_main,
    status_text,
    stdout_console,
    thread_app,
    usd,
)
from agentlog.cli.reads import event_json
from agentlog.client import APPROVED, DENIED, AsyncClient, ClientError, always_answer, pending_calls
from agentlog.client import ApiError as ClientApiError
from agentlog.eventlog.embedded.server import DEFAULT_DATA_DIR
from agentlog.eventlog.errors import AgentlogError, StoreUnavailable
from agentlog.eventlog.events import IN_DOUBT_ACTION, AnyEvent, RunFinished, RunSuspended, ToolCallSuspended
from agentlog.eventlog.ids import new_id, validate_id, validate_run_id
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.roles import Role
from agentlog.eventlog.store import as_generator
from agentlog.gateway.operations.connection import ConnectionOptions, NoServer, open_store
from agentlog.projections import FAILED_TERMINATIONS
from agentlog.projections.timeline import event_summary, learn_call_names

run_app = group("Start and steer runs on a running agentlog server (its NATS API, or --url).")
app.add_typer(run_app, name="run")


class ApiRejected(AgentlogError):
    """The API answered with an error (`{"error", "code"}`); `status` is its HTTP status."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code

    @property
    def usage_error(self) -> bool:
        """4xx: what was asked is wrong (exit 2), not the server (exit 1)."""
        return 400 <= self.status < 500


class NoServerAnswers(StoreUnavailable):
    """The NATS the command reached has no agentlog API on it (no `serve` or `gateway`)."""

    code = "no_server"


def _where(store: JetStreamEventStore, options: ConnectionOptions | None) -> str:
    """The NATS a command talks to, for its messages: the URL, and the data dir it came from."""
    connected = store.nc.connected_url  # without its user:password@ (never printed)
    url = f"{connected.scheme}://{connected.hostname}:{connected.port}" if connected is not None else "NATS"
    if options is not None and options.embedded:
        return f"{url} (the nats-server of the data dir {options.data_dir.resolve()})"
    return url


class NothingPending(AgentlogError):
    """approve/deny found no suspended call to decide: the API's own code for it (a decision
    sent to such a run is refused with it)."""

    code = "run_not_waiting"
    usage_error = True


# -- transports ------------------------------------------------------------------------------------


class RunsApi(Protocol):
    """The run operations of the API (`start`, `inputs`, `cancel`, `get`) and `agents`; bodies
    and answers are the HTTP JSON. `current` is `get` as of the run's last commit in the log, so
    a command right after another (`run start --follow`, then `run approve`) never reads views
    that have not caught up yet."""

    async def call(self, op: str, body: dict[str, Any]) -> Any: ...

    def follow(self, thread_id: str, run_id: str, after_seq: int) -> AsyncGenerator[Followed, None]:
        """The run's events in commits after `after_seq`, up to the one where it pauses."""
        ...


class Followed(NamedTuple):
    """One event of a followed run: its id (`seq:index`), the event, its JSON line (--json)."""

    event_id: str
    event: AnyEvent
    doc: dict[str, Any]


def _paused(event: AnyEvent) -> bool:
    return isinstance(event, (RunSuspended, RunFinished))


def _error_of(status: int, payload: bytes | str, fallback: str) -> ApiRejected:
    try:
        doc = json.loads(payload) if payload else {}
    except ValueError:
        doc = {}
    doc = doc if isinstance(doc, dict) else {}
    return ApiRejected(status, str(doc.get("code") or f"http_{status}"), str(doc.get("error") or fallback))


class NatsRunsApi:
    """`agentlog.gateway.operations.runs.<op>` request/reply on the store's connection; the log for --follow."""

    def __init__(self, store: JetStreamEventStore, api_token: str | None, timeout: float,
                 options: ConnectionOptions | None = None) -> None:
        self.store, self.timeout = store, timeout
        self.headers = {"Authorization": f"Bearer {api_token}"} if api_token else None
        self.where = _where(store, options)

    async def call(self, op: str, body: dict[str, Any]) -> Any:
        if op == "current":  # `get` as of the run's last commit in the log (the views may lag it)
            last = 0
            async with aclosing(as_generator(self.store.read_run(body["run_id"]))) as commits:
                async for stored in commits:
                    last = stored.seq
            return await self.call("get", {**body, **({"min_seq": last} if last else {})})
        group = {"agents": "agents.list", "fork": "threads.fork", "revoke": "threads.revoke",
                 "thread": "threads.get", "diff": "threads.diff"}
        from agentlog.gateway.nats.service import (
            API_PREFIX,  # the NATS service's modules: only this path needs them
        )

        subject = f"{API_PREFIX}.{group.get(op) or f'runs.{op}'}"
        try:
            msg = await self.store.nc.request(subject, json.dumps(body).encode(), timeout=self.timeout,
                                              headers=self.headers)
        except nats.errors.NoRespondersError:
            raise NoServerAnswers(f"no agentlog server answers on {subject} at {self.where}: is `agentlog serve` "
                                  f"(or `agentlog gateway`) running there? Or point at its HTTP API with --url") from None
        status = (msg.headers or {}).get("Nats-Service-Error-Code")
        if status:
            raise _error_of(int(status) if status.isdigit() else 500, msg.data,
                            (msg.headers or {}).get("Nats-Service-Error", "error"))
        return json.loads(msg.data)

    async def follow(self, thread_id: str, run_id: str, after_seq: int) -> AsyncGenerator[Followed, None]:
        async with aclosing(as_generator(self.store.follow(thread_id, after_seq))) as commits:
            async for stored in commits:
                if stored.commit.run_id != run_id:
                    continue
                for position, event in stored.positioned():
                    yield Followed(str(position), event, event_json(stored, position, event))
                    if _paused(event):
                        return


class HttpRunsApi:
    """The same operations over the HTTP API, through `agentlog.client`; --follow reads the run's
    SSE stream (`client.runs.stream`, resumed with `Last-Event-ID` if the connection breaks)."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def call(self, op: str, body: dict[str, Any]) -> Any:
        body = dict(body)
        runs = self.client.runs
        try:
            if op == "start":
                return await runs.create(body.pop("agent_id"), body.pop("messages", ()), **body)
            if op == "inputs":
                return await runs.inputs(body["run_id"], decisions=body.get("decisions", ()),
                                         messages=body.get("messages", ()), mode=body.get("mode"))
            if op == "cancel":
                return await runs.cancel(body["run_id"], reason=body.get("reason"))
            if op == "get":
                return await runs.get(body["run_id"], min_seq=body.get("min_seq"))
            if op == "current":
                return await runs.current(body["run_id"])
            if op == "agents":
                return {"agents": await self.client.agents.list()}
            if op == "thread":
                return await self.client.threads.get(body["thread_id"])
            if op == "revoke":
                return await self.client.threads.revoke(body["thread_id"], body["tool"], verdict=body.get("verdict"))
            if op == "diff":
                return await self.client.threads.diff(body["thread_id"], body["other_thread_id"])
            if op == "counterfactual" and "answer" in body:
                answer = body["answer"]
                return await runs.replace_answer(body["run_id"], body["at"]["inference"], content=answer["content"],
                                                 tool_calls=answer["tool_calls"])
            if op == "counterfactual":
                decision = body["decision"]
                return await runs.counterfactual(
                    body["run_id"], body["at"]["decision"], action=decision["action"], result=decision.get("result"),
                    reason=decision.get("reason"), new_thread_id=body.get("new_thread_id"))
            if op == "fork":
                return await self.client.threads.fork(
                    body["thread_id"], body["at"], new_thread_id=body.get("new_thread_id"),
                    state=body.get("state"), state_patch=body.get("state_patch"))
        except ClientError as exc:
            raise _rejected(exc) from None
        raise ValueError(f"unknown operation {op!r}")

    async def follow(self, thread_id: str, run_id: str, after_seq: int) -> AsyncGenerator[Followed, None]:
        """The run's SSE stream from its start; events of commits up to `after_seq` are skipped
        here (so an earlier suspension does not end the stream of an approved run)."""
        try:
            async with aclosing(self.client.runs.stream(run_id)) as events:
                async for item in events:
                    if item.seq <= after_seq:
                        continue
                    event = msgspec.convert(item.event, AnyEvent)
                    yield Followed(item.id, event, {**item.to_json(), "commit_id": None, "ts": None})
                    if _paused(event):
                        return
        except ClientError as exc:
            raise _rejected(exc) from None


def _rejected(exc: ClientError) -> AgentlogError:
    """The client's typed error as the CLI's: the API's answer keeps its status and code."""
    if isinstance(exc, ClientApiError):
        return ApiRejected(exc.status or 500, exc.code, exc.message)
    return StoreUnavailable(str(exc))


@asynccontextmanager
async def _connect(options: ConnectionOptions, url: str | None, api_token: str | None,
                   role: Role = "gateway") -> AsyncIterator[RunsApi]:
    """The runs API over HTTP (`url`) or NATS. On the data dir's embedded server the NATS login is
    `role`: `gateway` may call every endpoint, `readonly` only the read ones (`run show`)."""
    if url:
        async with AsyncClient(url, token=api_token, timeout=max(options.timeout, 30.0)) as client:
            yield HttpRunsApi(client)
        return
    async with open_api_store(options, role) as store:
        yield NatsRunsApi(store, api_token, options.timeout, options)


@asynccontextmanager
async def open_api_store(options: ConnectionOptions, role: Role) -> AsyncIterator[JetStreamEventStore]:
    """The store of a running server, for a command given no `--url`: its NATS, or the embedded
    server running on the data dir (never one started for the command: nothing would answer)."""
    try:
        async with open_store(replace(options, embedded_use="running"), role) as store:
            yield store
    except NoServer as exc:
        raise exc.also(f"--url / ${URL_ENV}", "not set") from None


# -- options -------------------------------------------------------------------------------------

FollowOpt = Annotated[bool, typer.Option("--follow", "-f", help="Print the run's events until it waits or ends.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON (one document, or one per event).")]


def _drive(options: ConnectionOptions, url: str | None, api_token: str | None,
           body: Callable[[RunsApi], Any], role: Role = "gateway") -> None:
    async def main() -> None:
        async with _connect(options, url, api_token, role) as api:
            await body(api)

    run_main(main)


def _on_run(run_id: str, options: ConnectionOptions, url: str | None, api_token: str | None,
            body: Callable[[RunsApi], Any], role: Role = "gateway") -> None:
    """A command about one run: check its id before connecting, then drive `body`."""
    guard(lambda: validate_run_id(run_id))
    _drive(options, url, api_token, body, role)


async def _answer(api: RunsApi, op: str, body: dict[str, Any], verb: str, follow: bool, as_json: bool,
                  url: str | None = None) -> None:
    await _report(api, await api.call(op, body), verb, follow, as_json, url)


async def _report(api: RunsApi, accepted: dict[str, Any], verb: str, follow: bool, as_json: bool,
                  url: str | None = None, names: dict[str, str] | None = None) -> None:
    """Print what the API accepted, then (with --follow) the run's events until it pauses. `url`
    (the --url given) goes into the approve/deny commands printed at a pause; `names` are the
    tool names of calls decided before the followed events begin."""
    if as_json:
        print_json(accepted)
    else:
        stdout_console().print(Text(f"{verb} run {accepted['run_id']} on thread {accepted['thread_id']} "
                          f"(seq {accepted.get('seq', '-')})", style="bold"))
    if follow:
        await _follow(api, accepted["thread_id"], accepted["run_id"], max(int(accepted.get("seq") or 1) - 1, 0),
                      as_json, url, dict(names or {}))


async def _follow(api: RunsApi, thread_id: str, run_id: str, after: int, as_json: bool, url: str | None,
                  names: dict[str, str]) -> None:
    out = stdout_console()
    last: AnyEvent | None = None
    doubted: list[str] = []
    async with aclosing(api.follow(thread_id, run_id, after)) as events:
        async for item in events:
            last = item.event
            if isinstance(last, ToolCallSuspended) and last.ticket.action == IN_DOUBT_ACTION:
                doubted.append(last.call_id)
            if as_json:
                print_json(item.doc)
                continue
            learn_call_names(item.event, names)
            line = Text(f"{item.event_id:>8}", style="cyan")
            line.append(f"  {type(item.event).__name__}", style="bold")
            line.append("  " + event_summary(item.event, names))
            out.print(line)
    if as_json:
        return
    if isinstance(last, RunSuspended):
        for call_id in (c for c in last.call_ids if c in doubted):
            out.print(Text(f"{call_id} is in doubt: {resolve_commands(run_id, call_id, url)}", style="bold red"))
        if any(c not in doubted for c in last.call_ids):
            out.print(Text(f"waiting for a human: {decide_commands(run_id, url)}", style="yellow"))
    elif isinstance(last, RunFinished) and last.termination.type in FAILED_TERMINATIONS:
        term = last.termination
        out.print(Text(f"run {run_id} failed ({term.type}{', ' + term.code if term.code else ''})"
                       + (f": {term.detail}" if term.detail else ""), style="bold red"))


def decide_commands(run_id: str, url: str | None = None) -> str:
    """The two commands that decide a waiting run (with `--url` when it was reached over HTTP)."""
    target = f" --url {url}" if url else ""
    return f"agentlog run approve {run_id}{target}   |   agentlog run deny {run_id}{target} --reason ..."


# -- commands ------------------------------------------------------------------------------------


@run_app.command("start")
def run_start(
    message: Annotated[str, typer.Argument(help="The user message.")],
    agent: Annotated[str, typer.Option("--agent", "-a", help="The agent to run.")],
    thread: Annotated[str | None, typer.Option("--thread", help="Continue this thread (default: a new one).")] = None,
    resource_id: Annotated[str | None, typer.Option("--resource-id", help="Owner of a new thread.")] = None,
    follow: FollowOpt = False, as_json: JsonOpt = False, url: UrlOpt = None, api_token: ApiTokenOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """Start a run of AGENT with MESSAGE; print its ids (--follow: and its events)."""
    guard(lambda: validate_id(agent, "agent_id"))
    if thread is not None:
        guard(lambda: validate_id(thread, "thread_id"))
    body: dict[str, Any] = {"agent_id": agent, "messages": message}
    body.update({k: v for k, v in (("thread_id", thread), ("resource_id", resource_id)) if v is not None})
    _drive(connection_options(nats, creds, token, data_dir, timeout), url, api_token,
           lambda api: _answer(api, "start", body, "started", follow, as_json, url))


def _decide(action: str, run_id: str, call_ids: list[str], reason: str | None, result: str | None,
            follow: bool, as_json: bool, options: ConnectionOptions, url: str | None, api_token: str | None,
            always: bool = False) -> None:
    guard(lambda: validate_run_id(run_id))
    for call_id in call_ids:
        guard(lambda: validate_id(call_id, "call_id"))  # noqa: B023  (called at once)
    approving = action == "resume"
    value: Any = APPROVED if approving else DENIED
    if always:
        if result is not None:
            raise typer.BadParameter("give --always or --result, not both", param_hint="--always")
        # a standing rule is recorded by the permission plugin from a resume's answer, for both verdicts
        action, value = "resume", always_answer(approving)
    if result is not None:
        try:
            value = json.loads(result)
        except ValueError:
            raise typer.BadParameter("expected JSON", param_hint="--result") from None

    async def go(api: RunsApi) -> None:
        targets = call_ids
        pending = pending_calls(await api.call("current", {"run_id": run_id}))
        if not targets:
            if not pending:
                raise NothingPending(f"run {run_id!r} has no call waiting for a decision")
            targets = [c["call_id"] for c in pending]
        decisions = [{"target_id": c, "decision_id": new_id(), "action": action, "result": value,
                      **({"reason": reason} if reason else {})} for c in targets]
        accepted = await api.call("inputs", {"run_id": run_id, "decisions": decisions})
        accepted = {**accepted, "decided": targets, "action": action}
        verb = f"{'approved' if approving else 'denied'}{' (always)' if always else ''} {', '.join(targets)} of"
        names = {c["call_id"]: _tool(c) for c in pending}
        await _report(api, accepted, verb, follow, as_json, url, names)

    _drive(options, url, api_token, go)


def _decision_command(name: str, action: str, doc: str) -> None:
    """`run approve` and `run deny`: one command shape, two decision actions."""

    def command(
        run_id: Annotated[str, typer.Argument(help="The waiting run.")],
        call_ids: Annotated[list[str] | None, typer.Argument(
            help="The calls to decide (default: every pending one).")] = None,
        reason: Annotated[str | None, typer.Option("--reason", help="Why (recorded; the model sees it).")] = None,
        result: Annotated[str | None, typer.Option(
            "--result", metavar="JSON", help="The decision's result (for tools that take the decision as "
                                             "their result or input).")] = None,
        always: Annotated[bool, typer.Option(
            "--always", help="A permission approval: decide this tool the same way from now on, on this "
                             "thread (a standing rule; `agentlog thread permissions` lists them).")] = False,
        follow: FollowOpt = False, as_json: JsonOpt = False, url: UrlOpt = None, api_token: ApiTokenOpt = None,
        nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
        data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
    ) -> None:
        _decide(action, run_id, list(call_ids or ()), reason, result, follow, as_json,
                connection_options(nats, creds, token, data_dir, timeout), url, api_token, always)

    command.__doc__ = doc
    run_app.command(name)(command)


_decision_command("approve", "resume", "Approve suspended calls of RUN_ID (decision `resume`, result "
                                      '`{"approved": true}`, with `"always": true` for --always); the run continues.')
_decision_command("deny", "cancel", "Deny suspended calls of RUN_ID (decision `cancel`, result "
                                    '`{"approved": false}`; --always: decision `resume`, result `{"approved": false, '
                                    '"always": true}`); the run continues without them.')


@run_app.command("resolve")
def run_resolve(
    run_id: Annotated[str, typer.Argument(help="The waiting run.")],
    call_id: Annotated[str, typer.Argument(help="The call in doubt.")],
    mark_done: Annotated[str | None, typer.Option(
        "--mark-done", metavar="JSON", help="Its effect happened: record JSON as the call's result.")] = None,
    retry: Annotated[bool, typer.Option("--retry", help="Run it again (same call id: its idempotency key).")] = False,
    cancel: Annotated[bool, typer.Option("--cancel", help="Complete it cancelled; the model is told.")] = False,
    follow: FollowOpt = False, as_json: JsonOpt = False, url: UrlOpt = None, api_token: ApiTokenOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """Resolve a call in doubt (it was running when its worker stopped, and its tool is not
    idempotent): exactly one of --mark-done JSON, --retry, --cancel (a decision `resume` whose
    result answers the call's in-doubt ticket)."""
    chosen = [name for name, given in (("--mark-done", mark_done is not None), ("--retry", retry),
                                       ("--cancel", cancel)) if given]
    if len(chosen) != 1:
        raise typer.BadParameter("give exactly one of --mark-done JSON, --retry, --cancel", param_hint="--retry")
    answer: dict[str, Any] = {"action": "retry" if retry else "cancel"}
    if mark_done is not None:
        answer = {"action": "mark_done", "result": _json_option(mark_done, "--mark-done", object)}
    guard(lambda: validate_run_id(run_id))
    guard(lambda: validate_id(call_id, "call_id"))
    verb = {"mark_done": "marked done", "retry": "retrying", "cancel": "cancelled"}[answer["action"]]

    async def go(api: RunsApi) -> None:
        decision = {"target_id": call_id, "decision_id": new_id(), "action": "resume", "result": answer}
        accepted = await api.call("inputs", {"run_id": run_id, "decisions": [decision]})
        accepted = {**accepted, "decided": [call_id], "action": "resume"}
        await _report(api, accepted, f"{verb} {call_id} of", follow, as_json, url, {})

    _drive(connection_options(nats, creds, token, data_dir, timeout), url, api_token, go)


def resolve_commands(run_id: str, call_id: str, url: str | None = None) -> str:
    """The commands that resolve a call in doubt."""
    target = f" --url {url}" if url else ""
    base = f"agentlog run resolve {run_id} {call_id}{target}"
    return f"{base} --mark-done JSON   |   {base} --retry   |   {base} --cancel"


@run_app.command("cancel")
def run_cancel(
    run_id: Annotated[str, typer.Argument(help="The run to cancel.")],
    reason: Annotated[str | None, typer.Option("--reason", help="Recorded with the cancel.")] = None,
    as_json: JsonOpt = False, url: UrlOpt = None, api_token: ApiTokenOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """Cancel a running or waiting run."""
    body = {"run_id": run_id, **({"reason": reason} if reason else {})}
    _on_run(run_id, connection_options(nats, creds, token, data_dir, timeout), url, api_token,
            lambda api: _answer(api, "cancel", body, "cancel requested for", False, as_json))


class InputMode(StrEnum):
    """What messages for a running run do (`POST /v1/runs/{id}/inputs` `mode`)."""

    steer = "steer"
    follow_up = "follow_up"
    interrupt = "interrupt"


@run_app.command("continue")
def run_continue(
    run_id: Annotated[str, typer.Argument(help="The finished (or waiting) run to continue after.")],
    message: Annotated[str, typer.Argument(help="The next user message.")],
    mode: Annotated[InputMode | None, typer.Option(
        "--mode", help="RUN_ID still runs: steer (taken at its next step), follow_up (taken when it "
                       "would end) or interrupt (cancel it, then continue).")] = None,
    follow: FollowOpt = False, as_json: JsonOpt = False, url: UrlOpt = None, api_token: ApiTokenOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """Start the continuation run of RUN_ID on its thread with MESSAGE (lineage: parent_run_id),
    or, with --mode steer|follow_up, queue MESSAGE for RUN_ID while it runs."""
    body: dict[str, Any] = {"run_id": run_id, "messages": message, **({"mode": mode.value} if mode else {})}
    _on_run(run_id, connection_options(nats, creds, token, data_dir, timeout), url, api_token,
            lambda api: _answer(api, "inputs", body, "queued for" if mode in (InputMode.steer, InputMode.follow_up)
                                else "continued with", follow, as_json, url))


@run_app.command("show")
def run_show(
    run_id: Annotated[str, typer.Argument(help="The run.")],
    as_json: JsonOpt = False, url: UrlOpt = None, api_token: ApiTokenOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """One run as the server sees it: status, calls, usage, pending approvals."""

    async def show(api: RunsApi) -> None:
        run = await api.call("current", {"run_id": run_id})
        if as_json:
            print_json(run)
        else:
            render_run(run)

    _on_run(run_id, connection_options(nats, creds, token, data_dir, timeout), url, api_token, show, role="readonly")


def _json_option(text: str | None, what: str, kind: type) -> Any:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise typer.BadParameter(f"{what}: not JSON ({exc})") from None
    if not isinstance(value, kind):
        raise typer.BadParameter(f"{what}: expected a JSON {'object' if kind is dict else 'array'}")
    return value


@thread_app.command("fork")
def thread_fork(
    thread_id: Annotated[str, typer.Argument(help="The thread to fork.")],
    at: Annotated[str, typer.Option("--at", metavar="EVENT_ID",
                                    help="The event (seq:index, as in the timeline) to fork at.")],
    new_thread_id: Annotated[str | None, typer.Option("--id", help="The fork's thread id (generated if absent).")] = None,
    state: Annotated[str | None, typer.Option("--state", metavar="JSON", help="Replace the fork's state.")] = None,
    patch: Annotated[str | None, typer.Option(
        "--patch", metavar="JSON", help="RFC 6902 ops applied to the state as of --at.")] = None,
    as_json: JsonOpt = False, url: UrlOpt = None, api_token: ApiTokenOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """A new thread with THREAD_ID's messages and state as of event --at (lineage: forked_from).
    Start runs on it with `agentlog run start --thread NEW_ID`."""
    guard(lambda: validate_id(thread_id, "thread_id"))
    body = {"thread_id": thread_id, "at": at, "new_thread_id": new_thread_id,
            "state": _json_option(state, "--state", dict), "state_patch": _json_option(patch, "--patch", list)}
    body = {k: v for k, v in body.items() if v is not None}

    async def fork(api: RunsApi) -> None:
        answer = await api.call("fork", body)
        if as_json:
            print_json(answer)
        else:
            stdout_console().print(Text(f"forked thread {thread_id} at {at} into {answer['thread_id']} "
                              f"(seq {answer['seq']})", style="bold"))

    _drive(connection_options(nats, creds, token, data_dir, timeout), url, api_token, fork)


@thread_app.command("diff")
def thread_diff(
    thread_id: Annotated[str, typer.Argument(help="One branch (e.g. the source thread).")],
    other_thread_id: Annotated[str, typer.Argument(help="The other branch (e.g. its fork).")],
    as_json: JsonOpt = False, url: UrlOpt = None, api_token: ApiTokenOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """Compare two branches event by event from their fork point: how many events they share,
    then a table of the rest side by side (= same, ~ changed, < only in the first, > only in the
    second)."""
    guard(lambda: validate_id(thread_id, "thread_id"))
    guard(lambda: validate_id(other_thread_id, "thread_id"))

    async def show(api: RunsApi) -> None:
        answer = await api.call("diff", {"thread_id": thread_id, "other_thread_id": other_thread_id})
        if as_json:
            print_json(answer)
            return
        render_diff(answer)

    _drive(connection_options(nats, creds, token, data_dir, timeout), url, api_token, show)


@run_app.command("counterfactual")
def run_counterfactual(
    run_id: Annotated[str, typer.Argument(help="The run to branch.")],
    call_id: Annotated[str | None, typer.Option(
        "--call", help="The tool call whose decision to take differently.")] = None,
    inference: Annotated[str | None, typer.Option(
        "--inference", metavar="N|MESSAGE_ID", help="The model answer to replace: its number (1-based) or its "
                                                     "assistant message id.")] = None,
    answer: Annotated[str | None, typer.Option("--answer", help="With --inference: the answer's text.")] = None,
    tool_calls: Annotated[str | None, typer.Option(
        "--tool-calls", metavar="JSON", help='With --inference: the answer\'s calls, [{"name", "arguments"}].')] = None,
    deny: Annotated[bool, typer.Option("--deny", help='Decide {"approved": false} (else --result).')] = False,
    approve: Annotated[bool, typer.Option("--approve", help='Decide {"approved": true} (else --result).')] = False,
    result: Annotated[str | None, typer.Option("--result", metavar="JSON", help="The decision's result.")] = None,
    cancel: Annotated[bool, typer.Option("--cancel", help="Decide `cancel` (the call does not run).")] = False,
    reason: Annotated[str | None, typer.Option("--reason", help="Recorded with the decision.")] = None,
    as_json: JsonOpt = False, url: UrlOpt = None, api_token: ApiTokenOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """Branch RUN_ID into a new thread at the decision of --call, taking another decision there
    ("what if the approver had denied?"), or at its model's answer --inference, taking --answer /
    --tool-calls instead; the new run goes on on a worker. Compare the branches with `agentlog
    thread diff`."""
    if (call_id is None) == (inference is None):
        raise typer.BadParameter("give one of --call, --inference")
    if sum((deny, approve, result is not None)) > 1:
        raise typer.BadParameter("give one of --deny, --approve, --result")
    body: dict[str, Any] = {"run_id": run_id}
    if inference is not None:
        calls = _json_option(tool_calls, "--tool-calls", list) or []
        body |= {"at": {"inference": int(inference) if inference.isdigit() else inference},
                 "answer": {"content": answer or "", "tool_calls": calls}}
    else:
        value = {"approved": False} if deny else {"approved": True} if approve else _json_option_any(result, "--result")
        decision = {"action": "cancel" if cancel else "resume", **({"result": value} if value is not None else {}),
                    **({"reason": reason} if reason else {})}
        body |= {"at": {"decision": call_id}, "decision": decision}

    async def branch(api: RunsApi) -> None:
        made = await api.call("counterfactual", body)
        if as_json:
            print_json(made)
        else:
            point = f"call {call_id}" if call_id is not None else f"inference {inference}"
            stdout_console().print(Text(f"branched run {run_id} at {point}: thread {made['thread_id']}, "
                                        f"run {made['run_id']}", style="bold"))

    _on_run(run_id, connection_options(nats, creds, token, data_dir, timeout), url, api_token, branch)


def _json_option_any(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise typer.BadParameter(f"{what}: not JSON ({exc})") from None


_MARK = {"same": "=", "changed": "~", "only_a": "<", "only_b": ">"}


def render_diff(answer: dict[str, Any]) -> None:
    """The diff of two branches as a table: one row per aligned pair after the common prefix."""
    from rich.table import Table

    out = stdout_console()
    out.print(Text(f"{answer['a']} vs {answer['b']}: {answer['common']} event(s) in common, then "
                   f"{answer['a_events'] - answer['common']} / {answer['b_events'] - answer['common']}",
                   style="bold"))
    table = Table(show_header=True, header_style="bold")
    for column in ("", answer["a"], answer["b"]):
        table.add_column(column, overflow="fold")

    def cell(side: dict[str, Any] | None) -> str:
        if side is None:
            return ""
        return f"{side['id']} {side['type']}: {side.get('summary', '')}"

    for row in answer["rows"]:
        table.add_row(_MARK[row["kind"]], cell(row["a"]), cell(row["b"]))
    out.print(table)


@thread_app.command("permissions")
def thread_permissions(
    thread_id: Annotated[str, typer.Argument(help="The thread.")],
    as_json: JsonOpt = False, url: UrlOpt = None, api_token: ApiTokenOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """The standing permission rules of THREAD_ID ("always allow / deny" answers to approvals)."""
    guard(lambda: validate_id(thread_id, "thread_id"))

    async def show(api: RunsApi) -> None:
        view = await api.call("thread", {"thread_id": thread_id})
        from agentlog.runtime.permission import STANDING_KEY

        rules = (view.get("state") or {}).get(STANDING_KEY) or {}
        if as_json:
            print_json({"thread_id": thread_id, "permissions": rules})
            return
        out = stdout_console()
        rows = [(verdict, rule) for verdict in ("allow", "deny") for rule in rules.get(verdict) or []]
        if not rows:
            out.print(f"no standing permissions on thread {thread_id}")
        for verdict, rule in rows:
            args = ", ".join(f"{k}={v}" for k, v in sorted((rule.get("args") or {}).items()))
            out.print(f"always {verdict}  {rule.get('tool')}" + (f"({args})" if args else ""))

    _drive(connection_options(nats, creds, token, data_dir, timeout), url, api_token, show, role="readonly")


@thread_app.command("revoke")
def thread_revoke(
    thread_id: Annotated[str, typer.Argument(help="The thread.")],
    tool: Annotated[str, typer.Argument(help="The tool whose standing rules to remove.")],
    verdict: Annotated[str | None, typer.Option("--verdict", help="Only 'allow' or only 'deny' rules.")] = None,
    as_json: JsonOpt = False, url: UrlOpt = None, api_token: ApiTokenOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """Remove the standing permission rules of TOOL on THREAD_ID: approvals are asked again."""
    guard(lambda: validate_id(thread_id, "thread_id"))
    body = {"thread_id": thread_id, "tool": tool, **({"verdict": verdict} if verdict else {})}

    async def revoke(api: RunsApi) -> None:
        answer = await api.call("revoke", body)
        if as_json:
            print_json(answer)
        else:
            stdout_console().print(f"revoked {len(answer['removed'])} standing rule(s) of {tool} on thread {thread_id} "
                         f"(seq {answer['seq']})")

    _drive(connection_options(nats, creds, token, data_dir, timeout), url, api_token, revoke)


@app.command("agents")
def agents_cmd(
    as_json: JsonOpt = False, url: UrlOpt = None, api_token: ApiTokenOpt = None,
    nats: NatsOpt = None, creds: CredsOpt = None, token: TokenOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR, timeout: TimeoutOpt = 5.0,
) -> None:
    """The agents the running server can start (`run start --agent ID`): ids, descriptions, tools."""

    async def show(api: RunsApi) -> None:
        agents = (await api.call("agents", {}))["agents"]
        if as_json:
            print_json(agents)
            return
        table = Table(title=f"agents ({len(agents)})", title_justify="left")
        for column in ("agent", "description", "tools"):
            table.add_column(column, overflow="fold")
        for agent in agents:
            tools = agent.get("tools")
            table.add_row(agent["id"], agent.get("description") or "-",
                          "(held by the workers)" if tools is None else ", ".join(t["name"] for t in tools) or "-")
        stdout_console().print(table)

    _drive(connection_options(nats, creds, token, data_dir, timeout), url, api_token, show, role="readonly")


def _agents(run: dict[str, Any]) -> str:
    """The run's agent, and the agents it handed the thread to (`a -> b -> c`)."""
    hops = [h.get("to_agent", "?") for h in run.get("handoffs") or ()]
    return " -> ".join([run.get("agent_id") or "-", *hops])


def render_run(run: dict[str, Any]) -> None:
    """Three rich tables from a RunView's JSON: the run, its calls, what waits for a human."""
    out = stdout_console()
    term = run.get("termination") or {}
    usage = run.get("usage") or {}
    head = Table(title=f"run {run['run_id']}", title_justify="left", show_header=False)
    head.add_column(style="bold")
    head.add_column(overflow="fold")
    status = status_text(run.get("status", "-"))
    if run.get("cancel_requested"):
        status.append(" (cancel requested)")
    for label, value in (
        ("status", status),
        ("thread", run.get("thread_id") or "-"), ("agent", _agents(run)),
        ("parent run", run.get("parent_run_id") or "-"),
        ("termination", " ".join(str(term[k]) for k in ("type", "code", "detail") if term.get(k)) or "-"),
        ("steps", str(run.get("steps", 0))), ("inferences", str(run.get("inferences", 0))),
        ("usage", f"in {usage.get('input_tokens', 0)}  out {usage.get('output_tokens', 0)}  total "
                  f"{usage.get('total_tokens') or usage.get('input_tokens', 0) + usage.get('output_tokens', 0)}"),
        ("cost", usd(run.get("cost"))), ("model", run.get("model") or "-"),
        ("updated", format_time(int(run.get("updated") or 0))),
    ):
        head.add_row(label, value)
    out.print(head)
    calls = list((run.get("calls") or {}).values())
    if calls:
        table = Table(title=f"calls ({len(calls)})", title_justify="left")
        for column in ("call", "tool", "status", "verdict", "decision", "result"):
            table.add_column(column, overflow="fold")
        for c in calls:
            decision = c.get("decision") or {}
            state = Text(c.get("status", "-"))
            if c.get("in_doubt"):
                state.append(" (in doubt)", style="bold red")
            table.add_row(c["call_id"], _tool(c), state, c.get("verdict") or "-",
                          decision.get("action") or "-", _short(c.get("result")))
        out.print(table)
    pending = pending_calls(run)
    if pending:
        table = Table(title=f"pending approvals ({len(pending)})", title_justify="left", style="yellow")
        for column in ("call", "tool", "arguments", "asks"):
            table.add_column(column, overflow="fold")
        for c in pending:
            ticket = c.get("ticket") or {}
            asked = ticket.get("parameters") or {}
            table.add_row(c["call_id"], _tool(c), _short(c.get("arguments") or asked.get("arguments")),
                          ticket.get("message") or ticket.get("action") or "-")
        out.print(table)
        doubted = [c["call_id"] for c in pending if c.get("in_doubt")]
        for call_id in doubted:
            out.print(Text(f"{call_id} is in doubt: {resolve_commands(run['run_id'], call_id)}", style="bold red"))
        if len(doubted) < len(pending):
            out.print(Text(decide_commands(run["run_id"]), style="dim"))


def _tool(call: dict[str, Any]) -> str:
    """The tool's name: a call gated before it started is named only by its permission ticket."""
    asked = (call.get("ticket") or {}).get("parameters") or {}
    return str(call.get("name") or asked.get("tool") or "-")


def _short(value: Any, limit: int = 80) -> str:
    if value is None:
        return "-"
    text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = ["ApiRejected", "HttpRunsApi", "NatsRunsApi", "RunsApi", "decide_commands", "render_run", "resolve_commands",
           "run_app"]
