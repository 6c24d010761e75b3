"""Provider set-up is checked when a process that runs models starts: `agentlog serve` and
`agentlog worker` of a Python app whose agents name `openai:` and `anthropic:` models exit 2
before they listen or take work, with one line naming each agent, model and what it lacks (a
key; an SDK), as a YAML app's missing key is reported at load. `openai:` honours
`OPENAI_BASE_URL` (and a base URL given in code or in a config file): another server needs no
OpenAI key. An install hint names the extra's own requirements (agentlog is on no index), the
same as pyproject's extras."""

from __future__ import annotations

import asyncio
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from agentlog.eventlog import MemoryEventStore
from agentlog.runtime import Runtime
from agentlog.runtime.agents.setup import model_setup_problems
from agentlog.runtime.config import build, parse_config
from agentlog.runtime.models import OpenAIChatModel, model_from_id
from agentlog.runtime.models.extras import extra_requirements, install_hint
from agentlog.runtime.models.sdk import SdkSetup

from tests.apps.model_setup_app import app as setup_app
from tests.support.examples import clean_env, run
from tests.support.topology import PYTHONPATH

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("role", ["serve", "worker"])
def test_a_server_of_an_app_without_its_provider_keys_does_not_start(tmp_path: Path, role: str) -> None:
    env = clean_env(PYTHONPATH=PYTHONPATH)
    argv = ["agentlog", role, "--app", "tests.apps.model_setup_app:app", "--data-dir", str(tmp_path / "data")]
    argv += ["--port", "0"] if role == "serve" else []
    code, out, err = asyncio.run(run(argv, cwd=ROOT, env=env, timeout=60))
    assert code == 2, out + err
    assert err.startswith("error [model_setup]: the app's models cannot answer as set up: "), err
    assert "agent 'writer', model 'openai:gpt-4o-mini': OPENAI_API_KEY is not set" in err
    assert "agent 'reviewer', model 'anthropic:claude-test': ANTHROPIC_API_KEY is not set" in err
    assert "agent 'reviewer', model 'openai:gpt-4o-mini'" in err  # its fallback, checked too
    assert "'local'" not in err and "HTTP" not in out  # nothing listened


def test_setup_problems_follow_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)

    def problems() -> list[str]:
        return model_setup_problems(setup_app.agents, Runtime(MemoryEventStore(), agents=setup_app.agents).models)

    assert len(problems()) == 3
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:11434/v1")  # a local server: no key needed
    assert [p for p in problems() if "OPENAI" in p] == []
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    assert problems() == []


def test_openai_honours_openai_base_url_and_a_given_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    assert model_from_id("openai:m").base_url == "https://api.openai.com/v1"
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1/")
    assert model_from_id("openai:m").url == "http://127.0.0.1:8000/v1/chat/completions"
    assert OpenAIChatModel("m").base_url == "http://127.0.0.1:8000/v1"
    assert OpenAIChatModel("m", base_url="http://h:1/v1").base_url == "http://h:1/v1"  # given wins
    config = parse_config("models: {m: {type: openai, model: x}, n: {type: openai, base_url: 'http://h:2/v1'}}\n"
                          "agents: [{id: a, model: m}, {id: b, model: n}]")
    loaded = build(config)
    assert loaded.models["m"].base_url == "http://127.0.0.1:8000/v1"
    assert loaded.models["n"].base_url == "http://h:2/v1"


def test_a_missing_sdk_is_named_with_the_command_that_installs_it() -> None:
    lacking = SdkSetup("agentlog_no_such_sdk", "anthropic", "ANTHROPIC_API_KEY", has_key=True, base_url=None)
    [problem] = lacking.problems()
    assert problem == "the 'agentlog_no_such_sdk' package is not installed: " + install_hint("anthropic")
    assert install_hint("anthropic") == "pip install 'anthropic>=0.40' (agentlog's 'anthropic' extra)"


def test_install_hints_name_each_extras_own_requirements() -> None:
    """What `pip install 'agentlog[x]'` would add, without agentlog on an index: the extra's
    requirements as the installed metadata has them, equal to pyproject's."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra, wanted in extras.items():
        if extra == "dev":
            continue
        assert [Requirement(r) for r in extra_requirements(extra)] == [Requirement(r) for r in wanted], extra
        hint = install_hint(extra)
        assert hint.startswith("pip install ") and all(f"'{r}'" in hint or r in hint for r in extra_requirements(extra))


@pytest.mark.usefixtures("keep_structlog_config")
def test_features_of_missing_extras_say_what_installs_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from agentlog.cli.core import app
    from agentlog.runtime.models.extras import MissingExtra
    from agentlog.runtime.telemetry import otlp_tracer_provider

    monkeypatch.setitem(sys.modules, "acp", None)  # as if the extra were not installed
    result = CliRunner().invoke(app, ["acp", "--app", "tests.apps.model_setup_app:app"])
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error [missing_extra]: agentlog acp needs agentlog's 'acp' extra ")
    assert result.stderr.rstrip().endswith(": " + install_hint("acp"))
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(MissingExtra) as info:
        otlp_tracer_provider("http://127.0.0.1:4318/v1/traces")
    assert str(info.value).startswith("exporting spans to http://127.0.0.1:4318/v1/traces needs agentlog's 'otel' extra")
    assert str(info.value).endswith(install_hint("otel"))
