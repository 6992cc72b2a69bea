"""The spec of a VLLMCluster: what the user asks for.

Every description here is `kubectl explain` text. Durations are integer
`...Seconds` fields and memory sizes are quantities, as in the Kubernetes API
conventions. Cross-field rules live in `validation` (Python) and `cel` (the
API server)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from shoal.api.autoscaling import AutoscalingSpec
from shoal.api.cache import ModelCache
from shoal.api.engine_env import ManagedEnv
from shoal.api.pods import (
    ENV_VAR,
    Affinity,
    KubeObject,
    PodSettings,
    Resources,
    RouterPodSettings,
    pass_through_list,
)
from shoal.api.router import RouterSettings
from shoal.planner.architecture import Attention, KVCacheDtype, WeightDtype
from shoal.planner.presets import PresetName
from shoal.schema.model import ApiModel
from shoal.schema.names import (
    Annotations,
    DataKey,
    ExtendedResource,
    Image,
    Labels,
    LabelValue,
    ObjectName,
    QualifiedName,
    Revision,
    VolumePath,
)
from shoal.schema.quantity import Quantity

DEFAULT_IMAGE = "vllm/vllm-openai:v0.32.0"
# The --max-num-seqs shoal passes unless told; a router told nothing assumes it too.
DEFAULT_MAX_NUM_SEQS = 256
# The most data-parallel replicas; the longest cluster name allowed depends on it.
MAX_REPLICAS = 10000


class SecretKeyRef(ApiModel):
    """A key of a Secret in the VLLMCluster's namespace."""

    name: ObjectName = Field(description="Name of the Secret.")
    key: DataKey = Field(default="token", description="Key within the Secret.")


class PVCSource(ApiModel):
    """Model files on a PersistentVolumeClaim, mounted read-only into every engine pod."""

    claim_name: ObjectName = Field(description="Name of the PersistentVolumeClaim.")
    path: VolumePath = Field(
        default="/",
        description="Directory of the model inside the volume (where config.json is).",
    )


class HFSource(ApiModel):
    """A model downloaded from the Hugging Face Hub when the engine starts."""

    id: str | None = Field(
        default=None,
        max_length=256,
        description="Hub repository, e.g. meta-llama/Llama-3.1-70B-Instruct. Default: model.name.",
    )
    revision: Revision | None = Field(
        default=None, description="Branch, tag or commit. Default: main."
    )
    token_secret: SecretKeyRef | None = Field(
        default=None,
        description="Secret holding a Hub token, given to the engine as HF_TOKEN "
        "(needed for gated models such as Llama).",
    )


class ModelSource(ApiModel):
    """Where the engines load the model from: exactly one of pvc or hf."""

    pvc: PVCSource | None = Field(default=None, description="Load from a PersistentVolumeClaim.")
    hf: HFSource | None = Field(default=None, description="Download from the Hugging Face Hub.")


class ModelArchitecture(ApiModel):
    """The model's shape, for the capacity planner and the tensor-parallel checks.

    Give a preset, or every one of layers, queryHeads, kvHeads, headSize and
    parameters; fields given beside a preset override it (e.g. parameters of a
    fine-tune). Without any architecture shoal recognises the presets' Hugging
    Face ids in model.name."""

    preset: PresetName | None = Field(
        default=None, description="A known model whose numbers shoal carries."
    )
    layers: int | None = Field(
        default=None, ge=1, le=4096, description="Transformer layers (num_hidden_layers)."
    )
    query_heads: int | None = Field(
        default=None, ge=1, le=4096, description="Attention query heads (num_attention_heads)."
    )
    kv_heads: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="Key/value heads (num_key_value_heads); 1 for MLA models.",
    )
    head_size: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description="Values cached per KV head, token and layer (head_dim); for MLA the "
        "latent size, kv_lora_rank + qk_rope_head_dim (576 for DeepSeek-V3/R1).",
    )
    parameters: int | None = Field(
        default=None, ge=1, description="Parameter count, e.g. 70600000000."
    )
    dtype: WeightDtype | None = Field(
        default=None, description="Data type of the weights. Default: bfloat16."
    )
    kv_cache_dtype: KVCacheDtype | None = Field(
        default=None,
        description="Data type of the KV cache (vLLM's --kv-cache-dtype; auto caches in the "
        "model's compute type, bfloat16 for quantised weights). Default: auto.",
    )
    attention: Attention | None = Field(
        default=None,
        description="GQA (also MHA and MQA: K and V per KV head) or MLA (one compressed "
        "latent per token). Default: GQA.",
    )
    context_length: int | None = Field(
        default=None,
        ge=1,
        description="The model's maximum context (max_position_embeddings), used when "
        "engine.maxModelLen is not set.",
    )


