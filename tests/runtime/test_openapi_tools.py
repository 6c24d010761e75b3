"""OpenAPI operations as tools (agentlog.runtime.toolkits.openapi) against a local pet-store API
(tests/fakes/fake_openapi.py): the document from a URL or a file, JSON Schema parameters from it,
calls made over HTTP, results and HTTP errors as tool results with their status in `details`,
auth headers from the environment, the config file's `openapi` section; a run using them replays
from the log without calling the API again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentlog.eventlog.memory import MemoryEventStore
from agentlog.runtime import AgentSpec, DeterministicEntropy, Runtime
from agentlog.runtime.config import ConfigError, build, parse_config
from agentlog.runtime.models import ScriptedModel, Turn
from agentlog.runtime.replay.verify import verify_run
from agentlog.runtime.toolkits.openapi import OpenApiConfig, OpenApiError, load_openapi_tools
from agentlog.runtime.tools import InvalidToolArguments, ToolContext

from tests.fakes.fake_openapi import DOCUMENT, TOKEN, FakePetStore


@pytest.fixture
def api() -> Any:
    # in a thread of its own: loading a document by URL blocks (config files load synchronously)
    with FakePetStore().in_thread() as store:
        yield store


def ctx() -> ToolContext:
    return ToolContext(thread_id="t", run_id="r", call_id="c", agent_id="a", tool_name="x", state={})


def tools_of(api: FakePetStore, **config: Any) -> dict[str, Any]:
    return {t.name: t for t in load_openapi_tools(OpenApiConfig(name="pets", spec=api.spec_url, **config))}


async def test_openapi_tools_from_a_url_have_the_documents_schemas(api: FakePetStore) -> None:
    tools = tools_of(api)
    assert sorted(tools) == ["pets__createPet", "pets__delete_pets_petId", "pets__getPet", "pets__listPets",
                             "pets__petCount"]
    get = tools["pets__getPet"]
    assert get.description == "One pet\n\nBy id." and get.category == "openapi:pets"
    assert get.parameters == {"type": "object", "properties": {"petId": {"type": "integer"}},
                              "additionalProperties": False, "required": ["petId"]}
    create = tools["pets__createPet"].parameters
    assert create["required"] == ["body"] and create["properties"]["body"]["required"] == ["name"]  # $ref resolved
    assert tools["pets__listPets"].parameters["properties"]["tag"]["description"] == "only this tag"
    assert get.base_url == f"{api.url}/api"  # the relative server URL, against the document's URL


async def test_openapi_tool_calls_answer_json_text_and_http_errors(api: FakePetStore) -> None:
    tools = tools_of(api)
    found = await tools["pets__getPet"].invoke({"petId": 2}, ctx())
    assert found.status == "success" and found.value == {"id": 2, "name": "Tom", "tag": "cat"}
    assert found.details == {"method": "GET", "url": f"{api.url}/api/pets/2", "status": 200}
    listed = await tools["pets__listPets"].invoke({"limit": 1, "tag": "cat"}, ctx())
    assert listed.value == [{"id": 2, "name": "Tom", "tag": "cat"}]
    assert api.requests[-1]["query"] == {"limit": "1", "tag": "cat"}
    missing = await tools["pets__getPet"].invoke({"petId": 9}, ctx())
    assert missing.status == "error" and missing.error == 'HTTP 404: {"error": "no such pet"}'
    assert missing.details["status"] == 404
    text = await tools["pets__petCount"].invoke({}, ctx())
    assert text.value == "2 pets"
    with pytest.raises(InvalidToolArguments, match="petId"):
        tools["pets__getPet"].validate({"petId": "two"})


async def test_openapi_tool_auth_headers_come_from_the_environment(api: FakePetStore, monkeypatch: Any) -> None:
    refused = await tools_of(api)["pets__createPet"].invoke({"body": {"name": "Kit"}}, ctx())
    assert refused.status == "error" and refused.details["status"] == 401
    monkeypatch.setenv("PETS_TOKEN", TOKEN)
    created = await tools_of(api, bearer_token_env="PETS_TOKEN")["pets__createPet"].invoke(
        {"body": {"name": "Kit", "tag": "cat"}}, ctx())
    assert created.status == "success" and created.value == {"id": 3, "name": "Kit", "tag": "cat"}
    assert api.requests[-1]["authorization"] == f"Bearer {TOKEN}" and api.requests[-1]["body"]["name"] == "Kit"
    monkeypatch.delenv("PETS_TOKEN")
    with pytest.raises(OpenApiError, match="PETS_TOKEN is not set"):
        tools_of(api, bearer_token_env="PETS_TOKEN")


async def test_openapi_tools_from_a_yaml_file_with_a_chosen_base_url(api: FakePetStore, tmp_path: Path) -> None:
    import yaml

    (tmp_path / "pets.yaml").write_text(yaml.safe_dump(DOCUMENT))
    config = OpenApiConfig(name="p", spec="pets.yaml", base_url=f"{api.url}/api", operations=["get*", "list*"])
    tools = {t.name: t for t in load_openapi_tools(config, tmp_path)}
    assert sorted(tools) == ["p__getPet", "p__listPets"]
    assert (await tools["p__getPet"].invoke({"petId": 1}, ctx())).value["name"] == "Rex"


@pytest.mark.parametrize("document, message", [
    ({"openapi": "3.0.0"}, "no `paths`"),
    ({"swagger": "2.0", "paths": {}}, "only OpenAPI 3"),
    ({"openapi": "3.1.0", "paths": {"/x": {"get": {}}}}, "names no server"),
    ({"openapi": "3.1.0", "servers": [{"url": "/v1"}], "paths": {}}, "is relative"),
])
def test_openapi_documents_that_cannot_be_used_are_typed_errors(tmp_path: Path, document: dict[str, Any],
                                                                message: str) -> None:
    (tmp_path / "d.json").write_text(json.dumps(document))
    with pytest.raises(OpenApiError, match=message):
        load_openapi_tools(OpenApiConfig(name="d", spec=str(tmp_path / "d.json")))


async def test_openapi_tools_in_a_run_replay_from_the_log(api: FakePetStore) -> None:
    tools = list(tools_of(api).values())
    model = ScriptedModel([Turn.tools(("pets__getPet", {"petId": 1}), ("pets__getPet", {"petId": 7})), "done"])
    spec = AgentSpec(id="a", model=model, tools=[t.name for t in tools])
    rt = Runtime(MemoryEventStore(), agents=[spec], tools=tools, entropy=DeterministicEntropy())
    result = await rt.run("a", "pets")
    statuses = sorted((c.status, c.details["status"]) for c in result.run.calls.values())
    assert statuses == [("failed", 404), ("succeeded", 200)]
    calls_before = len(api.requests)
    report = await verify_run(rt.store, result.run_id, rt)
    assert report.ok and report.tools_from_log == 2
    assert len(api.requests) == calls_before  # the replay called nothing


async def test_openapi_tools_from_the_config_file(api: FakePetStore, tmp_path: Path) -> None:
    text = f"""
models: {{m: {{type: scripted, script: [{{tool_calls: [{{name: pets__listPets, arguments: {{tag: dog}}}}]}}, done]}}}}
openapi: [{{name: pets, spec: "{api.spec_url}", operations: [listPets, getPet]}}]
agents: [{{id: a, model: m, tools: ["pets__*"]}}]
"""
    loaded = build(parse_config(text), base=tmp_path)
    (spec,) = loaded.agents
    assert spec.tools == ["pets__listPets", "pets__getPet"]
    result = await loaded.runtime(MemoryEventStore()).run("a", "dogs")
    (call,) = result.run.calls.values()
    assert call.result == [{"id": 1, "name": "Rex", "tag": "dog"}]
    with pytest.raises(ConfigError, match="openapi: cannot read"):
        build(parse_config(text.replace(api.spec_url, "missing.json")), base=tmp_path)
    with pytest.raises(ConfigError, match="duplicate OpenAPI names"):
        parse_config(text.replace("openapi: [{", "openapi: [{name: pets, spec: x}, {"))
