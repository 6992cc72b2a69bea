"""Generated VLLMClusters on the real API server, beside shoal's own judgement.

- Admission and `shoal plan` agree: a manifest the API server refuses, shoal
  refuses too, and every error shoal reports by a rule the API server also holds
  (the schema's or a CEL rule's) is in the API server's refusal, naming the same
  field.
- Nothing shoal would run is refused: every object it builds from a manifest
  both accept passes the API server's dry run, without a warning. Otherwise the
  cluster would be admitted, then its StatefulSet refused, naming a field of the
  StatefulSet rather than of the VLLMCluster.

Values are drawn valid for their field; in the first test, one pool of them may
also be hostile (a space, an uppercase letter, 64 characters in a label, a
resource in kubernetes.io, a short option vLLM reads as -tp), so both sides of
each rule get examples, one kind of mistake at a time. Kubernetes objects the
spec passes through whole (env, tolerations, affinity terms, security
contexts) are left out: the API server judges them in the pods, by design
(api.pods); volumes come in only with names and paths like shoal's own. What
the tests found is kept as explicit examples."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from shoal.api import GROUP, PLURAL, VERSION
from shoal.api.cel import RULES
from shoal.api.resource import VLLMCluster
from shoal.api.validation import MAX_NAME_LENGTH, validate_cluster
from shoal.controller.cache import build_cache_claim, build_download_job
from shoal.controller.desired import desired_fleet
from shoal.controller.identity import ClusterRef, Manifest
from shoal.planner.presets import PRESET_NAMES
from shoal_testbed.cluster import Testbed
from tests.e2e.kube import namespace
from tests.e2e.operator_env import install_crd

pytestmark = pytest.mark.e2e

# Rules the API server holds as well as shoal: the schema's, and those with a CEL twin.
ADMISSION_RULES = {rule.rule for rule in RULES} | {"schema"}
IMAGE = "ghcr.io/shoal-dev/shoal:test"
# What the API server adds to a refusal when a schema error kept it from its CEL rules.
SKIPPED_CEL = "some validation rules were not checked"


class Server:
    """The API server, called directly (kubectl would cost a process per call)."""

    def __init__(self, bed: Testbed, ns: str) -> None:
        self.api = config.new_client_from_config(config_file=str(bed.kubeconfig))
        self.dynamic = DynamicClient(self.api)
        self.ns = ns

    def refusal(self, manifest: Manifest) -> str | None:
        """Why a server-side dry run of the VLLMCluster is refused, or None."""
        try:
            client.CustomObjectsApi(self.api).create_namespaced_custom_object(
                GROUP, VERSION, self.ns, PLURAL, manifest, dry_run="All", field_validation="Strict"
            )
        except ApiException as error:
            return _message(error)
        return None

    def child_refusal(self, manifest: Manifest) -> str | None:
        """Why a dry run of an object shoal builds is refused, or the warnings it
        drew (what shoal writes should draw none: a repeated pull secret did)."""
        # The dynamic client sends the dict as it is; the typed one would refuse an
        # int quantity (cpu: 64) the API server accepts.
        kind = self.dynamic.resources.get(api_version=manifest["apiVersion"], kind=manifest["kind"])
        try:
            answer = kind.create(body=manifest, namespace=self.ns, dry_run="All", serialize=False)
        except ApiException as error:
            return _message(error)
        warnings = answer.headers.getlist("Warning")
        return "; ".join(warnings) if warnings else None


def _message(error: ApiException) -> str:
    return str(json.loads(error.body or "{}").get("message", error))


@pytest.fixture(scope="module")
def server(testbed: Testbed) -> Iterator[Server]:
    install_crd(testbed)
    with namespace(testbed, "gen") as ns:
        yield Server(testbed, ns)


@dataclass(frozen=True)
class Pool:
    """Values for a field: valid ones, and hostile ones."""

    valid: tuple[Any, ...]
    hostile: tuple[Any, ...]

    def values(self, hostile: bool) -> st.SearchStrategy[Any]:
        """A valid value, or (hostile) a valid or a hostile one."""
        return st.sampled_from(self.valid + self.hostile if hostile else self.valid)


OBJECT_NAMES = Pool(("hf-token", "models", "a.b-c", "x9"), ("Models", "a b", "-x", "a_b", ""))
DATA_KEYS = Pool(("token", "prompts.yaml", ".hidden", "KEY_1"), ("..x", ".", "a b", "a/b", ""))
LABEL_VALUES = Pool(("NVIDIA-H100-80GB-HBM3", "", "a.b_c"), ("a b", "-x", "x" * 64, "a/b"))
LABEL_KEYS = Pool(
    ("topology.kubernetes.io/zone", "rack", "example.com/a_b", "Team"),
    ("a b", "x/y/z", "-x", "x" * 64, "/x", "Example.com/x", ""),
)
RESOURCES = Pool(
    ("nvidia.com/gpu", "amd.com/gpu", "example.com/fpga_1"),
    ("gpu", "kubernetes.io/gpu", "requests.example.com/gpu", "Nvidia.com/gpu", "nvidia.com/"),
)
NODE_PATHS = Pool(("/var/lib/models", "/mnt/nvme/hf", "/a:b"), ("m", "/", "/var/../etc", "/x/.."))
MODEL_PATHS = Pool(("/", "llama-3.1-8b", "/org/model/", "a..b"), ("../x", "/a/../../b", ".."))
MODELS = Pool(
    (
        "meta-llama/Llama-3.1-8B-Instruct",
        "meta-llama/Llama-3.1-70B-Instruct",
        "Qwen/Qwen3-32B",
        "deepseek-ai/DeepSeek-R1",
        "acme/private-13b",
    ),
    # Spellings a preset is recognised by, or not, alike at admission and in shoal.
    (
        "META-LLAMA/LLAMA-3.1-70B-INSTRUCT",
        "/models/meta-llama/Llama-3.1-70B-Instruct/",
        "Llama-3.1-70B-Instruct",
        "meta-llama/Llama-3.1-70B-Instruct-FP8",
    ),
)
# A model's shape: a preset, with fields overriding it, or every field given (or
# not quite): the planner's rules and their CEL twins read heads from either.
_SHAPE = {
    "layers": st.sampled_from([1, 32, 61, 80, 126]),
    "queryHeads": st.sampled_from([1, 8, 12, 32, 64, 128]),
    "kvHeads": st.sampled_from([1, 2, 4, 8, 12]),
    "headSize": st.sampled_from([64, 128, 576]),
    "parameters": st.sampled_from([7 * 10**9, 70 * 10**9]),
}
_EXTRA = {
    "attention": st.sampled_from(["GQA", "MLA"]),
    "contextLength": st.sampled_from([4096, 131072]),
}
ARCHITECTURES = st.one_of(
    st.fixed_dictionaries({"preset": st.sampled_from(PRESET_NAMES)}, optional=_SHAPE | _EXTRA),
    st.fixed_dictionaries(_SHAPE, optional=_EXTRA),
    st.fixed_dictionaries({}, optional=_SHAPE | _EXTRA),
)
# extraArgs entries, each whole (an option with its value attached, or none).
EXTRA_ARGS = Pool(
    ("--enforce-eager", "-dpb=mp", "-dc={}", "-O3", "--seed=7", "-q=fp8", "-pcp=1"),
    ("-t", "-tp2", "-d=2", "-p", "--tensor-parallel=2", "--max_model_len=4096", "-dpa=x"),
)
CLUSTER_NAMES = Pool(
    ("gen", "g" * MAX_NAME_LENGTH, "a1-b2"),
    ("1gen", "Gen", "g" * (MAX_NAME_LENGTH + 1), "gen-", "g.en"),
)
IMAGES = Pool(
    ("vllm/vllm-openai:v0.32.0", "registry.local:5000/vllm@sha256:" + "0" * 64),
    (" vllm/vllm-openai", "vllm/vllm-openai:v0.32.0 ", "", "vllm/VLLM-openai", "vllm@sha256:0"),
)
POOLS = (
    OBJECT_NAMES,
    DATA_KEYS,
    LABEL_VALUES,
    LABEL_KEYS,
    RESOURCES,
    NODE_PATHS,
    MODEL_PATHS,
    CLUSTER_NAMES,
    IMAGES,
    EXTRA_ARGS,
    MODELS,
)
VOLUME_NAMES = ("scratch", "data", "tmp", "models", "model", "dshm", "hf-cache", "config")
MOUNT_PATHS = ("/scratch", "/data", "/tmp/x", "/models", "/dev/shm", "/etc/shoal/router")


def _maybe(draw: st.DrawFn, into: dict[str, Any], key: str, values: st.SearchStrategy[Any]) -> None:
    if draw(st.booleans()):
        into[key] = draw(values)


Pick = Callable[[Pool], st.SearchStrategy[Any]]


def _one(key: str, value: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({key: value})


def _labels(pick: Pick, values: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(pick(LABEL_KEYS), values, max_size=2)


def _pod(draw: st.DrawFn, pick: Pick, *, router: bool) -> dict[str, Any]:
    pod: dict[str, Any] = {}
    _maybe(draw, pod, "labels", _labels(pick, pick(LABEL_VALUES)))
    _maybe(draw, pod, "annotations", _labels(pick, st.just("v")))
    for key in ("serviceAccountName", "priorityClassName", "runtimeClassName"):
        _maybe(draw, pod, key, pick(OBJECT_NAMES))
    names = st.fixed_dictionaries({"name": pick(OBJECT_NAMES)})
    _maybe(draw, pod, "imagePullSecrets", st.lists(names, max_size=2))
    if router:
        _maybe(draw, pod, "nodeSelector", _labels(pick, pick(LABEL_VALUES)))
    # The user's own volumes, valid and mounted once each, but named or mounted where a
    # user might well choose to: as shoal's own are.
    volumes = draw(st.lists(st.sampled_from(VOLUME_NAMES), max_size=2, unique=True))
    volumes = volumes if draw(st.booleans()) else []
    paths = draw(st.lists(st.sampled_from(MOUNT_PATHS), min_size=len(volumes), unique=True))
    if volumes:
        pod["volumes"] = [{"name": name, "emptyDir": {}} for name in volumes]
        mounts = zip(volumes, paths, strict=False)
        pod["volumeMounts"] = [{"name": name, "mountPath": path} for name, path in mounts]
    return pod


@st.composite
def manifests(draw: st.DrawFn, hostile: bool) -> Manifest:
    """A manifest whose values are all valid, or (hostile) whose values of one pool
    may be hostile: one kind of mistake at a time, so that each is seen on its own."""
    target = draw(st.sampled_from(POOLS)) if hostile else None

    def pick(pool: Pool) -> st.SearchStrategy[Any]:
        return pool.values(pool is target)

    names, keys, labels = pick(OBJECT_NAMES), pick(DATA_KEYS), pick(LABEL_VALUES)
    secret = st.fixed_dictionaries({"name": names}, optional={"key": keys})
    model: dict[str, Any] = {"name": draw(pick(MODELS))}
    hub = st.fixed_dictionaries({}, optional={"tokenSecret": secret})
    claim = st.fixed_dictionaries({"claimName": names, "path": pick(MODEL_PATHS)})
    _maybe(draw, model, "source", st.one_of(_one("hf", hub), _one("pvc", claim)))
    shared = st.fixed_dictionaries({}, optional={"claimName": names, "storageClassName": names})
    node = st.fixed_dictionaries({"path": pick(NODE_PATHS)})
    _maybe(draw, model, "cache", st.one_of(_one("shared", shared), _one("node", node)))
    engine: dict[str, Any] = {"pod": _pod(draw, pick, router=False)}
    _maybe(draw, engine, "maxModelLen", st.sampled_from([4096, 131072, 200_000, 10**6]))
    _maybe(draw, engine, "apiKeySecret", secret)
    _maybe(draw, engine, "shmSize", st.sampled_from(["1Gi", "16Gi"]))
    _maybe(draw, engine, "extraArgs", st.lists(pick(EXTRA_ARGS), max_size=2))
    limits = st.fixed_dictionaries(
        {}, optional={"cpu": st.sampled_from(["1", 64]), "memory": st.just("4Gi")}
    )
    requests = st.fixed_dictionaries({}, optional={"cpu": st.just("500m")})
    resources = st.fixed_dictionaries({}, optional={"limits": limits, "requests": requests})
    _maybe(draw, engine, "resources", resources)
    gpu: dict[str, Any] = {}
    _maybe(draw, gpu, "resource", pick(RESOURCES))
    _maybe(draw, gpu, "product", labels)
    _maybe(draw, gpu, "perNode", st.sampled_from([4, 8]))
    placement: dict[str, Any] = {}
    _maybe(draw, placement, "nodeSelector", _labels(pick, labels))
    _maybe(draw, placement, "topologyKey", pick(LABEL_KEYS))
    service: dict[str, Any] = {}
    _maybe(draw, service, "type", st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"]))
    _maybe(draw, service, "annotations", _labels(pick, st.just("v")))
    router: dict[str, Any] = {"pod": _pod(draw, pick, router=True), "service": service}
    _maybe(draw, router, "apiKeySecret", secret)
    _maybe(draw, router, "replicas", st.sampled_from([0, 1, 2]))
    spec: dict[str, Any] = {
        "model": model,
        "engine": engine,
        "gpu": gpu,
        "placement": placement,
        "router": router,
    }
    _maybe(draw, spec, "image", pick(IMAGES))
    _maybe(draw, spec, "replicas", st.sampled_from([0, 1, 2]))
    _maybe(draw, spec, "minAvailable", st.sampled_from([1, 3]))
    parallelism = st.fixed_dictionaries(
        {"tensor": st.sampled_from([1, 2, 3, 4, 8, 16]), "pipeline": st.sampled_from([1, 2, 3])},
        optional={"decodeContext": st.sampled_from([1, 2, 4, 8])},
    )
    _maybe(draw, spec, "parallelism", parallelism)
    _maybe(draw, model, "architecture", ARCHITECTURES)
    prompts = st.fixed_dictionaries({"name": names}, optional={"key": keys})
    _maybe(draw, spec, "warmup", _one("configMap", prompts))
    bounds = st.fixed_dictionaries(
        {"minReplicas": st.sampled_from([0, 1, 2]), "maxReplicas": st.sampled_from([1, 4])}
    )
    _maybe(draw, spec, "autoscaling", bounds)
    _maybe(draw, router, "maxUnavailable", st.sampled_from([1, 3]))
    _maybe(draw, router, "queue", _one("zeroReplicaWaitSeconds", st.sampled_from([0, 120])))
    _maybe(draw, spec, "rollout", _one("maxUnavailable", st.sampled_from([1, 2])))
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "VLLMCluster",
        "metadata": {"name": draw(pick(CLUSTER_NAMES))},
        "spec": spec,
    }


def children(manifest: Manifest, ns: str) -> list[Manifest]:
    """Every object shoal writes for a valid cluster: the fleet, and a model cache's
    claim and download Job."""
    spec = VLLMCluster.model_validate(manifest).spec
    ref = ClusterRef(
        name=manifest["metadata"]["name"], namespace=ns, uid="00000000-0000-0000-0000-000000000001"
    )
    built = desired_fleet(ref, spec, router_image=IMAGE).all()
    extra = (build_cache_claim(ref, spec), build_download_job(ref, spec, image=IMAGE))
    return built + [manifest for manifest in extra if manifest is not None]


def _forms(field: str) -> tuple[str, str]:
    """A field as the API server may write it: a map's key in brackets (its CEL
    rules' errors, and shoal's) or after a dot (its schema's)."""
    parent, bracket, key = field.rpartition("[")
    dotted = f"{parent}.{key.removesuffix(']')}" if bracket and not key[:1].isdigit() else field
    return field, dotted


def check(server: Server, manifest: Manifest) -> None:
    """The API server and shoal agree on the manifest; what shoal builds from it, if
    both accept it, the API server accepts."""
    refused = server.refusal(manifest)
    errors = validate_cluster(manifest)
    if refused is not None:
        assert errors, f"the API server refused what shoal accepts: {refused}"
    held = [error for error in errors if error.rule in ADMISSION_RULES]
    if held:
        assert refused is not None, f"admitted, but shoal refuses it: {held}"
        named = [error for error in held if any(form in refused for form in _forms(error.field))]
        # After a schema error the API server skips its CEL rules, so it may name fewer.
        wanted = held if SKIPPED_CEL not in refused else held[:1]
        assert len(named) >= len(wanted), f"shoal's {held} are not all in the refusal: {refused}"
    event("refused" if refused else "shoal alone refuses" if errors else "both accept")
    if refused is None and not errors:
        for child in children(manifest, server.ns):
            why = server.child_refusal(child)
            name = f"{child['kind']} {child['metadata']['name']}"
            assert why is None, f"{name}, built from a valid spec, is refused or warned of: {why}"


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


def _manifest(**spec: Any) -> Manifest:
    body = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, **spec}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "VLLMCluster",
        "metadata": {"name": "gen"},
        "spec": body,
    }


