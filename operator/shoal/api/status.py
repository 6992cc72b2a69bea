"""The status of a VLLMCluster: what shoal observed, written only on change.

Live load (KV usage, queues) belongs in metrics, not here, so an idle fleet
causes no writes."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from shoal.api.autoscaling import AutoscalingStatus
from shoal.api.cache import ModelStatus
from shoal.planner.result import CapacityPlan
from shoal.schema.model import ApiModel


class ConditionType(StrEnum):
    READY = "Ready"
    AVAILABLE = "Available"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"
    SPEC_VALID = "SpecValid"


class ConditionStatus(StrEnum):
    """A condition's status, as metav1.Condition (and a pod's conditions) spell it."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"

    @classmethod
    def of(cls, value: bool) -> ConditionStatus:
        return cls.TRUE if value else cls.FALSE


class ReplicaState(StrEnum):
    STARTING = "Starting"
    WARMING = "Warming"
    SERVING = "Serving"
    UNHEALTHY = "Unhealthy"
    RESTARTING = "Restarting"
    DRAINING = "Draining"
    HELD = "Held"
    # Its engine container keeps exiting (kubelet's CrashLoopBackOff, OOMKilled).
    CRASH_LOOPING = "CrashLooping"
    # Its image cannot be pulled (ErrImagePull, ImagePullBackOff, InvalidImageName).
    IMAGE_PULL_FAILING = "ImagePullFailing"
    # Its container cannot be created: a Secret or ConfigMap (key) it needs is missing.
    MISCONFIGURED = "Misconfigured"
    # Not started yet: the shared model cache's download Job has not completed.
    DOWNLOADING = "Downloading"


class ConditionReason(StrEnum):
    """Why a condition is as it is: each one docs/troubleshooting.md explains
    (a unit test holds the two together). Alerts and the operator's
    condition metric match these words, so renaming one is a breaking change."""

    # Ready and Available
    SERVING = "Serving"
    MINIMUM_REPLICAS_AVAILABLE = "MinimumReplicasAvailable"
    MINIMUM_REPLICAS_UNAVAILABLE = "MinimumReplicasUnavailable"
    REPLICAS_NOT_WARM = "ReplicasNotWarm"
    ROUTER_UNAVAILABLE = "RouterUnavailable"
    NO_ROUTER = "NoRouter"
    NO_REPLICAS = "NoReplicas"
    # Progressing
    SCALING_UP = "ScalingUp"
    SCALING_DOWN = "ScalingDown"
    ROLLING_OUT = "RollingOut"
    RESTARTING = "Restarting"
    STARTING = "Starting"
    DOWNLOADING = "Downloading"
    STABLE = "Stable"
    PAUSED = "Paused"
    ROLLOUT_STALLED = "RolloutStalled"  # a replica's new template did not run; none to go back to
    ROLLED_BACK = "RolledBack"  # ... and it got its last good template back
    # Degraded
    AS_EXPECTED = "AsExpected"
    ENGINE_CRASH_LOOPING = "EngineCrashLooping"
    ENGINE_OOM_KILLED = "EngineOOMKilled"
    IMAGE_PULL_FAILING = "ImagePullFailing"
    CONTAINER_CONFIG_ERROR = "ContainerConfigError"
    CONTAINER_CANNOT_RUN = "ContainerCannotRun"
    PODS_REFUSED = "PodsRefused"
    UNSCHEDULABLE = "Unschedulable"
    POD_FAILED = "PodFailed"
    POD_STUCK = "PodStuck"  # scheduled long ago, no container created yet
    DOWNLOAD_FAILED = "DownloadFailed"
    RESTART_BUDGET_EXHAUSTED = "RestartBudgetExhausted"
    MANY_REPLICAS_UNREACHABLE = "ManyReplicasUnreachable"
    RECONCILE_FAILED = "ReconcileFailed"
    # SpecValid (InvalidSpec also in Ready, Available and Progressing)
    VALID = "Valid"
    INVALID_SPEC = "InvalidSpec"
    CHILD_REFUSED = "ChildRefused"
    NAME_TAKEN = "NameTaken"


# The longest message of a replica's entry: kubelet's or the scheduler's words
# quoted in one are cut to leave room for what to do.
REPLICA_MESSAGE_CHARS = 2048

# metav1.Condition's reason: CamelCase, as apimachinery validates it.
_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


