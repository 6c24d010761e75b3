"""`agentlog demo`: the whole idea in one terminal.

A run that waits for a human is not held in anyone's memory: it is in the log. The demo shows
exactly that. It starts a server (embedded NATS, projections, runtime, HTTP API), starts a run of
a scripted `deployer` agent whose `deploy` tool needs approval (PermissionPlugin ask), follows the
run's events *from the log* until it waits, prints the real `curl` that approves it, and keeps
following the log until the run finishes; then it prints the run's timeline and exits 0.

`--auto-approve` makes the demo send that very request itself (for CI and tests);
`--keep-running` leaves the server up afterwards (Ctrl-C stops it).

`agentlog demo` also gives the agent an MCP tool: its first step calls `run_checks` and, in
parallel, `mcp__notes__release_notes` served by a real MCP server subprocess (`agentlog.cli.demo_mcp`,
stdio). The default app of `serve` (`--app agentlog.cli.demo:app`) stays without it, so a server
started without `--app` spawns no subprocess.

The model is a `ScriptedModel` (no API key, deterministic), positioned by the conversation so a
resumed run on a fresh process continues the script where the log is. With `AGENTLOG_DEMO_MODEL`
set to a `provider:model` id (`anthropic:claude-sonnet-4-5`, `openai:gpt-4o-mini`,
`gemini:gemini-2.5-flash`...), both agents run on that model instead (its key from the provider's
usual variable, e.g. `ANTHROPIC_API_KEY`), with prompts that tell them the same plan.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import shlex
import signal
import sys
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import aiohttp
from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from agentlog.eventlog.embedded.server import DEFAULT_DATA_DIR
from agentlog.eventlog.events import (
    RunFinished,
    RunSuspended,
    StoredCommit,
    ToolCallCompleted,
    ToolCallStarted,
    ToolCallSuspended,
)
from agentlog.eventlog.ids import new_id
from agentlog.eventlog.store import EventStore, as_generator
from agentlog.projections.timeline import build_replay, event_summary, learn_call_names
from agentlog.runtime import (
    AgentSpec,
    App,
    McpServerConfig,
    McpToolset,
    PermissionPlugin,
    RunRequest,
    ToolContext,
    tool,
)
from agentlog.runtime.models.base import ModelRequest
from agentlog.runtime.models.scripted import ScriptedModel, ScriptItem, Turn, last_tool_result

DEMO_AGENT = "deployer"
DEMO_PROMPT = "Ship release 1.4.2 to staging."
#: A `provider:model` id: the demo's agents run on that model instead of the scripted one.
DEMO_MODEL_ENV = "AGENTLOG_DEMO_MODEL"
PROVIDER_PROMPT = (
    "You ship releases carefully. First ask the `checker` sub-agent to run the release checks (agent_run with "
    "agent_id 'checker'), then deploy the release with the deploy tool (env and release from the request), then "
    "say in one sentence that it is live."
)


def demo_app(*, mcp: bool = False) -> App:
    """The demo application: the `deployer` agent delegates the release checks to a `checker`
    sub-agent (a child run on its own thread, `agentlog.runtime.toolkits.subagents`), then deploys after a human
    approves; scripted models. With `mcp`, it also collects the release notes from the demo MCP
    server (started here, closed at exit) while the checks run. (This module imports `runtime`,
    so the CLI imports it only after logging is configured.)"""
    from agentlog.runtime.toolkits.subagents import SubAgents

    @tool
    async def run_checks(release: str, ctx: ToolContext) -> str:
        """Run the release checks (always allowed)."""
        ctx.set("/checks", {"release": release, "passed": 42, "failed": 0})
        return f"release {release}: 42 checks passed"

    @tool
    async def deploy(env: str, release: str, ctx: ToolContext) -> str:
        """Deploy a release to an environment (a human must approve)."""
        ctx.set("/deployed", {"env": env, "release": release})
        return f"release {release} is live on {env}"

    def deploy_outcome(request: ModelRequest) -> Turn:
        """The last answer reads the deploy's result: a human may have turned it down, and then
        nothing is live."""
        result = last_tool_result(request) or ""
        if "is live" in result:
            return Turn.text("Done: release 1.4.2 is live on staging.")
        return Turn.text("Not deployed: the deploy of release 1.4.2 to staging was not approved, so nothing "
                         "changed. Ask again when it may go out.")

    tools: list[Any] = [run_checks, deploy, *SubAgents().tools]
    mcp_tools: list[str] = []
    checks = ("agent_run", {"agent_id": "checker", "prompt": "Run the release checks for 1.4.2."})
    first = Turn.tool(*checks, text="Asking the checker sub-agent to run the release checks first.")
    if mcp:
        toolset = McpToolset([McpServerConfig(name="notes", command=sys.executable, args=["-m", "agentlog.cli.demo_mcp"])])
        tools += toolset.start().tools
        atexit.register(toolset.close)
        mcp_tools = ["mcp__notes__release_notes"]
        first = Turn.tools(checks, ("mcp__notes__release_notes", {"release": "1.4.2"}),
                           text="Asking the checker sub-agent for the release checks and collecting the release "
                                "notes first.")
    script: list[ScriptItem] = [
        first,
        Turn.tool("deploy", {"env": "staging", "release": "1.4.2"}, text="Checks passed; deploying."),
        deploy_outcome,
    ]
    agent = AgentSpec(id=DEMO_AGENT, model="demo", tools=["agent_run", "deploy", *mcp_tools], max_rounds=6,
                      system_prompt="You ship releases carefully.", allowed_agents=["checker"],
                      plugins=[PermissionPlugin(ask=["deploy"])])
    checker = AgentSpec(id="checker", model="checker", tools=["run_checks"], max_rounds=3,
                        system_prompt="You run release checks.")
    model: Any = ScriptedModel(script, loop=True, position="conversation", name="demo-scripted")
    checker_model: Any = ScriptedModel([Turn.tool("run_checks", {"release": "1.4.2"}),
                                        Turn.text("All 42 release checks passed for 1.4.2.")],
                                       loop=True, position="conversation", name="checker-scripted")
    configured = os.environ.get(DEMO_MODEL_ENV, "").strip()
    if configured:  # a real model: the same agents, told the plan the script follows
        from agentlog.runtime.models.providers import model_from_id

        model = checker_model = model_from_id(configured)
        agent = agent.model_copy(update={"system_prompt": PROVIDER_PROMPT + (
            " Also collect the release notes with mcp__notes__release_notes." if mcp else "")})
        checker = checker.model_copy(update={"system_prompt": "You run release checks: call run_checks with the "
                                                              "release, then report the result in one sentence."})
    return App(agents=[agent, checker], tools=tools, models={"demo": model, "checker": checker_model})


#: `--app agentlog.cli.demo:app` works too (a factory, so each process gets its own model instance).
def app(_store: EventStore) -> App:
    return demo_app()


#: What `agentlog demo` runs: the demo app with its MCP step.
def app_with_mcp(_store: EventStore) -> App:
    return demo_app(mcp=True)


@dataclass(frozen=True)
class Approval:
    """What approving the waiting run takes: the URL, the JSON body and the curl line."""

    url: str
    body: dict[str, Any]
    headers: dict[str, str]

    @property
    def curl(self) -> str:
        parts = ["curl", "-sS", "-X", "POST", self.url, "-H", "Content-Type: application/json"]
        for key, value in self.headers.items():
            parts += ["-H", f"{key}: {value}"]
        parts += ["-d", json.dumps(self.body, separators=(",", ":"))]
        return " ".join(shlex.quote(p) for p in parts)


def approval_for(base_url: str, run_id: str, call_ids: list[str], token: str | None = None) -> Approval:
    decisions = [{"target_id": call_id, "decision_id": f"approve-{call_id}", "action": "resume",
                  "result": {"approved": True}} for call_id in call_ids]
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return Approval(f"{base_url}/v1/runs/{run_id}/inputs", {"decisions": decisions}, headers)


async def send_approval(approval: Approval) -> tuple[int, str]:
    """POST the approval over HTTP, exactly as the printed curl does."""
    async with aiohttp.ClientSession() as session:
        async with session.post(approval.url, json=approval.body, headers=approval.headers) as resp:
            return resp.status, await resp.text()


def _event_line(stored: StoredCommit, names: dict[str, str]) -> list[Text]:
    lines = []
    for position, event in stored.positioned():
        learn_call_names(event, names)
        line = Text("  ")
        line.append(f"{position!s:>7}", style="cyan")
        line.append(f"  {type(event).__name__:<20}", style="bold")
        line.append(" " + event_summary(event, names))
        lines.append(line)
    return lines


async def follow_run(store: EventStore, thread_id: str, run_id: str, after: int,
                     on_commit: Callable[[StoredCommit], None]) -> tuple[int, StoredCommit]:
    """Follow the thread's log after `after` until this run suspends or finishes; returns the last
    seq read and the commit that paused/ended the run. The log, not the runtime, is what we watch:
    the same loop works whichever process (or worker) drives the run."""
    async with aclosing(as_generator(store.follow(thread_id, after))) as commits:
        async for stored in commits:
            if stored.commit.run_id != run_id:
                continue
            on_commit(stored)
            if any(isinstance(e, (RunSuspended, RunFinished)) for e in stored.commit.events):
                return stored.seq, stored
    raise RuntimeError("the log follower ended before the run paused or finished")


def sub_agent_runs(commits: list[StoredCommit]) -> list[dict[str, Any]]:
    """The child runs the followed run's `agent_run` calls completed with (their results)."""
    started = {e.call_id for c in commits for e in c.commit.events
               if isinstance(e, ToolCallStarted) and e.name == "agent_run"}
    return [e.result for c in commits for e in c.commit.events
            if isinstance(e, ToolCallCompleted) and e.call_id in started and isinstance(e.result, dict)]


