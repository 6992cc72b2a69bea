"""Generated chart values, judged by the parts that read what the chart writes.

Values are drawn from charts/shoal/values.schema.json itself (its patterns,
bounds and enums), with the release's name and namespace, and the monitoring
on. Whatever the schema admits must then pass, on the real parts:

- `helm template` (helm's own schema check and the templates), or fail on
  purpose with the chart's own message for what a schema cannot say
  (`refused_on_purpose`);
- a server-side dry run of every rendered object on the real API server,
  prometheus-operator's CRDs installed, read from YAML as helm and kubectl
  read it;
- `promtool check config` on the Prometheus config the monitors become, with
  the PrometheusRule's groups as its rules file;
- the kubelet's own image parser (hack/imageref), on the images rendered;
- the operator's own command line, parsed from the Deployment's args, which
  must say what the values asked for.

Kubernetes objects the values pass through whole (resources, affinity,
tolerations, security contexts, NetworkPolicy peers) are left out: the API
server judges those itself, by design. What the tests found is kept as explicit
examples."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shoal.bench.peers import cache_root
from shoal.cli import build_parser
from shoal.controller.cli import port_clash
from shoal_testbed import prometheus
from shoal_testbed.cluster import REPO, Testbed, bin_dir
from tests.conftest import require

pytestmark = pytest.mark.e2e

CHART = REPO / "charts" / "shoal"
SCHEMA: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
DEFAULTS: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
# helm's rule for a release name (and a namespace's, but for its 63 characters).
RELEASE_NAME = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
GLOB = set("*?")  # what makes a watched namespace a pattern (kopf's globs)


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = SCHEMA["definitions"][node["$ref"].rsplit("/", 1)[1]]
    return node


# What a user can write in a values file: no control characters (and no lone surrogates).
TYPED = st.characters(codec="utf-8", exclude_categories=("Cc", "Cs"))


def _string(node: dict[str, Any]) -> st.SearchStrategy[str]:
    pattern = node.get("pattern")
    strings = (
        st.from_regex(pattern, fullmatch=True, alphabet=TYPED)
        if pattern
        else st.text(TYPED, max_size=40)
    )
    longest = node.get("maxLength")
    if longest is not None:
        strings = strings.filter(lambda s: len(s) <= longest)
    if "not" in node:  # a string of a pattern the node refuses
        strings = strings.filter(lambda s: not re.search(node["not"]["pattern"], s))
    return strings


def values_of(node: dict[str, Any]) -> st.SearchStrategy[Any] | None:
    """Values a schema node admits; None for an object Kubernetes judges (a
    free-form `type: object`, or an array of them), which is left out."""
    node = _resolve(node)
    if "const" in node:
        return st.just(node["const"])
    if "enum" in node:
        return st.sampled_from(node["enum"])
    for either in ("anyOf", "oneOf"):
        if either in node:
            options = [s for s in map(values_of, node[either]) if s is not None]
            return st.one_of(options) if options else None
    kind = node.get("type")
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        return st.integers(node.get("minimum"), node.get("maximum"))
    if kind == "number":
        return st.floats(
            node.get("exclusiveMinimum", node.get("minimum")),
            node.get("maximum"),
            exclude_min="exclusiveMinimum" in node,
            allow_nan=False,
        )
    if kind == "string":
        return _string(node)
    if kind == "array":
        items = values_of(node["items"])
        if items is None:
            return None
        return st.lists(items, max_size=3, unique=bool(node.get("uniqueItems")))
    if kind == "object":
        if "properties" in node:
            fields = {k: values_of(v) for k, v in node["properties"].items()}
            known = {k: s for k, s in fields.items() if s is not None}
            if not known:
                return None
            required = set(node.get("required", ()))
            return st.fixed_dictionaries(
                {k: s for k, s in known.items() if k in required},
                optional={k: s for k, s in known.items() if k not in required},
            )
        if "patternProperties" in node:
            # Keys of the pattern whose values can be drawn; none of a pattern
            # that admits nothing ({"not": {}}: a bound the first cannot say).
            refused = [k for k, v in node["patternProperties"].items() if "not" in _resolve(v)]
            [(key, value)] = [
                (k, v) for k, v in node["patternProperties"].items() if k not in refused
            ]
            entries = values_of(value)
            assert entries is not None
            keys = st.from_regex(key, fullmatch=True).filter(
                lambda k: not any(re.search(p, k) for p in refused)
            )
            return st.dictionaries(keys, entries, max_size=3)
        return None
    raise AssertionError(f"values_of: a schema node it does not know: {node}")


def _monitoring_on(values: dict[str, Any]) -> dict[str, Any]:
    monitoring = values.setdefault("monitoring", {})
    for part in ("serviceMonitor", "podMonitor", "prometheusRule", "dashboard"):
        monitoring.setdefault(part, {})["enabled"] = True
    return values


VALUES = values_of(SCHEMA)
assert VALUES is not None
RELEASES = st.from_regex(RELEASE_NAME, fullmatch=True).filter(lambda s: len(s) <= 53)
NAMESPACES = st.from_regex(RELEASE_NAME, fullmatch=True).filter(lambda s: len(s) <= 63)


class Judges:
    """helm, the API server, promtool and the kubelet's image parser, on one testbed."""

    def __init__(self, bed: Testbed, work: Path, imageref: Path) -> None:
        self.bed = bed
        self.work = work
        self.imageref = imageref
        self.made: set[str] = set()

    def image_refusal(self, image: str) -> str:
        return image_refusal(self.imageref, image)

    def render(self, release: str, namespace: str, values: dict[str, Any]) -> tuple[int, str]:
        path = self.work / "values.json"
        # UTF-8, not \u escapes: YAML takes no surrogate pairs, and a user's file has none.
        path.write_text(json.dumps(values, ensure_ascii=False))
        helm = [str(bin_dir() / "helm"), "template", release, str(CHART), "-n", namespace]
        done = subprocess.run(
            [*helm, "-f", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return done.returncode, done.stdout if done.returncode == 0 else done.stderr

    def namespaces(self, names: set[str]) -> None:
        """The namespaces the objects go to (a dry run checks that they exist)."""
        new = sorted(names - self.made)
        if new:
            made = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in new]
            listed = {"apiVersion": "v1", "kind": "List", "items": made}
            self.bed.kubectl("apply", "-f", "-", input_text=json.dumps(listed))
            self.made.update(new)

    def dry_run(self, rendered: str) -> str:
        """The API server's refusals or warnings of a server-side dry run ("" when none).
        ServiceAccounts are made for real first: a pod's dry run looks its own up.
        Each object goes as helm wrote it (YAML that kubectl reads as helm does)."""
        docs = [d for d in re.split(r"(?m)^---\s*$", rendered) if yaml.safe_load(d)]
        accounts = [d for d in docs if yaml.safe_load(d)["kind"] == "ServiceAccount"]
        rest = [d for d in docs if d not in accounts]
        return self._kubectl("apply", accounts) or self._kubectl("create", rest, "--dry-run=server")

    def _kubectl(self, verb: str, docs: list[str], *flags: str) -> str:
        if not docs:
            return ""
        rendered = "\n---\n".join(docs)
        done = subprocess.run(
            [
                str(bin_dir() / "kubectl"),
                f"--kubeconfig={self.bed.kubeconfig}",
                verb,
                *flags,
                "-f",
                "-",
            ],
            input=rendered,
            capture_output=True,
            text=True,
            timeout=120,
        )
        # A warning too: what the chart writes should draw none (a repeated pull
        # secret did, on every apply).
        warned = [line for line in done.stderr.splitlines() if line.startswith("Warning:")]
        return done.stderr if done.returncode != 0 else "\n".join(warned)

    def promtool(self, manifests: list[dict[str, Any]]) -> str:
        """promtool's complaints about the monitors' config and the rules ("" when none)."""
        [rule] = [m for m in manifests if m["kind"] == prometheus.PROMETHEUS_RULE]
        rules = self.work / "rules.yaml"
        rules.write_text(yaml.safe_dump(prometheus.rules_file(rule)))
        config = prometheus.config(manifests, kubeconfig=self.bed.kubeconfig, rule_files=[rules])
        path = self.work / "prometheus.yaml"
        path.write_text(yaml.safe_dump(config))
        done = subprocess.run(
            [str(prometheus.binary("promtool")), "check", "config", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return "" if done.returncode == 0 else done.stdout + done.stderr


def image_refusal(imageref: Path, image: str) -> str:
    """The kubelet's parser's refusal of an image reference ("" when none)."""
    done = subprocess.run(
        [str(imageref)], input=image + "\n", capture_output=True, text=True, timeout=30
    )
    verdict = done.stdout.strip()
    return "" if verdict == "ok" else verdict or done.stderr


def build_imageref(out: Path) -> Path:
    """hack/imageref: the kubelet's image reference parser, built with the
    testbed's Go caches (the testbed's build fetched its module)."""
    cache = cache_root()
    env = {
        **os.environ,
        "GOMODCACHE": str(cache / "go" / "mod"),
        "GOCACHE": str(cache / "go" / "build"),
        "GOTOOLCHAIN": "local",
        "GOFLAGS": "-buildvcs=false",
        "CGO_ENABLED": "0",
    }
    built = subprocess.run(
        ["go", "build", "-o", str(out), "."],
        cwd=REPO / "hack" / "imageref",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, f"go build hack/imageref:\n{built.stderr}"
    return out


@pytest.fixture(scope="module")
def judges(testbed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Judges]:
    require((bin_dir() / "helm").exists(), "helm missing: run `make testbed`")
    require(prometheus.binary("promtool").exists(), "promtool missing: run `make prometheus`")
    require(
        shutil.which("go") is not None, "go missing: the kubelet's image parser is built with it"
    )
    prometheus.install_crds([str(bin_dir() / "kubectl"), f"--kubeconfig={testbed.kubeconfig}"])
    work = tmp_path_factory.mktemp("values")
    found = Judges(testbed, work, build_imageref(work / "imageref"))
    try:
        yield found
    finally:
        if found.made:  # and gone before a next run makes them again
            testbed.kubectl(
                "delete", "namespace", *sorted(found.made), "--timeout=120s", check=False
            )


def refused_on_purpose(values: dict[str, Any]) -> list[str]:
    """The chart's own messages for values its schema cannot judge alone."""
    why = []
    operator, account = values.get("operator", {}), values.get("serviceAccount", {})
    globs = any(GLOB & set(n) for n in operator.get("watchNamespaces", []))
    if globs and values.get("rbac", {}).get("create", True):
        why.append("is a glob; namespaced RBAC needs exact names")
    ports = [
        operator.get(f"{k}Port", DEFAULTS["operator"][f"{k}Port"]) for k in ("liveness", "metrics")
    ]
    if ports[0] == ports[1]:
        why.append("operator.livenessPort and operator.metricsPort are both")
    policy = values.get("networkPolicy", {})
    if policy.get("enabled") and not policy.get("namespaces"):
        why.append("list the namespaces of your VLLMClusters in networkPolicy.namespaces")
    if account.get("create") is False and not account.get("name"):
        why.append("serviceAccount.name is required when serviceAccount.create is false")
    return why


@settings(
    max_examples=40,
    derandomize=True,  # the same examples each run; to explore, drop it and raise max_examples
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(release=RELEASES, namespace=NAMESPACES, values=VALUES)
# What YAML read as another type, unquoted: numbers, a float, a boolean.
@example(release="0", namespace="0", values={})
@example(release="shoal", namespace="shoal-system", values={"serviceAccount": {"name": "1e3"}})
@example(
    release="shoal",
    namespace="8",
    values={
        "imagePullSecrets": [{"name": "6"}, "0"],
        "operator": {"watchNamespaces": ["y", "0"], "priorityClassName": "123"},
        "networkPolicy": {"enabled": True, "namespaces": ["no", "1"]},
    },
)
# One port for both of the operator's servers.
@example(release="shoal", namespace="shoal-system", values={"operator": {"metricsPort": 8080}})
# A pull secret named twice, as a name and as an object: the API server warned.
@example(
    release="shoal", namespace="shoal-system", values={"imagePullSecrets": ["reg", {"name": "reg"}]}
)
# A glob only kopf reads ('?'), which no Role can name.
@example(
    release="shoal", namespace="shoal-system", values={"operator": {"watchNamespaces": ["team-?"]}}
)
def test_values_the_schema_admits_are_admitted_by_every_reader(
    judges: Judges, release: str, namespace: str, values: dict[str, Any]
) -> None:
    values = _monitoring_on(values)
    status, out = judges.render(release, namespace, values)
    if why := refused_on_purpose(values):
        assert status != 0 and any(reason in out for reason in why), out
        return
    assert status == 0, out
    manifests = [m for m in yaml.safe_load_all(out) if m]
    watched = {
        n for n in values.get("operator", {}).get("watchNamespaces", []) if not GLOB & set(n)
    }
    judges.namespaces(
        {namespace} | watched | set(values.get("networkPolicy", {}).get("namespaces", []))
    )
    refused = judges.dry_run(out)
    assert not refused, refused
    complaints = judges.promtool(manifests)
    assert not complaints, complaints
    [deployment] = [m for m in manifests if m["kind"] == "Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == _image(values)
    got = build_parser("operator").parse_args(container["args"])
    assert port_clash(got) is None
    operator = values.get("operator", {})
    assert got.router_image == (operator.get("routerImage") or _image(values))
    # The API server takes any image without spaces at its ends; the kubelet
    # parses it before it pulls, and a pod it cannot parse waits for ever.
    for image in {container["image"], got.router_image}:
        refused = judges.image_refusal(image)
        assert not refused, f"{image!r}: {refused}"
    assert got.namespace == operator.get("watchNamespaces", [])
    secrets = [s if isinstance(s, str) else s["name"] for s in values.get("imagePullSecrets", [])]
    assert got.router_image_pull_secret == list(dict.fromkeys(secrets))


def _image(values: dict[str, Any]) -> str:
    """The image the values name: what the API server cannot tell from another."""
    image = values.get("image", {})
    repository = image.get("repository", DEFAULTS["image"]["repository"])
    return f"{repository}:{image.get('tag') or APP_VERSION}"