class ModelSpec(ApiModel):
    """The model every replica serves: its name, where its weights come from, and its
    shape for capacity planning."""

    name: str = Field(
        min_length=1,
        max_length=512,
        description="Hugging Face id or path given to `vllm serve`, "
        "e.g. meta-llama/Llama-3.1-70B-Instruct.",
    )
    served_name: str | None = Field(
        default=None,
        max_length=256,
        description="Name clients put in the OpenAI `model` field (--served-model-name). "
        "Default: name.",
    )
    source: ModelSource | None = Field(
        default=None,
        description="Where the weights come from. Default: the Hugging Face Hub, id = name, "
        "no token.",
    )
    architecture: ModelArchitecture | None = Field(
        default=None,
        description="The model's shape for capacity planning and the tensor-parallel checks.",
    )
    cache: ModelCache | None = Field(
        default=None,
        description="Keep downloaded weights once per cluster (shared) or per node (node), "
        "so restarts and rollouts do not download again. Default: each pod downloads "
        "into its own emptyDir.",
    )


class Parallelism(ApiModel):
    """How one replica spreads the model over GPUs: tensor x pipeline GPUs per replica.
    vLLM's rules on heads and decode context are checked at admission when the
    architecture is known."""

    tensor: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Tensor-parallel size (--tensor-parallel-size): GPUs each layer is split "
        "over. Must divide the query heads and divide, or be a multiple of, the KV heads.",
    )
    pipeline: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Pipeline-parallel size (--pipeline-parallel-size): stages the layers "
        "are split into. A replica uses tensor x pipeline GPUs.",
    )
    decode_context: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Decode-context-parallel size (--decode-context-parallel-size): TP "
        "ranks that split each KV head's tokens instead of holding copies, for long "
        "contexts. Must divide tensor; for GQA models tensor must exceed the KV heads, "
        "decodeContext be at most tensor / KV heads and divide the query heads per KV head.",
    )


class GPUSpec(ApiModel):
    """The GPUs engine pods run on: what they request, where they schedule, and the
    memory the capacity planner assumes."""

    resource: ExtendedResource = Field(
        default="nvidia.com/gpu",
        description="Extended resource the engine pods request, one per GPU.",
    )
    product: LabelValue | None = Field(
        default=None,
        description="Value of the node label nvidia.com/gpu.product to schedule on, "
        "e.g. NVIDIA-H100-80GB-HBM3. Default: any node with the resource.",
    )
    per_node: int = Field(
        default=8,
        ge=1,
        le=64,
        description="GPUs per node. A replica larger than this spans "
        "(tensor x pipeline) / perNode nodes.",
    )
    memory: Quantity = Field(
        default="80Gi",
        description="Memory of one GPU as nvidia-smi's memory.total shows it "
        "(an H100 80GB shows 79.6Gi), for the capacity planner.",
    )


