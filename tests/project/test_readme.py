"""Every page a user reads shows code that works: README.md and every page of docs/.

Every ```python block of those pages is a complete script. Each one runs here exactly as a user
would run a pasted copy: saved to a file and started with this interpreter from the repo root
(the MCP example starts `tests/fakes/mcp_server.py` from there), against a real nats-server named by
`AGENTLOG_NATS_URL` (one for the module); the blocks that read `AGENTLOG_URL` additionally talk
to a real `agentlog serve` on that server. A script must exit 0, and every `# prints: TEXT`
comment in it is a claim about its output that is checked. A block that another test runs says
so right before it with `<!-- run-by: tests/project/test_quickstart.py -->` (the README's quickstart, which needs
its own app served): that file must exist and run it; a block that is intentionally a fragment
says `<!-- not-runnable: reason -->` and is skipped with that reason (there are none today, keep
it that way where possible). The declarative config examples (```yaml naming the config schema)
are loaded with `agentlog.runtime.config.load_config`. Shell blocks are not executed, but the
`agentlog` command lines in them are checked against the CLI's command tree (commands and
options exist).

"DESIGN 4.3" in code and docs means section 4.3 of docs/DESIGN.md (the design as built); the last
test checks that every such citation names a section that file has.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentlog.eventlog.embedded.server import EmbeddedNatsServer

from tests.support.docs import README, REPO, Block, all_blocks, blocks, page_name, pages

DESIGN = REPO / "docs" / "DESIGN.md"
#: Seconds a single example may take (they take 1-3 s; the bound only stops a hang).
SNIPPET_TIMEOUT = 90

@pytest.fixture(scope="module")
def providers_env() -> Iterator[dict[str, str]]:
    """The environment that points the provider SDKs at a local fake of the Anthropic, OpenAI
    Responses and Gemini APIs (their `*_BASE_URL` variables), which answers like a model using
    the examples' `add` tool: a call `add(2, 3)`, then the answer."""
    from tests.fakes.fake_providers import Answer, FakeProvidersThread

    def answer(request: Any) -> Answer:
        text = json.dumps(request.body)
        if any(marker in text for marker in ("tool_result", "function_call_output", "functionResponse")):
            return Answer(text="2 + 3 = 5", input_tokens=1200, cache_read=1000, output_tokens=8)
        return Answer(calls=[("add", {"a": 2, "b": 3})], input_tokens=1000, output_tokens=20)

    runner = FakeProvidersThread()
    with runner as fake:
        fake.responder = answer
        yield runner.env()


_NOT_RUNNABLE = re.compile(r"<!--\s*not-runnable:\s*(?P<reason>.*?)\s*-->\s*$")
_RUN_BY = re.compile(r"<!--\s*run-by:\s*(?P<test>\S+)\s*-->\s*$")
_PRINTS = re.compile(r"#\s*prints:\s*(?P<text>.+?)\s*$", re.M)


@dataclass(frozen=True)
class Snippet:
    """One ```python block of a page: where it is, its code, why it may not run here, and which
    test runs it instead."""

    page: str
    line: int
    heading: str
    code: str
    not_runnable: str | None
    run_by: str | None = None

    @property
    def id(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.heading.lower()).strip("-")
        return f"{self.page}:L{self.line}-{slug}"

    @property
    def expected_output(self) -> list[str]:
        return [m["text"] for m in _PRINTS.finditer(self.code)]

    @property
    def needs_gateway(self) -> bool:
        return "AGENTLOG_URL" in self.code

    @property
    def needs_providers(self) -> bool:
        """Examples on provider SDKs run against local fakes of their APIs (tests/fakes/fake_providers.py)."""
        return any(name in self.code for name in ("AnthropicModel", "GeminiModel", "OpenAIResponsesModel"))


def snippet_of(block: Block) -> Snippet:
    not_runnable, run_by = _NOT_RUNNABLE.search(block.before), _RUN_BY.search(block.before)
    return Snippet(page=page_name(block.page), line=block.line, heading=block.heading, code=block.code,
                   not_runnable=not_runnable["reason"] if not_runnable else None,
                   run_by=run_by["test"] if run_by else None)


def readme_snippets(text: str) -> list[Snippet]:
    """The ```python blocks of one page's text (README.md's name)."""
    return [snippet_of(b) for b in blocks(text) if b.lang == "python"]


ALL_SNIPPETS = [snippet_of(b) for b in all_blocks("python")]
#: The blocks run here; those with a `run-by` marker are run by the test it names.
SNIPPETS = [s for s in ALL_SNIPPETS if s.run_by is None]



