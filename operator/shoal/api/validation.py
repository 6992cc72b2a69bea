"""Is a VLLMCluster valid, and if not, which field and what fix.

The same rules the API server enforces through the schema and CEL (see
`cel`), plus what only the planner can tell (capacity). The operator reports
these as `SpecValid=False`; `shoal plan -f` prints them."""

from __future__ import annotations

import difflib
import re
import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from shoal.api.capacity import RULE_FIELDS, layout_of, plan_spec
from shoal.api.engine_env import ManagedEnv, refusal, rule_of
from shoal.api.flags import refused_args
from shoal.api.resource import VLLMCluster
from shoal.api.spec import MAX_REPLICAS, VLLMClusterSpec
from shoal.controller.mounts import ENGINE_MOUNTS, ROUTER_MOUNTS, Mount
from shoal.controller.names import DNS_LABEL_MAX, max_cluster_name_length, worker_set_name
from shoal.planner.plan import layout_refusals

# A cluster's name begins the names of its Services, StatefulSets and their pods'
# labels: a DNS-1035 label (a Service name must start with a letter), short enough that
# the longest of them fits (controller.names.longest_derived_names).
NAME_PATTERN = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
MAX_NAME_LENGTH = max_cluster_name_length(max_index=MAX_REPLICAS - 1)


# The pods' settings whose volumes and mounts must keep off shoal's own: by field,
# the rule's id and shoal's volumes there.
OWN_MOUNTS: dict[str, tuple[str, tuple[Mount, ...]]] = {
    "spec.engine.pod": ("engine-mounts", ENGINE_MOUNTS),
    "spec.router.pod": ("router-mounts", ROUTER_MOUNTS),
}


def own_mounts_message(field: str) -> str:
    own = OWN_MOUNTS[field][1]
    names = ", ".join(mount.name for mount in own)
    paths = ", ".join(sorted({mount.path for mount in own}))
    return (
        f"{field} must not name a volume {names}, or mount one at {paths}: shoal's own "
        "volumes take those names and paths, and a pod may not have two of one name or "
        "two mounts at one path; give yours others"
    )


@dataclass(frozen=True)
class SpecError:
    """One problem: the field (a JSON path such as spec.parallelism.tensor), what is
    wrong and how to fix it, and the rule that found it (shared with the CEL rule)."""

    field: str
    message: str
    rule: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def parse_cluster(manifest: dict[str, Any]) -> tuple[VLLMCluster | None, list[SpecError]]:
    """The manifest as a VLLMCluster, or the schema errors that stop it being one."""
    try:
        cluster = VLLMCluster.model_validate(manifest)
    except ValidationError as error:
        return None, [_schema_error(detail) for detail in error.errors()]
    return cluster, []


def validate_cluster(manifest: dict[str, Any]) -> list[SpecError]:
    """Every error in a manifest: its name's, and schema errors or else the spec's
    cross-field ones."""
    cluster, errors = parse_cluster(manifest)
    name = manifest.get("metadata", {}).get("name") if isinstance(manifest, dict) else None
    name_errors = validate_name(name) if isinstance(name, str) else []
    return name_errors + (errors if cluster is None else validate_spec(cluster.spec))


def validate_name(name: str) -> list[SpecError]:
    """A cluster's name as the names shoal derives from it need it."""
    errors: list[SpecError] = []
    if not re.match(NAME_PATTERN, name):
        errors.append(
            SpecError(
                "metadata.name",
                f"{name!r} is not a DNS-1035 label: use lowercase letters, digits and '-', "
                "starting with a letter and ending with a letter or digit (shoal names "
                "Services after it, and a Service name must start with a letter)",
                "name-dns-label",
            )
        )
    if len(name) > MAX_NAME_LENGTH:
        longest = worker_set_name(name, MAX_REPLICAS - 1)
        errors.append(
            SpecError(
                "metadata.name",
                f"{len(name)} characters is too long: at most {MAX_NAME_LENGTH}, so that "
                f"StatefulSets such as {longest} and their pods' controller-revision-hash "
                f"label (<set name>-<10-character hash>) fit in {DNS_LABEL_MAX}",
                "name-length",
            )
        )
    return errors


