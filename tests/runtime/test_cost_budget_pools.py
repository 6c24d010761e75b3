"""Cost (recorded per inference, summed in the run and thread views, metrics and the CLI), the
`budget` stop condition (suspends for a human who extends or cancels), and model pools (the
run's model recorded and kept across resumes and runtimes). Real nats-server; verified replay."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
import pytest
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from agentlog import ModelPool, ModelPrices
from agentlog.cli import app as cli_app
from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import Usage
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.projections import fold_commits
from agentlog.runtime import AgentSpec, App, PermissionPlugin, Runtime, tool
from agentlog.runtime.loop.hitl import InvalidDecision
from agentlog.runtime.models import ModelUnavailable, ScriptedModel, Turn
from agentlog.runtime.replay.verify import verify_run
from agentlog.runtime.stop import Budget
from agentlog.runtime.telemetry import AgentMetrics

from tests.support.runtime import events_of, logged, store, thread_log  # noqa: F401  (fixture)

LIMIT = 30
PRICES = ModelPrices(input=1.0, output=2.0)  # USD per 1M tokens
K = Usage(input_tokens=1000, output_tokens=0)  # $0.001 per inference at PRICES


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def tool_turns(n: int, final: str = "done") -> list[Turn]:
    return [*(Turn.tool("add", {"a": i, "b": 1}, usage=K) for i in range(n)), Turn.text(final, usage=K)]


def priced(script: list[Turn], name: str = "m") -> ScriptedModel:
    return ScriptedModel(script, position="conversation", name=name, prices=PRICES)


async def verified(rt: Runtime, run_id: str, thread_id: str) -> None:
    log = await thread_log(rt.store, thread_id)
    report = await verify_run(log, run_id, App(agents=list(rt.agents), tools=[add]))
    assert report.ok, report


# -- cost ------------------------------------------------------------------------------------------


async def test_cost_is_recorded_and_summed_in_run_and_thread_views_and_metrics(store: Any) -> None:
    model = priced(tool_turns(1) + tool_turns(0, "again"))
    rt = Runtime(store, agents=[AgentSpec(id="agent", model="m", tools=["add"])], tools=[add], models={"m": model})
    async with asyncio.timeout(LIMIT):
        first = await rt.run("agent", "add")
        second = await rt.run("agent", "more", thread_id=first.thread_id)
        log = await thread_log(store, first.thread_id)
        await verified(rt, first.run_id, first.thread_id)
    costs = [e.cost for e in events_of(log, "InferenceCompleted")]
    assert costs == [pytest.approx(0.001)] * 3
    views = fold_commits(log)
    assert views.runs[first.run_id].cost == pytest.approx(0.002)
    assert views.runs[second.run_id].cost == pytest.approx(0.001)
    assert views.threads[first.thread_id].cost == pytest.approx(0.003)
    assert [e.cost for e in events_of(log, "RunFinished")] == [pytest.approx(0.002), pytest.approx(0.001)]
    registry = CollectorRegistry()
    metrics = AgentMetrics(registry)
    for sc in log:
        metrics.observe(sc.commit)
    assert registry.get_sample_value("agentlog_model_cost_usd_total", {"model": "m"}) == pytest.approx(0.003)
    assert registry.get_sample_value("agentlog_run_cost_usd_count") == 2


async def test_unpriced_models_record_no_cost(store: Any) -> None:
    model = ScriptedModel(tool_turns(1), position="conversation", name="m")
    rt = Runtime(store, agents=[AgentSpec(id="agent", model="m", tools=["add"])], tools=[add], models={"m": model})
    async with asyncio.timeout(LIMIT):
        result = await rt.run("agent", "add")
        log = await logged(rt, result)
    assert all(e.cost is None for e in events_of(log, "InferenceCompleted"))
    assert fold_commits(log).runs[result.run_id].cost is None
    # omitted on the wire: a log without prices encodes as before
    assert b'"cost"' not in msgspec.json.encode(events_of(log, "InferenceCompleted")[0])
    assert b'"cost"' not in msgspec.json.encode(events_of(log, "RunFinished")[0])


def test_cli_runs_and_threads_show_cost(nats_server: EmbeddedNatsServer, keep_structlog_config: None) -> None:
    async def record() -> str:
        s = await JetStreamEventStore.connect(nats_server.url)
        try:
            rt = Runtime(s, agents=[AgentSpec(id="agent", model="m", tools=["add"])], tools=[add],
                         models={"m": priced(tool_turns(1))})
            async with asyncio.timeout(LIMIT):
                return (await rt.run("agent", "add")).run_id
        finally:
            await s.close()

    run_id = asyncio.run(record())
    runner = CliRunner()
    base = ["--nats", nats_server.url, "--timeout", "5"]
    table = runner.invoke(cli_app, ["runs", *base], env={"COLUMNS": "250"})
    assert table.exit_code == 0, table.output
    assert "cost" in table.output and "$0.002000" in table.output
    rows = json.loads(runner.invoke(cli_app, ["runs", "--json", *base]).stdout)
    assert [r["cost"] for r in rows if r["run_id"] == run_id] == [pytest.approx(0.002)]
    threads = runner.invoke(cli_app, ["threads", *base], env={"COLUMNS": "250"})
    assert threads.exit_code == 0 and "$0.002000" in threads.output


# -- budget ----------------------------------------------------------------------------------------


def budget_runtime(store: Any, budget: Budget, script: list[Turn], mode: str = "parallel_streaming") -> Runtime:
    spec = AgentSpec(id="agent", model="m", tools=["add"], stop_conditions=[budget], tool_execution_mode=mode)
    return Runtime(store, agents=[spec], tools=[add], models={"m": priced(script)})


@pytest.mark.parametrize("mode", ["sequential", "parallel_batch_approval", "parallel_streaming"])
async def test_budget_suspends_for_a_human_and_a_resume_extends_it(store: Any, mode: str) -> None:
    rt = budget_runtime(store, Budget(max_cost=0.0025), tool_turns(3), mode)
    async with asyncio.timeout(LIMIT):
        result = await rt.run("agent", "add a lot")
        assert result.status == "waiting" and result.termination is None  # not failed: waiting
        ticket = result.run.calls["budget-1"].ticket
        assert ticket.action == "budget" and ticket.parameters["cost"] == pytest.approx(0.003)
        decided = await rt.decide(result.run_id, [{"target_id": "budget-1", "decision_id": "d1", "action": "resume",
                                                   "result": {"approved": True}}])
        final = await decided.handle.result()
        assert final.termination.type == "natural_end"
        log = await logged(rt, final)
        await verified(rt, result.run_id, result.thread_id)
    assert len(events_of(log, "InferenceCompleted")) == 4
    # the ticket is answered without a tool message: the model never sees it
    assert all(e.message.tool_call_id != "budget-1" for e in events_of(log, "MessageAppended"))


async def test_budget_cancel_ends_the_run_stopped_by_budget(store: Any) -> None:
    rt = budget_runtime(store, Budget(max_tokens=2500), tool_turns(3))
    async with asyncio.timeout(LIMIT):
        result = await rt.run("agent", "add a lot")
        assert result.status == "waiting"
        # another process decides, from the log alone (the first one may be gone)
        other = budget_runtime(store, Budget(max_tokens=2500), tool_turns(3))
        decided = await other.decide(result.run_id, [{"target_id": "budget-1", "decision_id": "d1", "action": "cancel"}])
        final = await decided.handle.result()
        await verified(rt, result.run_id, result.thread_id)
    assert final.termination.type == "stopped" and final.termination.code == "budget"


async def test_budget_approved_false_declines_and_an_answer_without_approved_is_refused(store: Any) -> None:
    """A budget ticket is an approval: only `approved: true` extends it. `approved: false` ends the
    run as a cancel does, and a resume that does not say either is refused with nothing written."""
    rt = budget_runtime(store, Budget(max_tokens=2500), tool_turns(3))
    async with asyncio.timeout(LIMIT):
        result = await rt.run("agent", "add a lot")
        before = await logged(rt, result)
        for bad in ({}, {"ok": "yes"}, {"approved": "yes"}):
            with pytest.raises(InvalidDecision):
                await rt.decide(result.run_id, [{"target_id": "budget-1", "decision_id": "d0", "action": "resume",
                                                 "result": bad}])
        assert await logged(rt, result) == before
        decided = await rt.decide(result.run_id, [{"target_id": "budget-1", "decision_id": "d1", "action": "resume",
                                                   "result": {"approved": False}}])
        final = await decided.handle.result()
        await verified(rt, result.run_id, result.thread_id)
    assert final.termination.type == "stopped" and final.termination.code == "budget"


async def test_budget_extended_run_suspends_again_at_twice_the_budget(store: Any) -> None:
    rt = budget_runtime(store, Budget(max_tokens=2000), tool_turns(5))
    async with asyncio.timeout(LIMIT):
        result = await rt.run("agent", "add a lot")
        assert result.run.steps == 2 and "budget-1" in result.run.calls  # 2000 tokens: at the budget
        decided = await rt.decide(result.run_id, [{"target_id": "budget-1", "decision_id": "d1", "action": "resume",
                                                   "result": {"approved": True}}])
        again = await decided.handle.result()
    assert again.status == "waiting" and again.run.calls["budget-2"].ticket.action == "budget"
    assert again.run.steps == 4  # the second budget lasted two more steps


# -- pools -----------------------------------------------------------------------------------------


def pool_runtime(store: Any, pool: ModelPool, models: dict[str, Any], **spec: Any) -> Runtime:
    agent = AgentSpec(id="agent", model=pool.models[0], pool=pool, tools=["add"], **spec)
    return Runtime(store, agents=[agent], tools=[add], models=models)


def pool_models(n: int = 3) -> dict[str, Any]:
    return {f"m{i}": ScriptedModel(["hi"], loop=True, name=f"m{i}") for i in range(n)}


async def test_pool_thread_affinity_records_one_model_per_thread(store: Any) -> None:
    pool = ModelPool(models=["m0", "m1", "m2"], affinity="thread")
    rt = pool_runtime(store, pool, pool_models())
    chosen: dict[str, set[str]] = {}
    async with asyncio.timeout(LIMIT):
        for i in range(6):
            thread = f"t{i % 3}"
            result = await rt.run("agent", "hi", thread_id=thread)
            log = await logged(rt, result)
            started = [e for e in events_of(log, "RunStarted") if e.run_id == result.run_id][0]
            answered = events_of(log, "InferenceCompleted")[-1].model
            assert started.model == answered == pool.choose(thread, result.run_id)
            assert result.run.model == started.model
            chosen.setdefault(thread, set()).add(started.model)
        await verified(rt, result.run_id, result.thread_id)
    assert all(len(models) == 1 for models in chosen.values())  # affinity: same thread, same model


async def test_pool_model_is_kept_when_another_runtime_resumes_with_the_pool_reordered(store: Any) -> None:
    pool = ModelPool(models=["m0", "m1", "m2"], affinity="run")
    script = [Turn.tool("add", {"a": 1, "b": 2}), Turn.text("3")]
    models = {n: ScriptedModel(script, position="conversation", name=n) for n in pool.models}
    first = pool_runtime(store, pool, models, plugins=[PermissionPlugin(ask=["add"])])
    async with asyncio.timeout(LIMIT):
        result = await first.run("agent", "1 + 2?")
        assert result.status == "waiting"
        recorded = result.run.model
        assert recorded in pool.models
        # another worker, its pool edited (order reversed): the run keeps its recorded model
        reordered = ModelPool(models=list(reversed(pool.models)), affinity="none")
        models2 = {n: ScriptedModel(script, position="conversation", name=n) for n in pool.models}
        second = pool_runtime(store, reordered, models2, plugins=[PermissionPlugin(ask=["add"])])
        call_id = next(iter(result.run.calls))
        decided = await second.decide(result.run_id, [{"target_id": call_id, "decision_id": "d1", "action": "resume",
                                                            "result": {"approved": True}}])
        final = await decided.handle.result()
        log = await logged(second, final)
    assert final.termination.type == "natural_end"
    assert [e.model for e in events_of(log, "InferenceCompleted")] == [recorded, recorded]
    assert models2[recorded].calls == 1 and sum(m.calls for m in models2.values()) == 1


async def test_pool_falls_back_to_the_rest_of_the_pool(store: Any) -> None:
    pool = ModelPool(models=["m0", "m1"], affinity="none")
    models = {"m0": ScriptedModel([Turn.fail(ModelUnavailable("down"))], loop=True, name="m0"),
              "m1": ScriptedModel(["from m1"], loop=True, name="m1")}
    rt = pool_runtime(store, pool, models, retry={"max_attempts": 1})
    async with asyncio.timeout(LIMIT):
        result = await rt.run("agent", "hi")
        log = await logged(rt, result)
    assert result.termination.type == "natural_end"
    assert events_of(log, "RunStarted")[0].model == "m0"  # the pick stays recorded
    assert events_of(log, "InferenceCompleted")[0].model == "m1"  # the fallback answered