def suspended_calls(commits: list[StoredCommit]) -> list[str]:
    return [e.call_id for c in commits for e in c.commit.events if isinstance(e, ToolCallSuspended)]


async def run_demo(server: Any, *, auto_approve: bool, keep_running: bool, console: Console,
                   token: str | None = None) -> int:
    """The demo flow on a started `agentlog.cli.assembly.Server`. Returns the exit code."""
    store = server.store
    console.print(Panel.fit(
        Text.assemble(("agentlog demo\n", "bold"),
                      f"HTTP       {server.http_url}\nNATS       {server.nats_url}\n"
                      f"inspector  {server.http_url}/ui\nAPI docs   {server.http_url}/docs"),
        border_style="magenta"))
    run_id, thread_id = new_id(), new_id()
    request = RunRequest(agent_id=DEMO_AGENT, messages=[DEMO_PROMPT], run_id=run_id, thread_id=thread_id)
    if server.dispatcher is not None:  # the same path as POST /v1/runs
        await server.dispatcher.start_run(request)
    else:
        await server.runtime.start(request)
    console.print(Text.assemble("started run ", (run_id, "bold"), f" of agent {DEMO_AGENT!r} on thread {thread_id}: ",
                                (repr(DEMO_PROMPT), "italic")))
    names: dict[str, str] = {}
    seen: list[StoredCommit] = []

    def show(stored: StoredCommit) -> None:
        seen.append(stored)
        for line in _event_line(stored, names):
            console.print(line)

    seq, last = await follow_run(store, thread_id, run_id, 0, show)
    while not any(isinstance(e, RunFinished) for e in last.commit.events):
        calls = suspended_calls([last]) or suspended_calls(seen)
        approval = approval_for(server.http_url, run_id, calls, token)
        console.print(Text(f"\nrun {run_id} is waiting for approval of {', '.join(names.get(c, c) for c in calls)}"
                           f" (call {', '.join(calls)}). Nothing holds it in memory: it is in the log.",
                           style="bold yellow"))
        console.print("approve it with:")
        console.print(Text(approval.curl, style="green"))
        if auto_approve:
            status, body = await send_approval(approval)
            console.print(Text(f"--auto-approve: POST {approval.url} -> {status} {body.strip()}", style="dim"))
            if status >= 300:
                console.print(Text("the approval was refused; stopping", style="bold red"))
                return 1
        else:
            console.print(Text("waiting for the decision (following the log)...", style="dim"))
        seq, last = await follow_run(store, thread_id, run_id, seq, show)
    thread = [c async for c in store.read_thread(thread_id)]
    report = build_replay(run_id, thread)
    end = report.run_as_of
    console.print(Text(f"\nrun {run_id} finished: {end.termination.type if end and end.termination else '?'} "
                       f"after {end.steps if end else '?'} step(s)", style="bold green"))
    for group in report.groups:
        kinds = ", ".join(type(item.event).__name__ for item in group.events)
        console.print(Text(f"  {group.label}: {kinds}"))
    console.print(Text(f"final state: {json.dumps(report.state, sort_keys=True)}"))
    data_dir = server.config.connection.data_dir
    where = f" --data-dir {data_dir}" if server.embedded is not None and data_dir != DEFAULT_DATA_DIR else ""
    for child in sub_agent_runs(seen):
        console.print(Text(f"sub-agent {child['agent_id']} ran as run {child['run_id']} on its own thread "
                           f"{child['thread_id']}: {child['output']!r}  (agentlog replay {child['run_id']}{where})"))
    console.print(Text(f"inspect it again any time:  agentlog replay {run_id}{where}", style="dim"))
    if keep_running:
        console.print(Text(f"--keep-running: server up at {server.http_url} (Ctrl-C to stop); "
                           f"inspector {server.http_url}/ui, API docs {server.http_url}/docs", style="bold"))
        await wait_for_signal()
    return 0


async def wait_for_signal(again: Callable[[], None] | None = None) -> None:
    """Block until SIGINT/SIGTERM (used by long-running commands). `again`: called on a second
    Ctrl-C (the stop under way should hurry); a third one force-quits (KeyboardInterrupt)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    try:
        await stop.wait()
    finally:
        # A second SIGTERM (e.g. `timeout` signals the process and then its whole group) must not
        # cut the orderly stop short; a second Ctrl-C is a person asking it to hurry.
        try:
            if again is None:
                loop.remove_signal_handler(signal.SIGINT)
            else:
                def hurry() -> None:
                    loop.remove_signal_handler(signal.SIGINT)  # the next one force-quits
                    again()

                loop.add_signal_handler(signal.SIGINT, hurry)
            loop.add_signal_handler(signal.SIGTERM, lambda: None)
        except (NotImplementedError, RuntimeError):
            pass


__all__ = ["DEMO_AGENT", "Approval", "app", "app_with_mcp", "approval_for", "demo_app", "follow_run", "run_demo",
           "send_approval", "wait_for_signal"]
