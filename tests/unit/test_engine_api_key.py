"""spec.engine.apiKeySecret: engines that require an API key, and every
caller of them that sends it.

- the leader's engine gets the key as VLLM_API_KEY from the Secret, never in
  its arguments, the ConfigMap or the pod spec's text;
- the router pod has the Secret mounted and is given the file's path on its
  command line (`--engine-key-file`), as the clients' keys' file;
- `--api-key` in extraArgs, in any spelling vLLM reads, is refused at
  admission naming spec.engine.apiKeySecret (the Python twin of the CEL rule);
- the operator's engine client sends `Authorization: Bearer <key>` when keyed.
"""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest

from shoal.api.flags import managed_pattern, refused_args
from shoal.api.validation import validate_cluster
from shoal.engine.client import EngineClient
from tests.unit.controller_samples import fleet_of, spec_of
from tests.unit.test_api_models import manifest

SECRET = {"name": "engine-keys", "key": "api-key"}


def test_the_engine_reads_its_key_from_the_secret_as_vllm_api_key_not_from_its_arguments() -> None:
    fleet = fleet_of(spec_of(engine={"maxModelLen": 8192, "apiKeySecret": SECRET}))
    leader = fleet.replicas[0].manifests[0]
    container = leader["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["VLLM_API_KEY"] == {
        "name": "VLLM_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "engine-keys", "key": "api-key"}},
    }
    assert not any("api-key" in arg or "api_key" in arg for arg in container["args"])


def test_without_a_secret_engines_get_no_key_and_routers_no_key_file() -> None:
    fleet = fleet_of(spec_of())
    container = fleet.replicas[0].manifests[0]["spec"]["template"]["spec"]["containers"][0]
    assert "VLLM_API_KEY" not in {e["name"] for e in container.get("env", [])}
    configmap = next(m for m in fleet.static if m["kind"] == "ConfigMap")
    assert json.loads(configmap["data"]["router.json"])["engineKeyFile"] is None
    router_pod = fleet.after[0]["spec"]["template"]["spec"]
    assert "engine-key" not in {v["name"] for v in router_pod["volumes"]}
    assert "--engine-key-file" not in router_pod["containers"][0]["args"]


def test_the_router_pod_mounts_the_engine_key_and_is_told_the_files_path() -> None:
    fleet = fleet_of(spec_of(engine={"maxModelLen": 8192, "apiKeySecret": SECRET}))
    configmap = next(m for m in fleet.static if m["kind"] == "ConfigMap")
    # As the clients' keys: the path on the command line, nothing in the ConfigMap.
    assert json.loads(configmap["data"]["router.json"])["engineKeyFile"] is None
    router_pod = fleet.after[0]["spec"]["template"]["spec"]
    args = router_pod["containers"][0]["args"]
    assert args[args.index("--engine-key-file") + 1] == "/etc/shoal/engine-key/api-key"
    assert {"name": "engine-key", "secret": {"secretName": "engine-keys"}} in router_pod["volumes"]
    mounts = router_pod["containers"][0]["volumeMounts"]
    assert {"name": "engine-key", "mountPath": "/etc/shoal/engine-key", "readOnly": True} in mounts
    # The clients' keys stay separate: no --api-key-file without spec.router.apiKeySecret.
    assert "--api-key-file" not in router_pod["containers"][0]["args"]


@pytest.mark.parametrize(
    "args",
    [
        ["--api-key", "sk-1"],
        ["--api-key=sk-1"],
        ["--api_key", "sk-1"],
        ["--api-k", "sk-1"],
        ["--enforce-eager", "--api-key", "sk-1"],
    ],
)
def test_an_api_key_in_extra_args_is_refused_naming_the_secret_field(args: list[str]) -> None:
    [refused] = refused_args(args)
    assert refused.setting == "api_key"
    assert "spec.engine.apiKeySecret" in str(refused)
    assert re.match(managed_pattern(), refused.arg.replace("_", "-"))
    errors = validate_cluster(manifest(engine={"extraArgs": args}))
    assert [e.field for e in errors] == ["spec.engine.extraArgs"]
    assert "spec.engine.apiKeySecret" in errors[0].message


def test_a_keyed_engine_client_sends_the_key_and_a_plain_one_sends_none() -> None:
    seen: list[str | None] = []

    def engine(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("Authorization"))
        return httpx.Response(200, json={"data": [{"id": "tiny"}]})

    async def run() -> None:
        async with EngineClient(http=httpx.AsyncClient(transport=httpx.MockTransport(engine))) as c:
            assert await c.with_key("sk-engine").models("http://e") == ["tiny"]
            assert await c.models("http://e") == ["tiny"]
            assert await c.with_key(None).models("http://e") == ["tiny"]

    asyncio.run(run())
    assert seen == ["Bearer sk-engine", None, None]