# What the generated manifests found admitted, then refused (or warned of) in a
# StatefulSet, kept as examples so that each is checked on every run.
FOUND = (
    _manifest(engine={"apiKeySecret": {"name": "Models"}}),
    _manifest(gpu={"resource": "gpu"}),
    _manifest(engine={"pod": {"labels": {"a b": "x"}}}),
    _manifest(engine={"resources": {"limits": {"cpu": "1"}}}),
    _manifest(engine={"pod": {"volumes": [{"name": "models", "emptyDir": {}}]}}),
    _manifest(
        model={
            "name": "meta-llama/Llama-3.1-8B-Instruct",
            "cache": {"node": {"path": "/var/../etc"}},
        }
    ),
    # An abbreviation argparse reads as -tp, and vLLM's own -dpb (not -dp).
    _manifest(engine={"extraArgs": ["-t", "2"]}),
    _manifest(engine={"extraArgs": ["-dpb", "mp"]}),
    # A local path to a known model, with a trailing '/', and a layout its heads refuse.
    _manifest(
        model={"name": "/models/meta-llama/Llama-3.1-70B-Instruct/"}, parallelism={"tensor": 3}
    ),
    # A pull secret named twice: admitted, and the pods drew a warning on every apply.
    _manifest(engine={"pod": {"imagePullSecrets": [{"name": "reg"}, {"name": "reg"}]}}),
    # Fields left empty in YAML: the API server prunes the nulls, and so must shoal.
    _manifest(engine={"resources": {"limits": None}}, replicas=None, router={"service": None}),
)


def _found(test: Any) -> Any:
    for manifest in FOUND:
        test = example(manifest=manifest)(test)
    return test


@_settings(600)
@given(manifest=manifests(hostile=True))
@_found
def test_admission_and_shoal_plan_agree_on_names_keys_and_labels(
    server: Server, manifest: Manifest
) -> None:
    check(server, manifest)


@_settings(250)
@given(manifest=manifests(hostile=False))
def test_what_shoal_writes_for_a_valid_manifest_the_api_server_accepts(
    server: Server, manifest: Manifest
) -> None:
    check(server, manifest)
