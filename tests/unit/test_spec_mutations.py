"""The good samples, with parts replaced by generated JSON: shoal's validation
never raises on them, and whatever it accepts the builders turn into objects
without raising. A builder that raised on an accepted spec would stop the
operator's passes for that cluster with nothing in its status (an engine
`resources: {limits: }`, left empty, did)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.api.crd import openapi_schema
from shoal.api.resource import VLLMCluster
from shoal.api.spec import VLLMClusterSpec
from shoal.api.validation import validate_cluster
from shoal.controller.cache import build_cache_claim, build_download_job
from shoal.controller.desired import desired_fleet
from shoal.controller.identity import ClusterRef
from shoal.controller.observe import Observed
from shoal.controller.router import router_config
from shoal.controller.status import build_status
from tests.sample_manifests import good_samples, load
from tests.unit.test_controller_status import inputs

BASES = [load(path) for path in good_samples()]
# Keys Kubernetes objects passed through whole use, so that generated objects reach
# the code that reads into them (affinity rules, resource lists), and some others.
KEYS = st.sampled_from(
    [
        "limits",
        "requests",
        "cpu",
        "memory",
        "nodeAffinity",
        "podAffinity",
        "podAntiAffinity",
        "requiredDuringSchedulingIgnoredDuringExecution",
        "preferredDuringSchedulingIgnoredDuringExecution",
        "name",
        "mountPath",
        "key",
        "value",
    ]
) | st.text(max_size=4)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-10, 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=8,
)


def _fields(schema: dict[str, Any], at: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every field the spec's schema names, given in a sample or not."""
    for name, child in schema.get("properties", {}).items():
        yield (*at, name)
        yield from _fields(child, (*at, name))


def _passed_through(schema: dict[str, Any], at: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The fields holding Kubernetes objects kept as given (a list's: the list)."""
    for name, child in schema.get("properties", {}).items():
        inner = child.get("items", child)
        if inner.get("x-kubernetes-preserve-unknown-fields"):
            yield (*at, name)
        yield from _passed_through(child, (*at, name))


SCHEMA = openapi_schema(VLLMClusterSpec)
FIELDS = list(_fields(SCHEMA))
PASSED_THROUGH = list(_passed_through(SCHEMA))
# A Kubernetes object of the wrong shape somewhere inside: what the schema lets by.
OBJECTS = st.dictionaries(KEYS, JSON, min_size=1, max_size=3)


def _places(node: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place a value sits in a sample's spec (list items included)."""
    if at:
        yield at
    if isinstance(node, dict):
        for key, child in node.items():
            yield from _places(child, (*at, key))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from _places(child, (*at, index))


def _schema_at(place: tuple[str, ...]) -> dict[str, Any]:
    node = SCHEMA
    for name in place:
        node = node["properties"][name]
    return node


def _put(spec: dict[str, Any], place: tuple[Any, ...], value: Any) -> None:
    """value at place, making the objects on the way that are missing."""
    node: Any = spec
    for key in place[:-1]:
        if isinstance(node, dict):
            node = node.setdefault(key, {})
        elif isinstance(node, list) and isinstance(key, int):
            node = node[key]
        else:
            return  # an earlier mutation put a scalar on the way
    if isinstance(node, dict) or (isinstance(node, list) and isinstance(place[-1], int)):
        node[place[-1]] = value


def check(manifest: dict[str, Any]) -> None:
    """Validation does not raise; if it accepts the manifest, neither do the builders."""
    if validate_cluster(manifest):
        return
    spec = VLLMCluster.model_validate(manifest).spec
    ref = ClusterRef(name=manifest["metadata"]["name"], namespace="ns", uid="uid")
    assert desired_fleet(ref, spec, router_image="shoal:test").all()
    build_cache_claim(ref, spec)
    build_download_job(ref, spec, image="shoal:test")
    router_config(spec).model_dump_json()
    # And the status of a fleet not made yet, as the first pass writes it.
    first = inputs(Observed(replicas={}, router=None), spec=spec)
    assert build_status(first)["conditions"]


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_validation_never_raises_and_what_it_accepts_builds(data: st.DataObject) -> None:
    manifest = copy.deepcopy(data.draw(st.sampled_from(BASES)))
    for _ in range(data.draw(st.integers(1, 3))):
        if data.draw(st.booleans()):
            place = data.draw(st.sampled_from(PASSED_THROUGH))
            kind = _schema_at(place)
            objects = st.lists(OBJECTS, min_size=1, max_size=2) if "items" in kind else OBJECTS
            _put(manifest["spec"], place, data.draw(objects))
        else:
            place = data.draw(st.sampled_from([*_places(manifest["spec"]), *FIELDS]))
            _put(manifest["spec"], place, data.draw(JSON))
    check(manifest)


# What the mutations found a builder raising on, once validation had accepted it.
@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"engine": {"resources": {"limits": True}}}, "spec.engine.resources.limits"),
        ({"router": {"resources": {"requests": {"cpu": []}}}}, "spec.router.resources.requests"),
        ({"placement": {"affinity": {"podAntiAffinity": [1]}}}, "spec.placement.affinity"),
        (
            {
                "placement": {
                    "affinity": {
                        "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": 5}
                    }
                }
            },
            "spec.placement.affinity.podAffinity",
        ),
    ],
)
def test_what_the_mutations_found_is_refused_naming_the_field(
    spec: dict[str, Any], field: str
) -> None:
    manifest = copy.deepcopy(BASES[0])
    manifest["spec"].update(spec)
    errors = validate_cluster(manifest)
    assert any(error.field.startswith(field) for error in errors), errors
    check(manifest)
