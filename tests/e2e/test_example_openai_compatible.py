"""`examples/openai_compatible/`, run as its README says: the README's own command lines, in a
copy of the folder, with `OPENAI_BASE_URL` naming a local fake of the Chat Completions API
(tests/fake_openai.py) and no `OPENAI_API_KEY` (a local server takes none). As `agentlog serve`,
and as `agentlog gateway` + `agentlog worker`: the run calls the tool and ends with the model's
answer, and every request went to the fake, for the model `OPENAI_MODEL` names.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.fakes.fake_openai import FakeOpenAI, Reply
from tests.support.examples import Processes, clean_env, readme_commands, run, with_port_0, with_url

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "openai_compatible"
COMMANDS = readme_commands(EXAMPLE / "README.md")

pytestmark = pytest.mark.timeout(180)


def test_the_readme_shows_both_topologies_and_a_run() -> None:
    assert COMMANDS["serve"] == ["agentlog", "serve", "--app", "app:app"]
    assert COMMANDS["gateway"] == ["agentlog", "gateway", "--app", "app:app"]
    assert COMMANDS["worker"] == ["agentlog", "worker", "--app", "app:app"]
    assert COMMANDS["run start"][:3] == ["agentlog", "run", "start"] and "--follow" in COMMANDS["run start"]


@pytest.mark.parametrize("topology", ["serve", "split"])
async def test_the_example_runs_on_an_openai_compatible_server(tmp_path: Path, topology: str) -> None:
    site = tmp_path / "openai_compatible"
    shutil.copytree(EXAMPLE, site)
    async with FakeOpenAI() as fake, Processes(tmp_path) as procs:
        fake.script(Reply.tool_calls([("call_1", "multiply", json.dumps({"a": 12.5, "b": 8}))]),
                    Reply.text("12.5 times 8 is 100."))
        env = clean_env(OPENAI_BASE_URL=fake.url, OPENAI_MODEL="local-test-model")
        if topology == "serve":
            url = await procs.http_url(await procs.start(with_port_0(COMMANDS["serve"]), cwd=site, env=env))
        else:
            gateway = await procs.start(with_port_0(COMMANDS["gateway"]), cwd=site, env=env)
            worker = await procs.start(COMMANDS["worker"], cwd=site, env=env)
            url = await procs.http_url(gateway)
            await procs.banner(worker)
        code, out, err = await run(with_url(COMMANDS["run start"], url), cwd=tmp_path, env=env)
        assert code == 0, out + err + procs.errors()
    assert "multiply succeeded: 100.0" in out, out
    assert "12.5 times 8 is 100." in out and "natural_end" in out, out
    assert [r.model for r in fake.requests] == ["local-test-model"] * 2
    assert all(r.path == "/v1/chat/completions" and "authorization" not in {h.lower() for h in r.headers}
               for r in fake.requests)
    [tool] = fake.requests[0].body["tools"]
    assert tool["function"]["name"] == "multiply"
