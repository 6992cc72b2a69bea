"""Names, labels and annotations of everything the operator creates.

One place, so builders, the reconciler, the router's selector and the tests
agree on them. Changing any value here changes generated manifests (and the
golden files), and so rolls running engines."""

from __future__ import annotations

from shoal.api import GROUP

DOMAIN = GROUP  # serving.shoal.dev

# Labels every object of a cluster carries; the last three select engine pods.
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_CLUSTER = f"{DOMAIN}/cluster"
LABEL_REPLICA = f"{DOMAIN}/replica"
LABEL_ROLE = f"{DOMAIN}/role"

COMPONENT_ENGINE = "engine"
COMPONENT_ROUTER = "router"
ROLE_LEADER = "leader"
ROLE_WORKER = "worker"

# `true` on a VLLMCluster stops reconciling it; on a replica's StatefulSet it
# holds that replica out of rotation.
ANNOTATION_PAUSED = f"{DOMAIN}/paused"
# Hash of the manifest last applied, on every object shoal applies: an object
# whose hash matches needs no write, so an idle fleet causes none.
ANNOTATION_SPEC_HASH = f"{DOMAIN}/spec-hash"
# On the router's pod template: a router.json change rolls the router only.
ANNOTATION_ROUTER_CONFIG_HASH = f"{DOMAIN}/router-config-hash"
# On the pods of a multi-node group: the members the group was formed with.
ANNOTATION_GROUP = f"{DOMAIN}/group"
# On engine pod templates (and so their pods): the digest of the API key
# (spec.engine.apiKeySecret) they were started with (controller/enginekeys.py).
ANNOTATION_ENGINE_KEY = f"{DOMAIN}/engine-key"
# On a VLLMCluster: replica indices, the first to remove first on a scale-down
# (the autoscaler ranks them by what their loss costs; controller/retire.py).
ANNOTATION_REMOVAL_ORDER = f"{DOMAIN}/removal-order"

# The readiness gate of leader pods: True once the replica may take traffic.
CONDITION_WARMED = f"{DOMAIN}/warmed"

FIELD_MANAGER = "shoal-operator"
FINALIZER = f"{DOMAIN}/finalizer"

ENGINE_PORT = 8000
ROUTER_PORT = 8000
# vLLM's default port for the torch.distributed rendezvous of a multi-node group.
MASTER_PORT = 29501

# Services, pod hostnames and label values are DNS labels: at most 63 characters.
DNS_LABEL_MAX = 63
# The StatefulSet controller labels each pod controller-revision-hash=<set name>-<hash>,
# the hash a uint32 in at most 10 characters: a set whose name leaves no room for it
# creates no pods at all.
REVISION_HASH_SUFFIX = "-" + "x" * 10


def leader_set_name(cluster: str, index: int) -> str:
    return f"{cluster}-r{index}"


def worker_set_name(cluster: str, index: int) -> str:
    return f"{cluster}-r{index}-w"


def engine_service_name(cluster: str) -> str:
    """The headless Service giving leader pods stable DNS names."""
    return f"{cluster}-engines"


def router_name(cluster: str) -> str:
    """Deployment, Service, ConfigMap, ServiceAccount, Role, RoleBinding and
    PodDisruptionBudget of the router."""
    return f"{cluster}-router"


def pdb_name(cluster: str) -> str:
    return f"{cluster}-engines"


def longest_derived_names(cluster: str, *, max_index: int) -> dict[str, str]:
    """What each name or label value made from the cluster's name looks like at its
    longest (replica max_index), for those Kubernetes holds to a DNS label."""
    return {
        "the router Service": router_name(cluster),
        "the engines' headless Service": engine_service_name(cluster),
        "a leader pod's controller-revision-hash label": leader_set_name(cluster, max_index)
        + REVISION_HASH_SUFFIX,
        "a worker pod's controller-revision-hash label": worker_set_name(cluster, max_index)
        + REVISION_HASH_SUFFIX,
    }


def max_cluster_name_length(*, max_index: int) -> int:
    """The longest cluster name whose derived names all fit in a DNS label."""
    longest = max(len(name) for name in longest_derived_names("", max_index=max_index).values())
    return DNS_LABEL_MAX - longest


# A group's pods by StatefulSet ordinal: the leader set's only pod is 0 and the
# worker set's start at 1, so a worker's ordinal is its node rank.
LEADER_ORDINAL = 0
FIRST_WORKER_ORDINAL = 1


def pod_name(set_name: str, ordinal: int) -> str:
    return f"{set_name}-{ordinal}"


def leader_pod_name(cluster: str, index: int) -> str:
    return pod_name(leader_set_name(cluster, index), LEADER_ORDINAL)


def leader_address(cluster: str, namespace: str, *, index: int) -> str:
    """DNS name of replica index's leader pod (through the headless Service)."""
    return f"{leader_pod_name(cluster, index)}.{engine_service_name(cluster)}.{namespace}.svc"


def cluster_labels(cluster: str, component: str) -> dict[str, str]:
    return {
        LABEL_NAME: "vllm" if component == COMPONENT_ENGINE else "shoal-router",
        LABEL_INSTANCE: cluster,
        LABEL_COMPONENT: component,
        LABEL_PART_OF: "shoal",
        LABEL_MANAGED_BY: "shoal",
        LABEL_CLUSTER: cluster,
    }


def engine_selector(cluster: str) -> dict[str, str]:
    """Every engine pod of the cluster, leaders and workers."""
    return {LABEL_CLUSTER: cluster, LABEL_COMPONENT: COMPONENT_ENGINE}


def group_selector(cluster: str, index: int) -> dict[str, str]:
    """The pods of one replica's TP group."""
    return {LABEL_CLUSTER: cluster, LABEL_REPLICA: str(index)}


def set_selector(cluster: str, index: int, *, role: str) -> dict[str, str]:
    """A StatefulSet's selector: immutable, so kept to what never changes."""
    return {LABEL_CLUSTER: cluster, LABEL_REPLICA: str(index), LABEL_ROLE: role}


def router_selector(cluster: str) -> dict[str, str]:
    return {LABEL_CLUSTER: cluster, LABEL_COMPONENT: COMPONENT_ROUTER}


def leader_selector_text(cluster: str) -> str:
    """The leader pods as a label selector string: the router's discovery
    selector and status.selector (the scale subresource's)."""
    return f"{LABEL_CLUSTER}={cluster},{LABEL_ROLE}={ROLE_LEADER}"


def selector_text(labels: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in labels.items())