class Condition(ApiModel):
    """One aspect of the cluster's state, in the shape of apimachinery's metav1.Condition."""

    type: str = Field(
        max_length=316,
        description="Ready (every replica serving through the router), Available (at "
        "least spec.minAvailable replicas serving through the router), Progressing (a "
        "rollout or scale is under way), Degraded (replicas failing or past their restart "
        "budget) or SpecValid.",
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation this condition was set for."
    )
    last_transition_time: str = Field(
        json_schema_extra={"format": "date-time"},
        description="When status last changed (RFC 3339).",
    )
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=_REASON_PATTERN,
        description="Why, in one CamelCase word.",
    )
    message: str = Field(max_length=32768, description="Why, for a human.")


class MeasuredKV(ApiModel):
    """A replica's KV pool as its engine reports it (vllm:cache_config_info)."""

    replica: int = Field(ge=0, description="Replica index.")
    kv_tokens: int = Field(ge=0, description="Tokens the engine's KV pool holds.")
    block_size: int = Field(ge=1, description="Tokens per KV block.")
    gpu_blocks: int = Field(ge=0, description="KV blocks (num_gpu_blocks).")


class CapacityStatus(CapacityPlan):
    """The capacity planner's estimate for the spec, and what the engines measured."""

    measured: list[MeasuredKV] = Field(
        default_factory=list,
        max_length=10000,
        description="KV pool of each running replica as its engine reports it.",
    )


class ReplicaStatus(ApiModel):
    """What shoal observed of one data-parallel replica."""

    index: int = Field(ge=0, description="Replica index i (StatefulSet <cluster>-r<i>).")
    state: ReplicaState = Field(
        description="Starting, Warming, Serving, Unhealthy, Restarting, Draining, Held, "
        "CrashLooping (its engine keeps exiting), ImagePullFailing, Misconfigured (a "
        "Secret or ConfigMap it needs is missing) or Downloading (waiting for the model "
        "cache's download Job)."
    )
    pods: list[str] = Field(default_factory=list, max_length=1024, description="Its pods.")
    nodes: list[str] = Field(default_factory=list, max_length=1024, description="Their nodes.")
    gpus: int = Field(default=0, ge=0, description="GPUs it holds.")
    restarts: int = Field(default=0, ge=0, description="Restarts shoal made of it.")
    last_restart_reason: str | None = Field(
        default=None, max_length=1024, description="Why it was last restarted."
    )
    last_restart_time: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When it was last restarted (RFC 3339).",
    )
    recent_restart_times: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="Restarts shoal made of it within the restart budget's window "
        "(RFC 3339), so that a restarted operator keeps counting them.",
    )
    container_restarts: int = Field(
        default=0,
        ge=0,
        description="Restarts kubelet made of its pods' containers (restartCount, summed).",
    )
    last_termination: str | None = Field(
        default=None,
        max_length=1024,
        description="How its engine last exited, while its pods keep that record "
        "(e.g. 'exit code 1 (Error)', 'OOMKilled').",
    )
    message: str | None = Field(
        default=None,
        max_length=REPLICA_MESSAGE_CHARS,
        description="Why it does not run (CrashLooping, ImagePullFailing, Misconfigured, "
        "Unhealthy), naming the pod, and what to do.",
    )
    warmup_hit_ratio: float | None = Field(
        default=None, ge=0, description="Prefix-cache hit ratio its warm-up check measured."
    )
    warmup: str | None = Field(
        default=None,
        max_length=2048,
        description="Its last warm-up: verdict, prompts sent, hit ratio, duration.",
    )


class VLLMClusterStatus(ApiModel):
    """What shoal observed of the cluster."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation last reconciled."
    )
    replicas: int | None = Field(
        default=None, ge=0, description="Replicas that exist (the scale subresource reads it)."
    )
    ready_replicas: int | None = Field(
        default=None, ge=0, description="Replicas whose engines are up."
    )
    warm_replicas: int | None = Field(
        default=None, ge=0, description="Replicas warmed and taking traffic."
    )
    selector: str | None = Field(
        default=None,
        max_length=4096,
        description="Label selector of the leader pods, for the scale subresource (HPA).",
    )
    endpoint: str | None = Field(
        default=None, max_length=2048, description="URL of the router's Service."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        description="Ready, Available, Progressing, Degraded and SpecValid.",
    )
    capacity: CapacityStatus | None = Field(
        default=None, description="Estimated and measured capacity."
    )
    replica_statuses: list[ReplicaStatus] = Field(
        default_factory=list,
        max_length=10000,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["index"],
        },
        description="One entry per replica.",
    )
    autoscaling: AutoscalingStatus | None = Field(
        default=None, description="The built-in autoscaler (spec.autoscaling), when on."
    )
    model: ModelStatus | None = Field(
        default=None, description="The model's weights: the shared cache's download."
    )