def _child_env(**extra: str) -> dict[str, str]:
    """The user's environment, minus proxies (everything here is loopback), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(COLUMNS="200", NO_COLOR="1", **extra)
    return env


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = EmbeddedNatsServer(tmp_path_factory.mktemp("readme-nats"))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def gateway_url(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `agentlog serve` (default app: the demo's `deployer`) on the test's nats-server.
    Ready once its banner names its HTTP address (printed after the site is listening)."""
    agentlog = str(Path(sys.executable).parent / "agentlog")
    proc = subprocess.Popen(
        ["timeout", "300", agentlog, "serve", "--nats", nats_url, "--host", "127.0.0.1", "--port", "0",
         "--tokens", ""],
        cwd=tmp_path_factory.mktemp("readme-serve"), env=_child_env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    found: list[str] = []
    ready = threading.Event()

    def read_banner_then_drain() -> None:  # a thread: a blocking readline cannot be given a timeout
        assert proc.stdout is not None
        for line in proc.stdout:
            m = re.search(r"HTTP\s+│\s+(http://127\.0\.0\.1:\d+)", line)
            if m and not found:
                found.append(m.group(1))
                ready.set()
        ready.set()  # exited without a banner

    threading.Thread(target=read_banner_then_drain, daemon=True).start()
    try:
        assert ready.wait(60) and found, f"agentlog serve printed no HTTP address (exit {proc.poll()})"
        yield found[0]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_pages_have_python_examples() -> None:
    assert len(SNIPPETS) >= 15 and all(s.not_runnable is None or s.not_runnable for s in SNIPPETS)
    assert {s.page for s in SNIPPETS} > {"docs/getting-started.md", "docs/guides/tools.md"}
    assert {s.page for s in ALL_SNIPPETS} > {"README.md", "docs/getting-started.md"}


def test_blocks_run_elsewhere_are_run_there() -> None:
    """A `run-by` marker names a test file that exists and reads the page the block is on."""
    marked = [s for s in ALL_SNIPPETS if s.run_by is not None]
    assert marked, "the README's quickstart blocks are run by their own test"
    for snippet in marked:
        test = REPO / snippet.run_by
        assert test.is_file(), f"{snippet.id}: {snippet.run_by} does not exist"
        assert Path(snippet.page).name in test.read_text(), f"{snippet.run_by} does not read {snippet.page}"


def test_blocks_are_found_with_heading_marker_and_output_claims() -> None:
    text = ("# Top\n\n## Part one\n\n```python\nprint(1)  # prints: 1\n```\n\n```bash\nls\n```\n\n"
            "### Part two\n<!-- not-runnable: needs a GPU -->\n```python\nrun()\n```\n"
            "<!-- run-by: tests/project/test_quickstart.py -->\n```python\nserve()\n```\n")
    first, second, third = readme_snippets(text)
    assert (first.line, first.heading, first.not_runnable, first.expected_output) == (5, "Part one", None, ["1"])
    assert (second.line, second.heading, second.not_runnable, second.code) == (15, "Part two", "needs a GPU", "run()\n")
    assert (third.run_by, third.not_runnable) == ("tests/project/test_quickstart.py", None)
    assert first.id == "README.md:L5-part-one" and not first.needs_gateway


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.id for s in SNIPPETS])
def test_readme_python_block_runs_as_pasted(snippet: Snippet, nats_url: str, request: pytest.FixtureRequest,
                                            tmp_path: Path) -> None:
    if snippet.not_runnable is not None:
        pytest.skip(f"{snippet.page} line {snippet.line} is marked not-runnable: {snippet.not_runnable}")
    extra = {"AGENTLOG_NATS_URL": nats_url}
    if snippet.needs_gateway:
        extra["AGENTLOG_URL"] = request.getfixturevalue("gateway_url")
    if snippet.needs_providers:
        extra.update(request.getfixturevalue("providers_env"))
    script = tmp_path / "example.py"
    script.write_text(snippet.code)
    done = subprocess.run([sys.executable, str(script)], cwd=REPO, env=_child_env(**extra), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=SNIPPET_TIMEOUT)
    where = f"{snippet.page} line {snippet.line} ({snippet.heading})"
    assert done.returncode == 0, f"{where} exited {done.returncode}:\n{done.stderr[-3000:]}"
    for text in snippet.expected_output:
        assert text in done.stdout, f"{where} should print {text!r}; it printed:\n{done.stdout[-3000:]}"


