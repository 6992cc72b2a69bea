"""spec.autoscaling: the operator scales the fleet with the load its routers see.

The signal is **demand**: requests in flight through the routers plus requests
waiting in their admission queues, summed over every router pod. Why this
one: the router counts it the instant a request arrives or finishes (no
engine scrape lag, unlike vLLM's num_requests_running/waiting), it sees
requests no engine holds yet (queued at the router, or held while the fleet is
at zero, which is the only signal there is at zero), it means the same under
every routing policy, and it is in the unit users size engines in
(engine.maxNumSeqs is requests too). Queued prefill tokens would track TTFT
more closely, but they rest on the router's estimate of prompt lengths, and a
target in tokens is hard to choose without measuring each model.

Off unless the section is given. Cross-field rules are in `validation` and
`cel` (autoscaling-bounds, autoscaling-zero-wait, autoscaling-zero-queue)."""

from __future__ import annotations

from pydantic import Field

from shoal.schema.model import ApiModel


class AutoscalingSpec(ApiModel):
    """The operator sets spec.replicas (through the scale subresource, as an HPA would)
    from the routers' demand: requests in flight plus requests queued at the routers,
    summed over every router pod, divided by targetPerReplica. It stands aside, and says
    so in status.autoscaling, while an HPA or a KEDA ScaledObject targets the cluster.
    Replicas still starting or warming count as capacity on the way."""

    min_replicas: int = Field(
        default=1,
        ge=0,
        description="Fewest replicas. 0 scales the fleet to zero after idleSeconds without "
        "requests; the routers stay up and hold new requests while a replica starts (set "
        "spec.router.queue.zeroReplicaWaitSeconds).",
    )
    max_replicas: int = Field(
        ge=1, description="Most replicas: at least minReplicas, at most spec.replicas' maximum."
    )
    target_per_replica: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description="Demand (requests in flight plus queued at the routers) one replica "
        "should carry. Default: half of engine.maxNumSeqs, so a replica keeps headroom for "
        "a burst while the next one warms.",
    )
    tolerance: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="Demand within this share of the target (per current replica) changes "
        "nothing, so a steady load near a threshold does not flap.",
    )
    scale_up_stabilization_seconds: int = Field(
        default=0,
        ge=0,
        le=3600,
        description="A scale-up takes the lowest replica count recommended over this "
        "window, so a short spike does not add replicas.",
    )
    scale_down_stabilization_seconds: int = Field(
        default=300,
        ge=0,
        le=86400,
        description="A scale-down takes the highest replica count recommended over this "
        "window, so a dip in load does not remove replicas that will be needed again.",
    )
    idle_seconds: int = Field(
        default=600,
        ge=1,
        le=604800,
        description="With no request at all for this long, the fleet goes to minReplicas "
        "(the only way below one replica).",
    )

    def target(self, max_num_seqs: int) -> int:
        """The demand per replica aimed at."""
        if self.target_per_replica is not None:
            return self.target_per_replica
        return max(1, max_num_seqs // 2)


class AutoscalingStatus(ApiModel):
    """What the built-in autoscaler last saw and decided (written by it alone, on change)."""

    desired_replicas: int | None = Field(
        default=None, ge=0, description="Replicas the autoscaler last asked for."
    )
    current_replicas: int | None = Field(
        default=None, ge=0, description="Replicas that existed when it decided."
    )
    demand: float | None = Field(
        default=None,
        ge=0,
        description="The signal: requests in flight plus queued, summed over the routers "
        "that answered (none when no router answered).",
    )
    target_per_replica: int | None = Field(
        default=None, ge=1, description="The demand per replica it aims at."
    )
    routers: int | None = Field(
        default=None, ge=0, description="Router pods whose /metrics answered."
    )
    last_decision: str | None = Field(
        default=None,
        max_length=64,
        description="ScaledUp, ScaledDown, Idle, OutOfBounds, WithinTolerance, Stabilizing, "
        "NoSignal, PartialSignal, Steady or StoodAside.",
    )
    message: str | None = Field(default=None, max_length=2048, description="Why, for a human.")
    last_scale_time: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When it last changed spec.replicas (RFC 3339).",
    )
    stood_aside_for: str | None = Field(
        default=None,
        max_length=512,
        description="The HorizontalPodAutoscaler or KEDA ScaledObject that scales the "
        "cluster instead (kind/name); the built-in autoscaler changes nothing meanwhile.",
    )