def _schema_error(detail: ErrorDetails) -> SpecError:
    loc = detail["loc"]
    # A map's bad key ("labels", "a b", "[key]"): the map's field, and the key in the message.
    is_key = loc[-1:] == ("[key]",)
    path = _walk(loc[:-2] if is_key else loc)[0]
    message = str(detail["msg"]).removeprefix("Value error, ")
    if is_key:
        message = f"key {message}"
    if detail["type"] == "extra_forbidden":
        message = "unknown field: check its spelling against `kubectl explain vllmcluster.spec`"
        close = difflib.get_close_matches(str(detail["loc"][-1]), _fields_at(detail["loc"][:-1]))
        if close:
            message = f"unknown field: did you mean {close[0]}?"
    elif (fix := _quantity_fix(detail.get("input"))) is not None:
        message = f"{message}; {fix}"
    elif detail["type"] == "missing":
        message = "required field is missing"
    return SpecError(field=path, message=message, rule="schema")


def _walk(loc: tuple[int | str, ...]) -> tuple[str, Any]:
    """A pydantic location as a field path, list items and map keys in brackets
    (spec.warmup.prompts[0].text, spec.engine.pod.labels[example.com/team]), as the
    API server writes them in its CEL rules' errors (a key may hold dots); and the
    type found there."""
    path = ""
    node: Any = VLLMCluster
    for part in loc:
        node = _unwrapped(node)
        if isinstance(part, int) or typing.get_origin(node) in (dict, list):
            path += f"[{part}]"
            node = (typing.get_args(node) or (Any,))[-1]
            continue
        path += f".{part}" if path else part
        fields = getattr(node, "model_fields", {})
        found = next((f for n, f in fields.items() if part in (n, f.alias)), None)
        node = found.annotation if found is not None else Any
    return path, _unwrapped(node)


def _unwrapped(annotation: Any) -> Any:
    """The type inside Annotated[X, ...] and X | None."""
    while True:
        args = typing.get_args(annotation)
        if typing.get_origin(annotation) is typing.Annotated:
            annotation = args[0]
        elif typing.get_origin(annotation) in (typing.Union, types.UnionType):
            annotation = next(arg for arg in args if arg is not type(None))
        else:
            return annotation


_BYTES = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kKMGTPE])i?B\s*$")


def _quantity_fix(given: Any) -> str | None:
    """For a size written in bytes' units (80GB, 512MiB): the quantity meant."""
    found = _BYTES.match(given) if isinstance(given, str) else None
    if found is None:
        return None
    number, unit = found.groups()
    unit = unit.upper()
    return f"for {given.strip()} write {number}{unit}i ({number}{unit} is decimal, 10^N bytes)"


def _fields_at(loc: tuple[int | str, ...]) -> list[str]:
    """The camelCase field names the object at loc (a schema error's path) has."""
    fields = getattr(_walk(loc)[1], "model_fields", None) or {}
    return [f.alias or n for n, f in fields.items()]


def validate_spec(spec: VLLMClusterSpec) -> list[SpecError]:
    """Cross-field errors of a spec that passed the schema, each naming its field and fix."""
    errors: list[SpecError] = []
    for check in _CHECKS:
        errors += check(spec)
    errors += _planner_errors(spec)
    return errors


def _source(spec: VLLMClusterSpec) -> list[SpecError]:
    source = spec.model.source
    if source is None or (source.pvc is None) != (source.hf is None):
        return []
    return [
        SpecError(
            "spec.model.source",
            "give exactly one of pvc (a PersistentVolumeClaim) or hf (the Hugging Face Hub)",
            "source-one-of",
        )
    ]