def test_agent_config_example_loads(tmp_path: Path) -> None:
    """The declarative config example is a valid file: `load_config` builds it (its MCP server
    from the repo root, its OpenAI model given the key variable it names)."""
    [config] = [b.code for b in all_blocks("yaml") if "agentlog-config.schema.json" in b.code]
    path = tmp_path / "agents.yaml"
    path.write_text(config)
    check = ("import sys; from agentlog.runtime.config import load_config; app = load_config(sys.argv[1]); "
             "print(*[a.id for a in app.agents]); print(*app.agents[0].tools); app.close()")
    done = subprocess.run([sys.executable, "-c", check, str(path)], cwd=REPO, stdin=subprocess.DEVNULL,
                          env=_child_env(OPENAI_API_KEY="sk-not-used"), capture_output=True, text=True,
                          timeout=SNIPPET_TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    agents, tools = done.stdout.splitlines()
    assert agents == "assistant researcher"
    assert {"add", "mcp__calc__add", "agent_run"} <= set(tools.split())


def test_every_yaml_block_is_a_config_file_that_loads(tmp_path: Path) -> None:
    """Every ```yaml block of the pages is an agent config file `load_config` accepts (the
    providers' keys given, none used: nothing is sent to a model)."""
    configs = all_blocks("yaml")
    assert len(configs) >= 2
    paths = []
    for n, block in enumerate(configs):
        paths.append(tmp_path / f"config-{n}.yaml")
        paths[-1].write_text(block.code)
    # one process loads them all, each on its own: a file that fails is reported by its index
    check = ("import sys, traceback\nfrom agentlog.runtime.config import load_config\n"
             "for n, path in enumerate(sys.argv[1:]):\n"
             "    try:\n        load_config(path).close()\n"
             "    except Exception:\n        print(f'failed {n}', file=sys.stderr); traceback.print_exc()\n")
    done = subprocess.run([sys.executable, "-c", check, *map(str, paths)], cwd=REPO, stdin=subprocess.DEVNULL,
                          env=_child_env(OPENAI_API_KEY="sk-not-used", ANTHROPIC_API_KEY="not-used",
                                         GEMINI_API_KEY="not-used"),
                          capture_output=True, text=True, timeout=SNIPPET_TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    failed = [configs[int(n)] for n in re.findall(r"^failed (\d+)$", done.stderr, re.M)]
    assert not failed, [f"{page_name(b.page)} line {b.line}" for b in failed] + [done.stderr[-3000:]]


def test_agentlog_command_lines_use_real_commands_and_flags() -> None:
    """Shell blocks of every page are not run, but every `agentlog ...` line in them names a real
    command and only options that command has (checked against the CLI's own command tree, in
    process)."""
    import typer

    from agentlog.cli.core import app

    root = typer.main.get_command(app)
    root_ctx = root.make_context("agentlog", [], resilient_parsing=True)
    checked = []
    for block in all_blocks():
        if block.lang not in ("bash", "sh", ""):
            continue
        for line in block.code.splitlines():
            m = re.match(r"\s*(?:[A-Z_]+=\S+\s+)*agentlog\s+(?P<rest>.*)", line.split("#", 1)[0])
            if not m:
                continue
            words, command, ctx, path = m["rest"].split(), root, root_ctx, []
            while words and isinstance(command, typer.core.TyperGroup):
                sub = command.get_command(ctx, words[0])
                if sub is None:
                    break
                path.append(words.pop(0))
                command, ctx = sub, sub.make_context(path[-1], [], parent=ctx, resilient_parsing=True)
            known = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
            flags = re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", " ".join(words))
            where = page_name(block.page)
            assert path and set(flags) <= known, f"{where}: {line.strip()!r}: unknown {sorted(set(flags) - known)}"
            checked.append(" ".join(path))
    assert {"events tail", "replay", "run start", "run approve", "gateway", "dev", "serve"} <= set(checked)


def test_design_citations_name_sections_of_docs_design() -> None:
    """The code and the docs cite the design as `DESIGN <section>`; it lives in docs/DESIGN.md and
    opens by pointing at the decision records."""
    assert DESIGN.is_file(), "docs/DESIGN.md is missing"
    design = DESIGN.read_text()
    assert design.startswith("> ") and "](design/index.md)" in design.splitlines()[0]
    sections = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.?\s", design, re.M))
    assert {"1", "2.1", "2.2", "3", "4.3", "5.3", "6"} <= sections
    sources = [*pages(), *(p for d in ("src", "scripts", "tests")
                           for p in sorted((REPO / d).rglob("*.py")))]
    cited: dict[str, list[str]] = {}
    for path in sources:
        for section in re.findall(r"\bDESIGN (\d+(?:\.\d+)?)", path.read_text()):
            cited.setdefault(section, []).append(str(path.relative_to(REPO)))
    assert cited and not {s: where for s, where in cited.items() if s not in sections}
    readme = README.read_text()
    assert "](docs/DESIGN.md)" in readme
    # every mention of the file by name points at the copy in the repo
    assert not re.findall(r"(?<!docs/)\bDESIGN\.md", readme)
