"""Standing permissions: an approval answered "always" (`{"approved": true|false, "always": true}`)
stores a rule in the thread state (`agentlog.permissions`) that the permission plugin applies to
the thread's later calls; a tool always denied is hidden from the model; the rules are listed and
revoked with the CLI (and `DELETE /v1/threads/{id}/permissions`).

Against what users run: `agentlog serve`, and `agentlog gateway` + `agentlog worker` (the shared
`protocol_deployment` of tests/apps/protocol_app.py: agent `sequential` asks a human before `echo`;
"approval: ..." makes the model call `echo`). Synchronisation: `runs.wait` follows the log.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from agentlog.cli.core import app
from agentlog.client import ApiError, SyncClient, get_sync_client
from agentlog.eventlog.events import ToolCall, ToolCallDecision
from agentlog.runtime import PermissionPlugin
from agentlog.runtime.permission import STANDING_KEY
from agentlog.runtime.plugins import ExcludeTools, Gate, PatchState, PhaseContext

from tests.support.topology import Deployment

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("keep_structlog_config")
WAIT = 90


@pytest.fixture
def client(protocol_deployment: Deployment) -> Iterator[SyncClient]:
    with get_sync_client(protocol_deployment.http_url) as value:
        yield value


def answer(client: SyncClient, run_id: str, result: dict[str, Any]) -> dict[str, Any]:
    """Answer the run's pending approval with `result` (action resume) and wait for the run."""
    waiting = client.runs.wait(run_id, timeout=WAIT)
    assert waiting["status"] == "waiting", waiting
    decided = client.runs.approve(run_id, result=result)
    return client.runs.wait(run_id, min_seq=decided["seq"], timeout=WAIT)


def echo_call(view: dict[str, Any]) -> dict[str, Any]:
    """The run's one call (of `echo`: a call that never started has no name in the view)."""
    (call,) = view["calls"].values()
    return dict(call)


def cli(d: Deployment, *args: str) -> Any:
    return runner.invoke(app, [*args, "--nats", d.nats_url, "--timeout", "10"], env={"COLUMNS": "200"})


def verify(d: Deployment, run_id: str) -> None:
    result = runner.invoke(app, ["replay", run_id, "--verify", "--app", "tests.apps.protocol_app:app", "--nats", d.nats_url,
                                 "--timeout", "10"])
    assert result.exit_code == 0, result.output


def test_standing_allow_skips_the_approval_on_this_thread_only(client: SyncClient,
                                                                 protocol_deployment: Deployment) -> None:
    first = client.runs.create("sequential", "approval: one")
    done = answer(client, first["run_id"], {"approved": True, "always": True})
    assert done["status"] == "done" and echo_call(done)["verdict"] == "allow"
    thread = first["thread_id"]
    assert client.threads.state(thread)["state"][STANDING_KEY] == {"allow": [{"tool": "echo"}], "deny": []}
    second = client.runs.inputs(first["run_id"], messages="approval: two")
    view = client.runs.wait(second["run_id"], timeout=WAIT)
    assert view["status"] == "done", view  # never waited: the standing rule answered
    call = echo_call(view)
    assert (call["verdict"], call["rule"], call["status"]) == ("allow", "standing:allow:echo", "succeeded")
    other = client.runs.create("sequential", "approval: elsewhere")
    assert client.runs.wait(other["run_id"], timeout=WAIT)["status"] == "waiting"  # per thread
    client.runs.cancel(other["run_id"])
    verify(protocol_deployment, first["run_id"])
    verify(protocol_deployment, second["run_id"])


def test_standing_deny_fails_the_calls_and_hides_the_tool(client: SyncClient, protocol_deployment: Deployment) -> None:
    first = client.runs.create("sequential", "approval: one")
    done = answer(client, first["run_id"], {"approved": False, "always": True})
    assert done["status"] == "done" and echo_call(done)["verdict"] == "deny", done
    assert client.threads.state(first["thread_id"])["state"][STANDING_KEY] == {"deny": [{"tool": "echo"}], "allow": []}
    second = client.runs.inputs(first["run_id"], messages="approval: two")
    view = client.runs.wait(second["run_id"], timeout=WAIT)
    assert view["status"] == "done" and echo_call(view)["status"] == "failed", view
    tools = [e.event for e in client.runs.stream(first["run_id"], follow=False) if isinstance(e.event, dict)
             and e.event.get("type") == "InferenceCompleted"]
    later = [e.event for e in client.runs.stream(second["run_id"], follow=False) if isinstance(e.event, dict)
             and e.event.get("type") == "InferenceCompleted"]
    # the tools part of the request changed: echo is no longer offered
    assert tools[0]["request_digests"]["tools"] != later[0]["request_digests"]["tools"]
    verify(protocol_deployment, second["run_id"])