def _cache(spec: VLLMClusterSpec) -> list[SpecError]:
    cache, source = spec.model.cache, spec.model.source
    if cache is None:
        return []
    if (cache.shared is None) == (cache.node is None):
        return [
            SpecError(
                "spec.model.cache",
                "give exactly one of shared (a ReadWriteMany volume) or node (a host directory)",
                "cache-one-of",
            )
        ]
    if source is not None and source.pvc is not None:
        return [
            SpecError(
                "spec.model.cache",
                "a model on a PersistentVolumeClaim is not downloaded: remove "
                "spec.model.cache or load from the Hub (spec.model.source.hf)",
                "cache-needs-hub",
            )
        ]
    return []


def _architecture(spec: VLLMClusterSpec) -> list[SpecError]:
    given = spec.model.architecture
    if given is None:
        return []
    errors: list[SpecError] = []
    shape = (given.layers, given.query_heads, given.kv_heads, given.head_size, given.parameters)
    if given.preset is None and None in shape:
        errors.append(
            SpecError(
                "spec.model.architecture",
                "give a preset, or all of layers, queryHeads, kvHeads, headSize and parameters",
                "architecture-complete",
            )
        )
    if given.query_heads and given.kv_heads and given.query_heads % given.kv_heads:
        errors.append(
            SpecError(
                "spec.model.architecture.kvHeads",
                f"queryHeads ({given.query_heads}) must be a multiple of kvHeads "
                f"({given.kv_heads}): each KV head serves a whole group of query heads",
                "architecture-heads",
            )
        )
    if given.attention == "MLA" and given.kv_heads not in (None, 1):
        errors.append(
            SpecError(
                "spec.model.architecture.kvHeads",
                "an MLA model caches one latent per token: set kvHeads to 1 and headSize to "
                "the latent size (kv_lora_rank + qk_rope_head_dim)",
                "mla-kv-heads",
            )
        )
    return errors


def _engine(spec: VLLMClusterSpec) -> list[SpecError]:
    engine = spec.engine
    errors: list[SpecError] = []
    batched = engine.max_num_batched_tokens
    if batched is not None and batched < engine.max_num_seqs:
        errors.append(
            SpecError(
                "spec.engine.maxNumBatchedTokens",
                f"max_num_batched_tokens ({batched}) must be greater than or equal to "
                f"max_num_seqs ({engine.max_num_seqs}): raise maxNumBatchedTokens or lower "
                "maxNumSeqs",
                "batched-tokens",
            )
        )
    errors += [
        SpecError("spec.engine.extraArgs", str(refused), "managed-flags")
        for refused in refused_args(engine.extra_args)
    ]
    managed = managed_env(spec)
    errors += [
        SpecError("spec.engine.env", refusal(name), rule_of(name))
        for name in ManagedEnv
        if name in managed and any(var.get("name") == name for var in engine.env)
    ]
    return errors


def managed_env(spec: VLLMClusterSpec) -> frozenset[ManagedEnv]:
    """The variables spec.engine.env may not set in this spec: the API key always,
    the others where shoal sets them for a reason another field states."""
    names = {ManagedEnv.API_KEY}
    source, cache = spec.model.source, spec.model.cache
    if layout_of(spec).nodes_per_replica(spec.gpu.per_node) > 1:
        names.add(ManagedEnv.NODE_RANK)
    if cache is not None and cache.node is not None:
        names.add(ManagedEnv.HF_HOME)
    if source is not None and source.hf is not None and source.hf.token_secret is not None:
        names.add(ManagedEnv.HF_TOKEN)
    return frozenset(names)


def _router(spec: VLLMClusterSpec) -> list[SpecError]:
    router = spec.router
    errors: list[SpecError] = []
    timeouts = router.timeouts
    if not timeouts.connect_seconds <= timeouts.first_byte_seconds <= timeouts.total_seconds:
        errors.append(
            SpecError(
                "spec.router.timeouts",
                "connectSeconds <= firstByteSeconds <= totalSeconds must hold: a later "
                "deadline cannot be shorter than an earlier one",
                "router-timeouts",
            )
        )
    weights = router.weights
    if weights.kv_usage + weights.queue + weights.running <= 0:
        errors.append(
            SpecError(
                "spec.router.weights",
                "at least one of kvUsage, queue and running must be above 0, or every "
                "replica would look equally loaded",
                "load-weights",
            )
        )
    return errors


