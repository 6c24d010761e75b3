"""Who may do what on NATS: the users, roles and permissions of an agentlog deployment.

Without auth anyone who reaches the NATS port reads every commit, queues commands and appends
forged commits. So the embedded server (DESIGN 2.4) starts with generated credentials, one user
per role, and the production config (`scripts/nats/nats-server.conf`) has the same users and the same
permissions, rendered from the one table below (a test keeps the file equal to it):

* `gateway`: the HTTP/NATS API. Appends (threads, inputs), queues commands (`agentlog.cmd.>`) and
  live decisions (`agentlog.ctl.>`), serves `agentlog.api.>` / the adapters' subjects / `$SRV`,
  reads live output, keeps the KV views (the writer tells the other gateways what each batch
  changed on `agentlog.views.>`).
* `worker`: takes commands (the work-queue consumer and its acks), appends, publishes live output,
  receives live decisions.
* `serve`: gateway + worker in one process (`agentlog serve`, `agentlog demo`).
* `archiver`: retention (`agentlog retention`): the service permissions plus purging the event
  stream, which it does only for commits it has archived first (`agentlog.eventlog.jetstream.retention`).
* `readonly`: reads the log (direct gets, its own ephemeral consumers) and the KV views, calls the
  read endpoints of the API, watches live output. It cannot append, queue or ack commands, write
  KV or touch streams.
* `client`: a NATS protocol client of the API (`nats req agentlog.api.runs.start`, the AG-UI / AI
  SDK adapters over NATS): requests on `agentlog.api.>`, `agentlog.ag-ui.>`, `agentlog.ai-sdk.>`
  and `$SRV.>`, answers on its own inboxes (`_INBOX.client.>`: connect with that inbox prefix).
  Nothing else: no JetStream, no KV, no `ev`/`cmd`/`ctl`, no live output. Why so narrow: every
  request it makes goes through the gateway, which checks it (and its API token, tenant scoping
  included); a JetStream read, a live subscription or a shared `_INBOX.>` (where the services'
  own JetStream replies pass) would go around those checks. The login to hand to applications.

No role but `archiver` may purge the event stream, and none may delete it or delete a message from
it: the log is append-only by permission, not by convention, for every process that serves or
runs agents. The service roles manage their streams through `$JS.API.>`
(create, update, consumers) because they create them at start.

Credentials of the embedded server: one random password per role in `<data_dir>/credentials.json`
(0600, created once per data dir, atomically, so concurrent first starts agree). Every agentlog
process on that data dir reads it, so the CLI needs no flags.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypedDict

from agentlog.eventlog.errors import AgentlogError
from agentlog.eventlog.subjects import EVENTS_STREAM, PREFIX, PROFILES_STREAM

Role = Literal["serve", "gateway", "worker", "readonly", "client", "archiver"]
ROLES: tuple[Role, ...] = ("serve", "gateway", "worker", "readonly", "client", "archiver")
CREDENTIALS_FILE = "credentials.json"


@dataclass(frozen=True)
class Permissions:
    """One user's publish/subscribe allow and deny lists (deny wins, as in nats-server)."""

    publish: tuple[str, ...] = ()
    publish_deny: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    subscribe_deny: tuple[str, ...] = ()

    def __or__(self, other: Permissions) -> Permissions:
        def merged(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(dict.fromkeys(a + b))

        return Permissions(merged(self.publish, other.publish), merged(self.publish_deny, other.publish_deny),
                           merged(self.subscribe, other.subscribe), merged(self.subscribe_deny, other.subscribe_deny))


#: Nobody deletes or purges the log, or removes a commit from it; nor a profile's.
_LOG_IS_APPEND_ONLY = (
    f"$JS.API.STREAM.DELETE.{EVENTS_STREAM}",
    f"$JS.API.STREAM.PURGE.{EVENTS_STREAM}",
    f"$JS.API.STREAM.MSG.DELETE.{EVENTS_STREAM}",
    f"$JS.API.STREAM.DELETE.{PROFILES_STREAM}",
    f"$JS.API.STREAM.PURGE.{PROFILES_STREAM}",
    f"$JS.API.STREAM.MSG.DELETE.{PROFILES_STREAM}",
)
_SERVICE = Permissions(
    # `$O.>`: large tool outputs go to the Object Store by reference (`agentlog.eventlog.jetstream.payloads`).
    # `pf`: profiles (typed state shared by a resource_id's threads), a stream of their own.
    publish=("$JS.API.>", "$JS.ACK.>", "$JS.FC.>", "$KV.>", "$O.>", "_INBOX.>", f"{PREFIX}.ev.>", f"{PREFIX}.pf.>"),
    publish_deny=_LOG_IS_APPEND_ONLY,
    subscribe=("_INBOX.>",),
)
_API = (f"{PREFIX}.api.>", f"{PREFIX}.ag-ui.>", f"{PREFIX}.ai-sdk.>", "$SRV.>")
GATEWAY = _SERVICE | Permissions(
    # views: what each projection batch changed, from the writer to the other gateways
    publish=(f"{PREFIX}.cmd.>", f"{PREFIX}.ctl.>", f"{PREFIX}.views.>", *_API),  # a gateway may call any gateway
    # dlq: a gateway waiting on a queued start hears at once when a worker dead-letters it
    subscribe=(*_API, f"{PREFIX}.live.>", f"{PREFIX}.dlq.>", f"{PREFIX}.views.>"),
)
WORKER = _SERVICE | Permissions(
    # cmd/ctl: sub-agents start and cancel child runs through the queue and live control;
    # dlq: commands given up on (`agentlog.runtime.workers.worker`)
    publish=(f"{PREFIX}.live.>", f"{PREFIX}.cmd.>", f"{PREFIX}.ctl.>", f"{PREFIX}.dlq.>"),
    subscribe=(f"{PREFIX}.ctl.>",),
)
READONLY = Permissions(
    publish=(
        "$JS.API.INFO", "$JS.API.STREAM.INFO.*", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST",
        f"$JS.API.DIRECT.GET.{EVENTS_STREAM}", f"$JS.API.DIRECT.GET.{EVENTS_STREAM}.>",
        f"$JS.API.DIRECT.GET.{PROFILES_STREAM}", f"$JS.API.DIRECT.GET.{PROFILES_STREAM}.>",
        "$JS.API.DIRECT.GET.*.$KV.>",  # KV view reads (any generation of the view buckets)
        # outputs stored by reference, archived threads (nats-py reads an object's info with a
        # plain message get; `*` is a whole-token wildcard, so each bucket's stream is named)
        "$JS.API.DIRECT.GET.*.$O.>", "$JS.API.STREAM.MSG.GET.OBJ_agentlog_payloads",
        "$JS.API.STREAM.MSG.GET.OBJ_agentlog_archive",
        "$JS.API.CONSUMER.CREATE.*", "$JS.API.CONSUMER.CREATE.*.>",  # ephemeral readers (follow, KV listing)
        "$JS.API.CONSUMER.DELETE.*.*", "$JS.API.CONSUMER.INFO.*.*", "$JS.FC.>",
        f"{PREFIX}.api.*.get", f"{PREFIX}.api.*.list", f"{PREFIX}.api.threads.messages", "$SRV.>",
    ),
    # Explicit, so a wider allow added later cannot open them: no writes, no commands, no acks
    # (an ack removes a command from the work queue), no durable consumers.
    publish_deny=(
        f"{PREFIX}.ev.>", f"{PREFIX}.pf.>", f"{PREFIX}.cmd.>", f"{PREFIX}.ctl.>", f"{PREFIX}.live.>", f"{PREFIX}.dlq.>", "$KV.>", "$O.>",
        "$JS.ACK.>",
        "$JS.API.CONSUMER.CREATE.AGENTLOG_COMMANDS", "$JS.API.CONSUMER.CREATE.AGENTLOG_COMMANDS.>",
        "$JS.API.CONSUMER.DURABLE.CREATE.>", "$JS.API.CONSUMER.DELETE.AGENTLOG_COMMANDS.*",
        f"$JS.API.CONSUMER.DELETE.{EVENTS_STREAM}.agentlog_projections", *_LOG_IS_APPEND_ONLY,
    ),
    subscribe=("_INBOX.>", f"{PREFIX}.live.>"),
)
#: The inbox prefix of `client` logins (nats-py `connect(inbox_prefix=...)`, `nats --inbox-prefix`).
CLIENT_INBOX = "_INBOX.client"
CLIENT = Permissions(
    publish=_API,
    # Explicit, so a wider allow added later cannot open them: no appends, commands, live
    # decisions or output, no JetStream API, acks or flow control, no KV or object writes, and no
    # answers on other users' inboxes.
    publish_deny=(f"{PREFIX}.ev.>", f"{PREFIX}.pf.>", f"{PREFIX}.cmd.>", f"{PREFIX}.ctl.>", f"{PREFIX}.live.>",
                  f"{PREFIX}.dlq.>", "$JS.>", "$KV.>", "$O.>", "_INBOX.>"),
    subscribe=(f"{CLIENT_INBOX}.>",),
)
#: Retention: archives (Object Store, KV run index, marker commits) and then purges what it
#: archived. The stream itself and single messages stay undeletable.
ARCHIVER = Permissions(
    publish=("$JS.API.>", "$JS.ACK.>", "$JS.FC.>", "$KV.>", "$O.>", "_INBOX.>", f"{PREFIX}.ev.>", f"{PREFIX}.pf.>"),
    publish_deny=(f"$JS.API.STREAM.DELETE.{EVENTS_STREAM}", f"$JS.API.STREAM.MSG.DELETE.{EVENTS_STREAM}",
                  f"$JS.API.STREAM.DELETE.{PROFILES_STREAM}", f"$JS.API.STREAM.PURGE.{PROFILES_STREAM}",
                  f"$JS.API.STREAM.MSG.DELETE.{PROFILES_STREAM}"),
    subscribe=("_INBOX.>",),
)
PERMISSIONS: dict[Role, Permissions] = {"serve": GATEWAY | WORKER, "gateway": GATEWAY, "worker": WORKER,
                                        "readonly": READONLY, "client": CLIENT, "archiver": ARCHIVER}


# -- nats-server config ---------------------------------------------------------------------------


def _list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(json.dumps(item) for item in items) + "]"


def _permissions_block(p: Permissions) -> str:
    publish = f"allow: {_list(p.publish)}" + (f", deny: {_list(p.publish_deny)}" if p.publish_deny else "")
    subscribe = f"allow: {_list(p.subscribe)}" + (f", deny: {_list(p.subscribe_deny)}" if p.subscribe_deny else "")
    return f"{{ publish: {{ {publish} }}, subscribe: {{ {subscribe} }}, allow_responses: true }}"


def users_block(passwords: Mapping[Role, str], *, indent: str = "  ") -> str:
    """nats-server `users = [...]` with one user per role. A password starting with `$` is written
    unquoted: a config variable / environment variable reference (the production config)."""
    lines = ["users = ["]
    for role in ROLES:
        password = passwords[role]
        shown = password if password.startswith("$") else json.dumps(password)
        lines.append(f"{indent}{{ user: {json.dumps(role)}, password: {shown},")
        lines.append(f"{indent}  permissions: {_permissions_block(PERMISSIONS[role])} }}")
    lines.append("]")
    return "\n".join(lines)


# -- generated credentials of a data dir ----------------------------------------------------------


class CredentialsError(AgentlogError):
    """The data dir's credentials file is unreadable or malformed."""

    code = "credentials_error"


class Login(TypedDict, total=False):
    """`user`/`password` keyword arguments for `JetStreamEventStore.connect` / nats-py (empty:
    no user login)."""

    user: str
    password: str


@dataclass(frozen=True)
class Credentials:
    """The per-role passwords of one embedded server (users are named after their role)."""

    passwords: Mapping[Role, str] = field(default_factory=dict)

    def login(self, role: Role) -> Login:
        """`user`/`password` keyword arguments for `JetStreamEventStore.connect` / nats-py."""
        return {"user": role, "password": self.passwords[role]}

    def authorization_config(self) -> str:
        return "authorization {\n" + users_block(self.passwords) + "\n}"


def load_or_create_credentials(data_dir: str | os.PathLike[str]) -> Credentials:
    """The data dir's credentials, generated on first use (0600; a concurrent first use by another
    process is settled by an atomic link: whoever links first wins, everyone reads that file)."""
    directory = Path(data_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CREDENTIALS_FILE
    if not path.exists():
        doc = {"version": 1, "passwords": {role: secrets.token_urlsafe(24) for role in ROLES}}
        tmp = directory / f".{CREDENTIALS_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    passwords = _read_passwords(path)
    if any(role not in passwords for role in ROLES):
        passwords = _add_roles(path)
    return Credentials({role: passwords[role] for role in ROLES})


def _read_passwords(path: Path) -> dict[str, str]:
    try:
        passwords = json.loads(path.read_text())["passwords"]
        return {str(role): str(password) for role, password in passwords.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CredentialsError(f"cannot read NATS credentials {path}: {exc}; remove it to generate new ones "
                               "(only with no agentlog process running on this data dir)") from None


def _add_roles(path: Path) -> dict[str, str]:
    """Give a credentials file made before a role existed a password for it, keeping the others
    (processes on the data dir keep logging in). Under an exclusive lock, read again inside it:
    concurrent upgraders agree on one password, and the file is replaced atomically, so a reader
    never sees half of it. The running embedded server learns the new user when it next starts."""
    import fcntl

    lock = os.open(path.with_name(f".{CREDENTIALS_FILE}.lock"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        passwords = _read_passwords(path)
        missing = [role for role in ROLES if role not in passwords]
        if missing:
            passwords.update({role: secrets.token_urlsafe(24) for role in missing})
            tmp = path.with_name(f".{CREDENTIALS_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"version": 1, "passwords": passwords}, f)
            os.replace(tmp, path)
        return passwords
    finally:
        os.close(lock)  # releases the lock



# -- the production config ------------------------------------------------------------------------

def password_env(role: str) -> str:
    return f"AGENTLOG_{role.upper()}_PASSWORD"


def accounts_config() -> str:
    """The production accounts file: account AGENTLOG (JetStream on) with one user per role, the
    passwords read from environment variables (`AGENTLOG_<ROLE>_PASSWORD`) when nats-server loads
    it, and a system account."""
    users = users_block({role: "$" + password_env(role) for role in ROLES}, indent="      ")
    users = users.replace("\n]", "\n    ]")
    return "\n".join([
        "# agentlog on NATS: accounts, users and permissions. Generated by `python -m agentlog.eventlog.roles`",
        "# from src/agentlog/eventlog/roles.py (a test keeps them equal): edit that table, not this file.",
        "# Passwords come from the environment of nats-server: AGENTLOG_SERVE_PASSWORD,",
        "# AGENTLOG_GATEWAY_PASSWORD, AGENTLOG_WORKER_PASSWORD, AGENTLOG_READONLY_PASSWORD,",
        "# AGENTLOG_CLIENT_PASSWORD, AGENTLOG_ARCHIVER_PASSWORD, AGENTLOG_SYS_PASSWORD (or bcrypt hashes:",
        "# `nats server passwd`).",
        "accounts {",
        "  AGENTLOG {",
        "    jetstream: enabled",
        "    " + users,
        "  }",
        "  SYS {",
        f"    users = [ {{ user: \"sys\", password: ${password_env('sys')} }} ]",
        "  }",
        "}",
        "system_account: SYS",
        "",
    ])


__all__ = ["CLIENT_INBOX", "CREDENTIALS_FILE", "Credentials", "CredentialsError", "PERMISSIONS", "Permissions", "ROLES", "Role",
           "accounts_config", "load_or_create_credentials", "password_env", "users_block"]


if __name__ == "__main__":
    import sys

    sys.stdout.write(accounts_config())
