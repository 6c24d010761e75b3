"""Skills (`agentlog.runtime.toolkits.skills`): SKILL.md parsing, the catalog, the safe file reads, the
plugin's listing and the `load_skill` / `read_skill_file` tools on a real JetStream store with
replay, and the config file's `skills`. Through real processes: tests/e2e/test_handoff_skills_deployed.py."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from agentlog.eventlog.events import ToolCallCompleted
from agentlog.runtime import AgentSpec, DeterministicEntropy, Runtime
from agentlog.runtime.config import ConfigError, load_config
from agentlog.runtime.models import ScriptedModel, Turn
from agentlog.runtime.replay.verify import verify_run
from agentlog.runtime.toolkits.skills import (
    InvalidSkill,
    SkillCatalog,
    SkillFileNotFound,
    SkillFileNotText,
    SkillFileTooLarge,
    SkillNotFound,
    SkillPathInvalid,
    SkillsPlugin,
    parse_skill_md,
    skill_tools,
)
from agentlog.testing import RecordingModel

from tests.support.runtime import logged, store  # noqa: F401  (fixture)

REFUNDS = """\
---
name: refunds
description: How to refund an order. Use for any refund request.
---
# Refunds

1. Look the order up.
2. Follow policy.md.
"""


def make_skills(root: Path) -> Path:
    """A catalog folder: `refunds` (with files) and `greeting` (SKILL.md only)."""
    (root / "refunds" / "templates").mkdir(parents=True)
    (root / "refunds" / "SKILL.md").write_text(REFUNDS)
    (root / "refunds" / "policy.md").write_text("Refund within 30 days.\n")
    (root / "refunds" / "templates" / "mail.txt").write_text("Dear customer,\n")
    (root / "refunds" / "logo.bin").write_bytes(b"\xff\xfe\x00\x81")
    (root / "greeting").mkdir()
    (root / "greeting" / "SKILL.md").write_text("---\nname: greeting\ndescription: Greet people.\n---\nSay hi.\n")
    (root / "not-a-skill").mkdir()
    return root


def test_skill_md_front_matter_parsing() -> None:
    meta, body = parse_skill_md(REFUNDS)
    assert meta["name"] == "refunds" and meta["description"].startswith("How to refund")
    assert body.startswith("# Refunds") and body.endswith("policy.md.")
    for bad in ["no front matter", "---\nname: x\n", "---\n[1, 2]\n---\n", "---\nname: Bad Name\ndescription: d\n---\n",
                "---\nname: ok\n---\nbody", "---\nname: ok\ndescription: ''\n---\n", "---\nname: [\n---\n"]:
        with pytest.raises(InvalidSkill):
            parse_skill_md(bad, "x/SKILL.md")


def test_skill_catalog_loads_folders_and_selects_by_glob(tmp_path: Path) -> None:
    root = make_skills(tmp_path / "skills")
    catalog = SkillCatalog.load(root)
    assert catalog.names() == ["greeting", "refunds"]
    refunds = catalog.get("refunds")
    assert refunds.files == ("logo.bin", "policy.md", "templates/mail.txt")
    assert SkillCatalog.load(root / "greeting").names() == ["greeting"]  # a folder that is one skill
    assert catalog.select(["ref*"]) == ["refunds"] and catalog.select(["*"]) == ["greeting", "refunds"]
    with pytest.raises(SkillNotFound):
        catalog.select(["nope*"])
    with pytest.raises(SkillNotFound):
        catalog.get("nope")
    with pytest.raises(InvalidSkill, match="two skills"):
        SkillCatalog.load(root, root / "refunds")
    with pytest.raises(InvalidSkill, match="not a folder"):
        SkillCatalog.load(tmp_path / "missing")
    listing = SkillsPlugin(catalog, ["refunds"]).text
    assert "- refunds: How to refund an order." in listing and "greeting" not in listing


def test_read_skill_file_refuses_path_traversal_large_and_binary_files(tmp_path: Path) -> None:
    root = make_skills(tmp_path / "skills")
    (tmp_path / "secret.txt").write_text("do not read")
    os.symlink(tmp_path / "secret.txt", root / "refunds" / "escape.md")
    catalog = SkillCatalog.load(root)
    assert "escape.md" not in catalog.get("refunds").files  # listed: only what a read returns
    assert catalog.read_file("refunds", "policy.md") == "Refund within 30 days.\n"
    assert catalog.read_file("refunds", "./templates/mail.txt") == "Dear customer,\n"
    for path in ["../greeting/SKILL.md", "/etc/passwd", "templates/../../secret.txt", "escape.md", "", "C:/x",
                 "..\\..\\secret.txt"]:
        with pytest.raises(SkillPathInvalid):
            catalog.read_file("refunds", path)
    with pytest.raises(SkillFileNotFound):
        catalog.read_file("refunds", "nope.md")
    with pytest.raises(SkillFileNotFound):
        catalog.read_file("refunds", "templates")  # a folder is not a file
    with pytest.raises(SkillFileTooLarge):
        catalog.read_file("refunds", "policy.md", max_bytes=4)
    with pytest.raises(SkillFileNotText):
        catalog.read_file("refunds", "logo.bin")


async def test_skill_tools_load_and_read_recorded_and_replayed(store: Any, tmp_path: Path) -> None:
    """The model sees the listing, loads a skill and reads one of its files; a bad read is a
    failed call with a typed code; an agent without the skill cannot load it. Every result is a
    recorded tool result: replay verifies the run even after the folder changed."""
    root = make_skills(tmp_path / "skills")
    catalog = SkillCatalog.load(root)
    recorder = RecordingModel(ScriptedModel([
        Turn.tools(("load_skill", {"name": "refunds"}), ("read_skill_file", {"name": "refunds", "path": "policy.md"})),
        Turn.tools(("read_skill_file", {"name": "refunds", "path": "../greeting/SKILL.md"}),
                   ("load_skill", {"name": "greeting"})),
        "refunded per policy",
    ], name="m"))
    tools = skill_tools(catalog, {"clerk": ["refunds"]})
    agent = AgentSpec(id="clerk", model=recorder, tools=[t.name for t in tools],
                      plugins=[SkillsPlugin(catalog, ["refunds"])], system_prompt="You are a clerk.")
    rt = Runtime(store, agents=[agent], tools=tools, entropy=DeterministicEntropy(prefix=f"s{uuid.uuid4().hex[:8]}"))
    async with asyncio.timeout(20):
        result = await rt.run("clerk", "refund order 1")
    assert result.termination.type == "natural_end"
    system = recorder.requests[0].messages[0].content
    assert system.startswith("You are a clerk.") and "- refunds: How to refund an order." in system
    assert "greeting" not in system
    done = [e for sc in await logged(rt, result) for e in sc.commit.events if isinstance(e, ToolCallCompleted)]
    assert [e.outcome for e in done] == ["succeeded", "succeeded", "failed", "failed"]
    assert done[0].result.startswith("# Refunds") and "- templates/mail.txt" in done[0].result
    assert done[1].result == "Refund within 30 days.\n"
    assert done[2].result["value"] == {"code": "skill_path_invalid"}
    assert done[3].result["value"] == {"code": "skill_not_found"}
    (root / "refunds" / "policy.md").write_text("changed since")
    report = await verify_run(store, result.run_id, rt)
    assert report.ok and report.inferences == 3


CONFIG = """\
version: 1
models:
  m: {type: scripted, script: ["hi"]}
skills: [skills]
agents:
  - id: clerk
    model: m
    skills: ["ref*"]
  - id: plain
    model: m
"""


def test_skills_declared_in_the_config_file(tmp_path: Path) -> None:
    """`skills:` folders are read relative to the file; an agent's `skills` (names or globs)
    give it the listing plugin and the two tools; typos and missing folders are config errors."""
    make_skills(tmp_path / "skills")
    path = tmp_path / "app.yaml"
    path.write_text(CONFIG)
    loaded = load_config(path)
    clerk, plain = loaded.agents
    assert clerk.tools == ["load_skill", "read_skill_file"] and plain.tools == []
    plugin = next(p for p in clerk.plugins if isinstance(p, SkillsPlugin))
    assert "refunds" in plugin.text and "greeting" not in plugin.text
    assert not any(isinstance(p, SkillsPlugin) for p in plain.plugins)
    for text, match in [
        (CONFIG.replace('"ref*"', '"nope"'), "no skill matches"),
        (CONFIG.replace("skills: [skills]", "skills: [missing]"), "not a folder"),
        (CONFIG.replace("skills: [skills]\n", ""), "declares no `skills` folders"),
    ]:
        path.write_text(text)
        with pytest.raises(ConfigError, match=match):
            load_config(path)