def _warmup(spec: VLLMClusterSpec) -> list[SpecError]:
    return [
        SpecError(
            f"spec.warmup.prompts[{index}]",
            "give exactly one of text (a plain prompt) or messages (a chat)",
            "prompt-one-of",
        )
        for index, prompt in enumerate(spec.warmup.prompts)
        if (prompt.text is None) == (prompt.messages is None)
    ]


def _health(spec: VLLMClusterSpec) -> list[SpecError]:
    backoff = spec.health.restart_backoff
    if backoff.initial_seconds <= backoff.max_seconds:
        return []
    return [
        SpecError(
            "spec.health.restartBackoff",
            f"initialSeconds ({backoff.initial_seconds}) must not exceed maxSeconds "
            f"({backoff.max_seconds})",
            "restart-backoff",
        )
    ]


def _autoscaling(spec: VLLMClusterSpec) -> list[SpecError]:
    scaling = spec.autoscaling
    if scaling is None:
        return []
    errors: list[SpecError] = []
    if not scaling.min_replicas <= scaling.max_replicas <= MAX_REPLICAS:
        errors.append(
            SpecError(
                "spec.autoscaling",
                f"minReplicas ({scaling.min_replicas}) <= maxReplicas "
                f"({scaling.max_replicas}) <= {MAX_REPLICAS} must hold",
                "autoscaling-bounds",
            )
        )
    if scaling.min_replicas == 0 and spec.router.queue.zero_replica_wait_seconds == 0:
        errors.append(
            SpecError(
                "spec.router.queue.zeroReplicaWaitSeconds",
                "minReplicas 0 needs the routers to hold requests while a replica starts: "
                "set zeroReplicaWaitSeconds (e.g. 120, above an engine's start and warm-up "
                "time), or raise spec.autoscaling.minReplicas",
                "autoscaling-zero-wait",
            )
        )
    if scaling.min_replicas == 0 and spec.router.queue.max_queued == 0:
        # The routers hold a request at zero in their queue: with none, it is
        # answered 429 before it counts as demand, and the fleet stays at zero.
        errors.append(
            SpecError(
                "spec.router.queue.maxQueued",
                "minReplicas 0 needs room in the routers' queue: with maxQueued 0 a request "
                "at zero replicas is answered 429 at once, never counts as demand, and "
                "nothing starts a replica; set maxQueued above 0 (the default is 256), or "
                "raise spec.autoscaling.minReplicas",
                "autoscaling-zero-queue",
            )
        )
    return errors


def _mounts(spec: VLLMClusterSpec) -> list[SpecError]:
    errors = []
    for field, pod in (("spec.engine.pod", spec.engine.pod), ("spec.router.pod", spec.router.pod)):
        rule, own = OWN_MOUNTS[field]
        if pod is None:
            continue
        # Passed through as given: a name that is no string is the API server's to refuse.
        names = {str(volume.get("name")) for volume in pod.volumes}
        paths = {str(mount.get("mountPath")) for mount in pod.volume_mounts}
        if names & {mount.name for mount in own} or paths & {mount.path for mount in own}:
            errors.append(SpecError(field, own_mounts_message(field), rule))
    return errors


def _planner_errors(spec: VLLMClusterSpec) -> list[SpecError]:
    """The planner's refusals; without an architecture, the layout rules needing none."""
    capacity = plan_spec(spec)
    if capacity is not None:
        refusals = capacity.refusals
    else:
        refusals = layout_refusals(None, layout_of(spec), gpus_per_node=spec.gpu.per_node)
    return [
        SpecError(refusal.field or RULE_FIELDS[refusal.rule], refusal.message, refusal.rule)
        for refusal in refusals
    ]


_CHECKS = (
    _source,
    _cache,
    _architecture,
    _engine,
    _mounts,
    _router,
    _warmup,
    _health,
    _autoscaling,
)