class EngineSpec(ApiModel):
    """Settings of each vLLM engine (one engine per replica), most of them `vllm serve`
    flags."""

    max_model_len: int | None = Field(
        default=None,
        ge=1,
        description="Longest request, prompt plus output, in tokens (--max-model-len). "
        "Default: the model's context length.",
    )
    max_num_seqs: int = Field(
        default=DEFAULT_MAX_NUM_SEQS,
        ge=1,
        le=65536,
        description="Most requests one replica runs at once (--max-num-seqs); a "
        "per-replica value, also used by the router's load score.",
    )
    max_num_batched_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Token budget of one engine step (--max-num-batched-tokens); at least "
        "maxNumSeqs. Default: vLLM's choice for the GPU.",
    )
    gpu_memory_utilization: float = Field(
        default=0.92,
        gt=0,
        le=1,
        description="Share of each GPU's memory vLLM may use for weights, activations and "
        "KV cache (--gpu-memory-utilization).",
    )
    prefix_caching: bool = Field(
        default=True,
        description="Reuse the KV cache of shared prompt prefixes (--enable-prefix-caching); "
        "the cache-aware router and warm-up depend on it.",
    )
    shutdown_timeout_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description="When an engine pod is stopped (a rollout replaces it, a node drain "
        "evicts it), how long vLLM lets its requests in flight finish "
        "(--shutdown-timeout) while the routers send it no new ones; the pods' "
        "terminationGracePeriodSeconds covers it. 0: vLLM's default, which aborts them "
        "(no flag is passed: images before vLLM 0.18 lack it).",
    )
    memory_overhead: Quantity = Field(
        default="3Gi",
        description="Memory per GPU that is neither weights nor KV cache (activations, CUDA "
        "graphs, communication buffers). Used only by the capacity planner's estimate.",
    )
    shm_size: Quantity = Field(
        default="16Gi",
        description="Size of /dev/shm (a memory-backed emptyDir) for NCCL between the ranks.",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        # Bounded for the API server's cost estimate of the managed-flags rule.
        max_length=48,
        json_schema_extra={
            "items": {"type": "string", "maxLength": 1024},
            "x-kubernetes-list-type": "atomic",
        },
        description="More `vllm serve` arguments, appended after the ones shoal derives. "
        "Flags shoal sets from other fields (parallelism, maxModelLen, ...) are refused here.",
    )
    env: list[KubeObject] = Field(
        default_factory=list,
        json_schema_extra=pass_through_list(128, ENV_VAR),
        description="Environment variables of the engine container (Kubernetes EnvVar "
        "objects), and of the download Job's. Not what shoal sets from other fields: "
        f"{ManagedEnv.API_KEY} (from apiKeySecret, so that the router and the operator "
        f"know the key too), {ManagedEnv.HF_TOKEN} with model.source.hf.tokenSecret, "
        f"{ManagedEnv.HF_HOME} with model.cache.node, {ManagedEnv.NODE_RANK} when a "
        "replica spans nodes.",
    )
    resources: Resources | None = Field(
        default=None,
        description="CPU and memory requests and limits of the engine container "
        "(ResourceRequirements). GPUs are added from gpu and parallelism.",
    )
    api_key_secret: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding the API key the engines require (vLLM's "
        "VLLM_API_KEY, set from the Secret, never an argument): vLLM then refuses /v1, /v2 "
        "and /inference requests without it (/health, /metrics, /tokenize and a few more "
        "stay open: it is no substitute for a NetworkPolicy). The router sends it to the "
        "engines in place of the client's Authorization (clients' keys are "
        "spec.router.apiKeySecret), and the operator reads it for its canary and warm-up. "
        "vLLM reads it once, at start: a changed Secret is rolled out (each engine template "
        "records the key's digest), one replica at a time within rollout.maxUnavailable, "
        "while routers send each engine the key it took, the new one or the one before; a "
        "request no engine takes is answered 503 (engine_key_refused). Default: engines "
        "need no key.",
    )
    pod: PodSettings | None = Field(
        default=None,
        description="Settings of the engine pods: labels, annotations, ServiceAccount, "
        "image pull secrets, priority and runtime class, more volumes, envFrom, security "
        "contexts.",
    )


class PlacementSpec(ApiModel):
    """Where engine pods may run, beyond the GPU product and the GPU taint."""

    node_selector: Labels = Field(
        default_factory=dict, description="Node labels an engine pod's node must have."
    )
    tolerations: list[KubeObject] = Field(
        default_factory=list,
        json_schema_extra=pass_through_list(64),
        description="Tolerations of engine pods (Kubernetes Toleration objects), added to the "
        "one for the GPU taint.",
    )
    affinity: Affinity | None = Field(
        default=None,
        description="Affinity of engine pods (a Kubernetes Affinity object), with shoal's "
        "own terms added.",
    )
    spread_replicas: bool = Field(
        default=True,
        description="Prefer putting different replicas on different nodes, so a node lost "
        "takes as few replicas as possible.",
    )
    topology_key: QualifiedName | None = Field(
        default=None,
        description="Node label whose value the pods of one multi-node replica must share "
        "(e.g. a rack or NVLink domain label).",
    )