def test_standing_rules_are_listed_and_revoked(client: SyncClient, protocol_deployment: Deployment) -> None:
    d = protocol_deployment
    first = client.runs.create("sequential", "approval: one")
    answer(client, first["run_id"], {"approved": True, "always": True})
    thread = first["thread_id"]
    listed = cli(d, "thread", "permissions", thread, "--json")
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout)["permissions"]["allow"] == [{"tool": "echo"}]
    assert "always allow  echo" in cli(d, "thread", "permissions", thread).stdout
    missing = cli(d, "thread", "revoke", thread, "nope")
    assert missing.exit_code == 2 and "rule_not_found" in missing.output, missing.output
    revoked = cli(d, "thread", "revoke", thread, "echo", "--json")
    assert revoked.exit_code == 0, revoked.output
    assert json.loads(revoked.stdout)["removed"] == [{"verdict": "allow", "tool": "echo"}]
    again = client.runs.inputs(first["run_id"], messages="approval: two")
    assert client.runs.wait(again["run_id"], timeout=WAIT)["status"] == "waiting"  # asked again
    with pytest.raises(ApiError) as raised:  # the waiting run owns the thread's writes
        client.threads.revoke(thread, "echo")
    assert (raised.value.status, raised.value.code) == (409, "run_active")
    client.runs.cancel(again["run_id"])


def _phase(state: dict[str, Any], decision: Any = None) -> PhaseContext:
    return PhaseContext(agent=None, thread_id="t", run_id="r", step=1, state=state,  # type: ignore[arg-type]
                        messages=[], decision=decision)


def test_standing_rules_in_the_plugin() -> None:
    """The pure rules: a configured deny beats a standing allow; args patterns narrow a rule;
    only a tool denied whatever its arguments is hidden; a malformed entry is ignored."""
    plugin = PermissionPlugin(ask=["echo", "deploy"], deny=["rm"])
    state = {STANDING_KEY: {"allow": [{"tool": "rm"}, {"tool": "deploy", "args": {"env": "staging"}}],
                            "deny": [{"tool": "echo"}, {"tool": "deploy", "args": {"env": "prod"}}, 42]}}
    call = ToolCall(id="c", name="deploy", arguments={"env": "staging"})
    gates = plugin.before_tool_execute(_phase(state), call)
    assert [(g.verdict, g.rule) for g in gates if isinstance(g, Gate)] == [("allow", "standing:allow:deploy(env=staging)")]
    prod = plugin.before_tool_execute(_phase(state), ToolCall(id="c", name="deploy", arguments={"env": "prod"}))
    assert [g.verdict for g in prod if isinstance(g, Gate)] == ["deny"]
    other = plugin.before_tool_execute(_phase(state), ToolCall(id="c", name="deploy", arguments={"env": "dev"}))
    assert [g.verdict for g in other if isinstance(g, Gate)] == ["ask"]
    rm = plugin.before_tool_execute(_phase(state), ToolCall(id="c", name="rm"))
    assert [(g.verdict, g.rule) for g in rm if isinstance(g, Gate)] == [("deny", "deny:rm")]
    assert plugin.before_inference(_phase(state)) == [ExcludeTools(names=("echo",))]
    assert plugin.before_inference(_phase({})) == []


def test_standing_answer_with_args_stores_a_narrowed_rule() -> None:
    plugin = PermissionPlugin(ask=["deploy"])
    decision = ToolCallDecision(target_id="c", decision_id="d", action="resume",
                                result={"approved": True, "always": True, "args": {"env": "staging"}})
    actions = plugin.before_tool_execute(_phase({}, decision), ToolCall(id="c", name="deploy",
                                                                         arguments={"env": "staging"}))
    patches = [a for a in actions if isinstance(a, PatchState)]
    assert patches == [PatchState(ops=({"op": "add", "path": f"/{STANDING_KEY}",
                                        "value": {"allow": [{"tool": "deploy", "args": {"env": "staging"}}],
                                                  "deny": []}},))]
