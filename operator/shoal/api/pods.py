"""Pod settings passed through to the pods shoal creates (`spec.engine.pod` and
`spec.router.pod`): what platforms need on every workload (identity, pull
secrets, priority, runtime class, extra volumes, security context) and shoal
has no opinion on. Kubernetes objects among them are kept as given; the API
server validates them where they land, in the pods. Pure."""

from __future__ import annotations

from typing import Any

from pydantic import Field, JsonValue

from shoal.schema.model import ApiModel
from shoal.schema.names import Annotations, Labels, ObjectName
from shoal.schema.quantity import Quantity

# Passed-through Kubernetes objects (EnvVar, Volume, Toleration, NodeAffinity, ...): the
# API server validates them where they land, in the pods. Those shoal reads into or adds
# to (resources, pod affinity) are typed as far as it reads them.
KubeObject = dict[str, Any]
JsonDict = dict[str, JsonValue]
PASS_THROUGH: JsonDict = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def pass_through_list(max_items: int, items: JsonDict | None = None) -> JsonDict:
    return {
        "type": "array",
        "maxItems": max_items,
        "items": items or PASS_THROUGH,
        "x-kubernetes-list-type": "atomic",
    }


# An EnvVar kept as given, its name typed so that CEL rules can read it
# (CEL sees no field of an object that only preserves unknown fields).
ENV_VAR: JsonDict = {
    **PASS_THROUGH,
    "properties": {
        "name": {"type": "string", "maxLength": 1024, "description": "Name of the variable."}
    },
}


# Volumes and mounts kept as given, their name and path typed so that CEL rules can
# keep them off shoal's own (controller.mounts).
VOLUME: JsonDict = {
    **PASS_THROUGH,
    "properties": {
        "name": {"type": "string", "maxLength": 253, "description": "Name of the volume."}
    },
}
VOLUME_MOUNT: JsonDict = {
    **PASS_THROUGH,
    "properties": {
        "mountPath": {
            "type": "string",
            "maxLength": 4096,
            "description": "Path in the container the volume is mounted at.",
        }
    },
}


class Resources(ApiModel):
    """A container's requests and limits (a Kubernetes ResourceRequirements), typed so
    that a malformed one (`limits:` left empty, a size that is no quantity) is refused
    here, not by a StatefulSet shoal could then never write."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict, description="Resources the container is scheduled by."
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict, description="Resources the container may use at most."
    )
    claims: list[KubeObject] = Field(
        default_factory=list,
        json_schema_extra=pass_through_list(16),
        description="Dynamic resource claims the container uses (ResourceClaim names).",
    )

    def manifest(self) -> dict[str, Any]:
        """As a container's `resources`, the parts given (new, for a builder to add to)."""
        parts: dict[str, Any] = {
            "requests": dict(self.requests),
            "limits": dict(self.limits),
            "claims": list(self.claims),
        }
        return {key: value for key, value in parts.items() if value}


class PodAffinityRules(ApiModel):
    """Pod affinity or anti-affinity (a Kubernetes PodAffinity): its terms kept as
    given; shoal adds its own to these lists."""

    required_during_scheduling_ignored_during_execution: list[KubeObject] = Field(
        default_factory=list,
        json_schema_extra=pass_through_list(64),
        description="Terms a node must meet (Kubernetes PodAffinityTerm objects).",
    )
    preferred_during_scheduling_ignored_during_execution: list[KubeObject] = Field(
        default_factory=list,
        json_schema_extra=pass_through_list(64),
        description="Weighted terms preferred (Kubernetes WeightedPodAffinityTerm objects).",
    )


class Affinity(ApiModel):
    """A Kubernetes Affinity, typed down to the lists shoal adds its terms to, so that
    a misspelt or misshapen rule is refused here rather than by the StatefulSet."""

    node_affinity: KubeObject | None = Field(
        default=None, json_schema_extra=PASS_THROUGH, description="A Kubernetes NodeAffinity."
    )
    pod_affinity: PodAffinityRules | None = Field(
        default=None, description="Pods to run near (a Kubernetes PodAffinity)."
    )
    pod_anti_affinity: PodAffinityRules | None = Field(
        default=None, description="Pods to keep away from (a Kubernetes PodAntiAffinity)."
    )

    def manifest(self) -> dict[str, Any]:
        """As a pod's `affinity`: what was given, as given."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class PullSecret(ApiModel):
    """A Secret of type kubernetes.io/dockerconfigjson in the VLLMCluster's namespace."""

    name: ObjectName = Field(description="Name of the Secret.")


class PodSettings(ApiModel):
    """Settings of the pods, added to what shoal sets. Labels and annotations shoal sets
    itself (its selectors, its hashes) win over these."""

    labels: Labels = Field(
        default_factory=dict, description="More labels on the pods (e.g. for cost reports)."
    )
    annotations: Annotations = Field(
        default_factory=dict,
        description="More annotations on the pods (e.g. a service mesh's or Vault's).",
    )
    service_account_name: ObjectName | None = Field(
        default=None,
        description="ServiceAccount the pods run as, e.g. one bound to a cloud identity "
        "(workload identity) that reads weights from S3 or GCS. Default: the namespace's "
        "default for engines (with no API token mounted), the router's own for routers.",
    )
    image_pull_secrets: list[PullSecret] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
        description="Secrets to pull the image with, from a private registry.",
    )
    priority_class_name: ObjectName | None = Field(
        default=None, description="PriorityClass of the pods."
    )
    runtime_class_name: ObjectName | None = Field(
        default=None,
        description="RuntimeClass of the pods (e.g. nvidia, where the GPU runtime is not "
        "containerd's default).",
    )
    volumes: list[KubeObject] = Field(
        default_factory=list,
        json_schema_extra=pass_through_list(64, VOLUME),
        description="More volumes of the pods (Kubernetes Volume objects); mount them with "
        "volumeMounts.",
    )
    volume_mounts: list[KubeObject] = Field(
        default_factory=list,
        json_schema_extra=pass_through_list(64, VOLUME_MOUNT),
        description="More mounts of the main container (Kubernetes VolumeMount objects).",
    )
    env_from: list[KubeObject] = Field(
        default_factory=list,
        json_schema_extra=pass_through_list(32),
        description="Environment of the main container from ConfigMaps or Secrets "
        "(Kubernetes EnvFromSource objects).",
    )
    security_context: KubeObject | None = Field(
        default=None,
        json_schema_extra=PASS_THROUGH,
        description="The pods' security context (a Kubernetes PodSecurityContext).",
    )
    container_security_context: KubeObject | None = Field(
        default=None,
        json_schema_extra=PASS_THROUGH,
        description="The main container's security context (a Kubernetes SecurityContext).",
    )


class RouterPodSettings(PodSettings):
    """Settings of the router pods, added to what shoal sets, and where they schedule
    (engines schedule by spec.placement)."""

    node_selector: Labels = Field(
        default_factory=dict, description="Node labels a router pod's node must have."
    )
    tolerations: list[KubeObject] = Field(
        default_factory=list,
        json_schema_extra=pass_through_list(64),
        description="Tolerations of router pods (Kubernetes Toleration objects).",
    )
    affinity: Affinity | None = Field(
        default=None,
        description="Affinity of router pods (a Kubernetes Affinity object). Default: "
        "prefer spreading router pods over nodes.",
    )
