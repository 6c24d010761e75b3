"""The benchmark scripts that measure resume cost, reliability and end-to-end latency keep their
contract: `--quick` runs, the last line is one JSON object with the figures they are judged by, and
the chaos sections lose and duplicate nothing. Figures of speed are never asserted here (benchmarks
print ratios; tests do not time things); the cluster section has its own test
(tests/eventlog/test_replicas.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.early  # many seconds: started first (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]


def last_json(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The last line of the script's output, as JSON; `env` is added to its environment (and its
    children's)."""
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "COLUMNS": "160", "NO_COLOR": "1", **(env or {})},
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_bench_resume_quick_prints_its_resume_ratios() -> None:
    doc = last_json("scripts/bench_resume.py", "--quick", "--rounds", "2", "--per-round", "2",
                    "--long", "12")  # the contract only: a long history of 12 cycles, not 222
    assert doc["bench"] == "resume" and doc["quick"] is True and doc["samples"] == 4
    for key in ("short_p50_ms", "long_p50_ms", "long_over_short", "long_vs_fold", "result_230_over_2",
                "snapshots_cold_long_over_short", "long_over_short_paired"):
        assert isinstance(doc[key], (int, float)) and doc[key] > 0, (key, doc)
    assert doc["long_cycles"] == 12 and doc["short_cycles"] == 2  # real approval cycles in one run
    assert doc["long_messages"] > doc["short_messages"]


def test_bench_reliability_quick_poison_and_disk_recover_without_a_restart() -> None:
    # the disk section's POSTs while the log is full are answered `queued` after twice the
    # gateway's dispatch timeout: 3 s instead of 10 s each
    doc = last_json("scripts/bench_reliability.py", "--quick", "--only", "poison,disk", "--runs", "5",
                    env={"AGENTLOG_DISPATCH_TIMEOUT": "3"})
    assert doc["sections"] == ["poison", "disk"] and doc["failed_sections"] == [], doc
    assert (doc["poison_runs"], doc["poison_finished"], doc["poison_lost"]) == (10, 10, 0), doc
    assert doc["poison_quarantined"] == doc["poison_poisoned"] == 10, doc
    assert doc["poison_messages_ok"] == doc["poison_threads"] == 5 and doc["poison_listings_ok"], doc
    assert doc["poison_healthy"] and not doc["poison_restarted"], doc
    assert doc["disk_lost"] == 0 and doc["disk_failed"] == 0 and doc["disk_duplicated_commits"] == 0, doc
    assert doc["disk_degraded_seen"] and doc["disk_healthy_after"] and not doc["disk_restarted"], doc
    assert doc["disk_after_accepted"] == 5, doc


def test_bench_reliability_quick_sections_lose_nothing() -> None:
    doc = last_json("scripts/bench_reliability.py", "--quick", "--only", "crash,outage,list", "--runs", "5",
                    "--list-sizes", "1000,2000")  # the listing's figures, not its scale: 2k runs, not 20k
    assert doc["bench"] == "reliability" and doc["sections"] == ["crash", "outage", "list"]
    assert doc["failed_sections"] == [], doc
    for section in ("crash", "outage"):
        assert doc[f"{section}_runs"] == 5
        assert doc[f"{section}_finished"] == 5, doc
        for bad in ("failed", "lost", "duplicated_commits", "duplicated_completions"):
            assert doc[f"{section}_{bad}"] == 0, (section, bad, doc)
    for key in ("list_p50_ms_1k", "list_p50_ms_2k", "list_ratio_2k", "list_tenant_ratio_2k"):
        assert isinstance(doc[key], (int, float)) and doc[key] > 0, (key, doc)


def test_bench_e2e_quick_prints_the_figures_of_both_topologies() -> None:
    """Real `agentlog serve` and `agentlog gateway` + `agentlog worker` processes; a few cycles
    only (the contract: the figures and the follow-hang count; `--quick` alone runs 500+ follows)."""
    doc = last_json("scripts/bench_e2e.py", "--quick", "--long", "3", "--short-runs", "1", "--long-samples", "2")
    assert doc["bench"] == "e2e" and doc["quick"] is True and doc["long_cycles"] == 3 and doc["short_cycles"] == 2
    for key in ("serve_long_over_short", "split_long_over_short", "serve_long_p50_ms", "serve_short_p50_ms",
                "split_long_p50_ms", "split_short_p50_ms"):
        assert isinstance(doc[key], (int, float)) and doc[key] > 0, (key, doc)
    # every cycle's follow is counted (1 start + 3 cycles of the short run, 1 + 3 + 2 of the long one)
    assert doc["follows"] >= 2 * (4 + 6), doc
    assert doc["follow_hangs"] == 0 and doc["follow_hangs_paused"] == 0, doc


def test_bench_peers_runs_agentlogs_legs_without_the_peers_installed() -> None:
    """The suite's venv has no LangGraph (the `bench` extra has a venv of its own): every
    agentlog leg runs, every peer figure is null, and the machine is described."""
    doc = last_json("scripts/bench_peers.py", "--quick", "--no-peers", "--pairs", "1", "--long", "3",
                    "--sse-events", "20")
    assert doc["bench"] == "peers" and doc["peers"] is False and doc["sections"] == ["loop", "resume", "approval", "sse"]
    for key in ("loop_agentlog_steps_s", "resume_short_agentlog_ms", "resume_long_agentlog_ms", "approval_serve_ms",
                "approval_split_ms", "sse_catchup_20_ms"):
        assert isinstance(doc[key], (int, float)) and doc[key] > 0, (key, doc)
    for key in ("loop_langgraph_steps_s", "resume_short_langgraph_ms", "resume_long_langgraph_ms", "approval_langgraph_ms"):
        assert doc[key] is None, (key, doc)
    assert doc["resume_short_messages"] == 6 and doc["resume_long_messages"] == 2 * 3 + 2
    assert doc["machine"]["cores"] and "load_avg_1m_at_start" in doc["machine"]
