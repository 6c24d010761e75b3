"""The CLI's global NATS login options (docs: "Roles and credentials"): `--token` and `--creds` reach a real
nats-server that requires them, before or after the command, and a missing or wrong login is one
clear error line, not a traceback.

`--creds` is tested against a server in operator (JWT) mode: the test makes an operator, an
account with JetStream and a user with `nkeys` (the library nats-py signs the server's nonce
with), writes the user's .creds file and preloads the account in the server's memory resolver.
A real login is the only check that `nkeys` is installed: without it every `--creds` login fails
inside nats-py.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nkeys
import pytest
from typer.testing import CliRunner

from agentlog.cli.core import app
from agentlog.eventlog import EmbeddedNatsServer

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("keep_structlog_config")

TOKEN = "s3cret-token"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _keypair(prefix: int) -> Any:
    return nkeys.from_seed(nkeys.encode_seed(os.urandom(32), prefix))


def _jwt(issuer: Any, subject: str, name: str, nats: dict[str, Any]) -> str:
    """A NATS v2 JWT: `{typ, alg: ed25519-nkey}` header, claims, the issuer's ed25519 signature."""
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    claims = {"jti": _b64(os.urandom(16)), "iat": int(time.time()), "iss": issuer.public_key.decode(),
              "name": name, "sub": subject, "nats": {**nats, "version": 2}}
    body = f"{header}.{_b64(json.dumps(claims).encode())}"
    return f"{body}.{_b64(issuer.sign(body.encode()))}"


def _operator_mode(tmp: Path) -> tuple[list[str], Path]:
    """nats-server config lines for operator mode with one JetStream account, and a user's .creds."""
    operator = _keypair(nkeys.PREFIX_BYTE_OPERATOR)
    account = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    user = _keypair(nkeys.PREFIX_BYTE_USER)
    op_jwt = _jwt(operator, operator.public_key.decode(), "op", {"type": "operator"})
    unlimited = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True,
                 "conn": -1, "leaf": -1, "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
    acc_jwt = _jwt(operator, account.public_key.decode(), "agentlog", {"type": "account", "limits": unlimited})
    user_jwt = _jwt(account, user.public_key.decode(), "cli",
                    {"type": "user", "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1})
    creds = tmp / "cli.creds"
    creds.write_text(
        f"-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{user.seed.decode()}\n------END USER NKEY SEED------\n")
    creds.chmod(0o600)
    system = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)  # JetStream needs the server's system account
    sys_jwt = _jwt(operator, system.public_key.decode(), "SYS", {"type": "account"})
    config = [f'operator: "{op_jwt}"', "resolver: MEMORY", f"system_account: {system.public_key.decode()}",
              f'resolver_preload: {{ {account.public_key.decode()}: "{acc_jwt}", '
              f'{system.public_key.decode()}: "{sys_jwt}" }}']
    return config, creds


@pytest.fixture
def token_server(tmp_path: Path) -> Iterator[EmbeddedNatsServer]:
    with EmbeddedNatsServer(tmp_path / "nats", extra_config=[f'authorization {{ token: "{TOKEN}" }}']) as server:
        yield server


@pytest.fixture
def jwt_server(tmp_path: Path) -> Iterator[tuple[EmbeddedNatsServer, Path]]:
    config, creds = _operator_mode(tmp_path)
    with EmbeddedNatsServer(tmp_path / "nats", extra_config=config) as server:
        yield server, creds


def test_token_before_or_after_the_command(token_server: EmbeddedNatsServer) -> None:
    url = token_server.url
    for args in (["--nats", url, "--token", TOKEN, "threads", "--json"],
                 ["threads", "--nats", url, "--token", TOKEN, "--json"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout) == []


def test_a_missing_or_wrong_token_is_one_clear_line(token_server: EmbeddedNatsServer) -> None:
    for login in ([], ["--token", "wrong"]):
        result = runner.invoke(app, ["--nats", token_server.url, *login, "threads", "--timeout", "3"])
        assert result.exit_code != 0, result.output
        assert "authorization" in result.stderr.lower(), result.output
        assert "Traceback" not in result.output


def test_creds_file_logs_in_to_an_operator_mode_server(jwt_server: tuple[EmbeddedNatsServer, Path]) -> None:
    server, creds = jwt_server
    result = runner.invoke(app, ["--nats", server.url, "--creds", str(creds), "threads", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == []
    # and the server refuses the same command without them
    refused = runner.invoke(app, ["--nats", server.url, "threads", "--timeout", "3"])
    assert refused.exit_code != 0 and "authorization" in refused.stderr.lower(), refused.output