class ServiceSpec(ApiModel):
    """The router's Service, the cluster's endpoint."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        default="ClusterIP", description="Service type."
    )
    port: int = Field(default=8000, ge=1, le=65535, description="Service port.")
    annotations: Annotations = Field(
        default_factory=dict,
        description="Annotations of the Service, e.g. a cloud's internal load balancer annotation.",
    )


class RouterSpec(RouterSettings):
    """The OpenAI-compatible router in front of the replicas (a Deployment and a Service
    per cluster): its policy and how it copes with slow or failing replicas."""

    replicas: int = Field(
        default=2,
        ge=0,
        le=100,
        description="Router pods; two, so a router lost or drained leaves the endpoint up.",
    )
    max_unavailable: int = Field(
        default=1,
        ge=1,
        le=100,
        description="Router pods a voluntary disruption (a node drain) may take at once "
        "(the router's PodDisruptionBudget).",
    )
    shutdown_delay_seconds: int = Field(
        default=5,
        ge=0,
        le=300,
        description="How long a stopping router pod (a rollout, a node drain, a scale-down) "
        "goes on serving before it is told to stop (a preStop sleep): the time kube-proxy, "
        "ingress controllers and load balancers take to stop sending it new connections, "
        "which it would refuse once stopped. Its drain (drainSeconds) follows; the pods' "
        "terminationGracePeriodSeconds covers both. 0: none.",
    )
    api_key_secret: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding accepted API keys, one per line; clients send "
        "`Authorization: Bearer <key>`. Routers take up a changed Secret without a restart "
        "(kubelet refreshes the mounted file within about a minute). Default: no key needed.",
    )
    service: ServiceSpec = Field(default_factory=ServiceSpec)
    resources: Resources | None = Field(
        default=None,
        description="CPU and memory of a router pod (ResourceRequirements).",
    )
    pod: RouterPodSettings | None = Field(
        default=None,
        description="Settings of the router pods: labels, annotations, ServiceAccount, "
        "image pull secrets, priority and runtime class, volumes, envFrom, security "
        "contexts, and where they schedule.",
    )


# The most a warm-up prompt may weigh, inline or from a ConfigMap.
WARMUP_PROMPT_CHARS = 65536
WARMUP_PROMPT_MESSAGES = 64


class ChatMessage(ApiModel):
    """One message of a chat prompt."""

    role: Literal["system", "user", "assistant"] = Field(description="Who speaks.")
    content: str = Field(max_length=WARMUP_PROMPT_CHARS, description="What is said.")


class WarmupPrompt(ApiModel):
    """A warm-up prompt: plain text (completions) or chat messages, not both."""

    text: str | None = Field(
        default=None,
        max_length=WARMUP_PROMPT_CHARS,
        description="A plain prompt, sent to /v1/completions.",
    )
    messages: list[ChatMessage] | None = Field(
        default=None,
        max_length=WARMUP_PROMPT_MESSAGES,
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
        description="Chat messages, sent to /v1/chat/completions.",
    )


class ConfigMapKeyRef(ApiModel):
    """A key of a ConfigMap in the VLLMCluster's namespace."""

    name: ObjectName = Field(description="Name of the ConfigMap.")
    key: DataKey = Field(
        default="prompts.yaml",
        description="Key holding a YAML list of prompts, each {text: ...} or {messages: [...]}: "
        f"its first maxPrompts entries are read, each at most {WARMUP_PROMPT_MESSAGES} "
        f"messages, cut to {WARMUP_PROMPT_CHARS} characters as sent.",
    )


class OnTimeout(StrEnum):
    """What a warm-up that did not verify in time does to its replica."""

    ADMIT = "Admit"
    HOLD = "Hold"


class WarmupSpec(ApiModel):
    """Warm-up gating: a new or restarted replica takes traffic only once the prompts
    it will see are in its prefix cache."""

    enabled: bool = Field(
        default=True,
        description="Gate replicas on warm-up. When false, or with no prompts, a replica is "
        "admitted as soon as its engine answers /health.",
    )
    prompts: list[WarmupPrompt] = Field(
        default_factory=list,
        max_length=256,
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
        description="Prompts sent with max_tokens 1 (typically shared system prompts).",
    )
    config_map: ConfigMapKeyRef | None = Field(
        default=None, description="More prompts from a ConfigMap."
    )
    hot_prefixes: bool = Field(
        default=False, description="Also send the router's hot prefixes (router.hotPrefixes)."
    )
    max_prompts: int = Field(
        default=256, ge=1, le=10000, description="Most prompts sent, from all sources together."
    )
    concurrency: int = Field(default=4, ge=1, le=256, description="Warm-up requests in flight.")
    min_hit_ratio: float = Field(
        default=0.8,
        ge=0,
        le=1,
        description="Share of the expected prefix-cache hits a replayed sample must reach "
        "before the replica is admitted.",
    )
    timeout_seconds: int = Field(
        default=600, ge=1, le=86400, description="Longest warm-up before onTimeout applies."
    )
    on_timeout: OnTimeout = Field(
        default=OnTimeout.ADMIT,
        description="On timeout, Admit the replica anyway or Hold it out of rotation "
        "(an Event is recorded either way).",
    )


class RestartBackoff(ApiModel):
    """Exponential backoff between restarts of one replica."""

    initial_seconds: int = Field(default=10, ge=0, le=86400, description="First delay.")
    max_seconds: int = Field(default=600, ge=0, le=86400, description="Longest delay.")


class RestartBudget(ApiModel):
    """Past this many restarts the replica is left alone and the cluster is Degraded."""

    max_restarts: int = Field(
        default=5, ge=0, le=1000, description="Restarts of one replica allowed per window."
    )
    window_seconds: int = Field(
        default=3600, ge=1, le=604800, description="Length of the sliding window."
    )


class RouterErrors(ApiModel):
    """A replica whose requests fail through the router (read each check period from the
    routers' shoal_router_requests counters) fails that check."""

    enabled: bool = Field(default=True, description="Read the routers' per-replica counters.")
    threshold: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Share of a replica's routed requests answered 5xx since the last check "
        "at which the check fails.",
    )
    min_requests: int = Field(
        default=20,
        ge=1,
        le=1000000,
        description="Fewer routed requests than this since the last check give no verdict, "
        "so a trickle of errors never restarts a replica.",
    )


class HealthSpec(ApiModel):
    """Self-healing: finding engines that are dead or hung, and restarting them."""

    period_seconds: int = Field(
        default=10, ge=1, le=3600, description="How often each replica is checked."
    )
    canary_timeout_seconds: int = Field(
        default=30,
        ge=1,
        le=3600,
        description="Deadline of the canary completion (max_tokens 1). A miss counts as a "
        "hang only when token counters are flat or /health fails too.",
    )
    stall_seconds: int = Field(
        default=60,
        ge=1,
        le=86400,
        description="Requests running while generated tokens do not move for this long is a stall.",
    )
    failure_threshold: int = Field(
        default=3, ge=1, le=100, description="Consecutive failed checks before a restart."
    )
    startup_timeout_seconds: int = Field(
        default=1800,
        ge=60,
        le=86400,
        description="How long an engine may take to load the model before its startup probe "
        "fails (large models take many minutes).",
    )
    restart_backoff: RestartBackoff = Field(default_factory=RestartBackoff)
    restart_budget: RestartBudget = Field(default_factory=RestartBudget)
    router_errors: RouterErrors = Field(default_factory=RouterErrors)
    node_loss_seconds: int = Field(
        default=300,
        ge=1,
        le=86400,
        description="Pods on a node NotReady this long are force-deleted so they are "
        "recreated elsewhere (engines keep no state).",
    )


class RolloutSpec(ApiModel):
    """How a changed spec replaces running replicas: a few at a time, each warmed up
    before the next is replaced."""

    max_unavailable: int = Field(
        default=1,
        ge=1,
        le=1000,
        description="Replicas replaced at a time; each must warm up before the next goes.",
    )
    progress_deadline_seconds: int = Field(
        default=900,
        ge=5,
        le=86400,
        description="A replaced replica not warm within this (or whose engine cannot run at "
        "all) gets its last good template back and the rollout pauses until the spec "
        "changes again (Progressing=False, RolledBack). Long enough for the model to load.",
    )


class VLLMClusterSpec(ApiModel):
    """A data-parallel fleet of vLLM engines behind one router. Sections left out get
    their defaults; a nested object's description comes from its model's docstring."""

    model: ModelSpec
    image: Image = Field(default=DEFAULT_IMAGE, description="vLLM engine image.")
    replicas: int = Field(
        default=1,
        ge=0,
        le=MAX_REPLICAS,
        description="Data-parallel replicas: independent engines, each with its own copy of "
        "the weights and its own KV cache. `kubectl scale` changes this.",
    )
    min_available: int = Field(
        default=1,
        ge=1,
        le=MAX_REPLICAS,
        description="Replicas that must be serving for the Available condition (at most "
        "spec.replicas are asked for): what `kubectl wait --for=condition=Available` and "
        "GitOps health checks wait for, while Ready waits for every replica.",
    )
    parallelism: Parallelism = Field(default_factory=Parallelism)
    gpu: GPUSpec = Field(default_factory=GPUSpec)
    engine: EngineSpec = Field(default_factory=EngineSpec)
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    router: RouterSpec = Field(default_factory=RouterSpec)
    warmup: WarmupSpec = Field(default_factory=WarmupSpec)
    health: HealthSpec = Field(default_factory=HealthSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    autoscaling: AutoscalingSpec | None = Field(
        default=None,
        description="Scale replicas with the routers' demand. Default: off (replicas is "
        "what the user or an HPA sets).",
    )
