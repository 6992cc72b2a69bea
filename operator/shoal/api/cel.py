"""Cross-field rules the API server enforces (CEL `x-kubernetes-validations`).

Each rule has the id of its Python twin in `validation` (or in the planner),
so a manifest is refused at admission and by `shoal plan -f` for the same
reason. Heads come from the architecture's fields, or else from its preset:
the presets' numbers are written into the rules as CEL map literals.
Every rule is cheap: lists it walks have maxItems, strings maxLength."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shoal.api.engine_env import ManagedEnv, refusal, rule_of
from shoal.api.flags import exempt_pattern, managed_pattern
from shoal.api.spec import MAX_REPLICAS
from shoal.api.validation import (
    MAX_NAME_LENGTH,
    NAME_PATTERN,
    OWN_MOUNTS,
    own_mounts_message,
)
from shoal.controller.mounts import Mount
from shoal.planner.presets import PRESETS, REPOSITORY_PRESETS


@dataclass(frozen=True)
class CelRule:
    """A rule attached at `location` (a path under spec; `[]` means each list item;
    OBJECT for the object itself, where CEL sees metadata.name)."""

    rule: str
    location: str
    expression: str
    message: str
    message_expression: str | None = None
    field_path: str | None = None

    def schema(self) -> dict[str, Any]:
        rendered: dict[str, Any] = {"rule": self.expression, "message": self.message}
        if self.message_expression:
            rendered["messageExpression"] = self.message_expression
        if self.field_path:
            rendered["fieldPath"] = self.field_path
        rendered["reason"] = "FieldValueInvalid"
        return rendered


# The location of rules on the whole object rather than under spec.
OBJECT = "/"

_A = "self.model.architecture"
_TP = "self.parallelism.tensor"
_PP = "self.parallelism.pipeline"
_DCP = "self.parallelism.decodeContext"

_NAME = "self.model.name"
# The repository a model name ends in (lowercase, trailing '/'s ignored), as
# planner.presets reads it: the last part and its '/'s, then that part alone.
_REPOSITORY = f"{_NAME}.lowerAscii().find('[^/]*/*$').find('^[^/]*')"
_BY_NAME = (
    "{" + ", ".join(f"'{repo}': '{preset}'" for repo, preset in REPOSITORY_PRESETS.items()) + "}"
)
# The preset in force: the architecture's, or the one the model's name is.
_PRESET = f"((has({_A}) && has({_A}.preset)) ? {_A}.preset : {_BY_NAME}[{_REPOSITORY}])"

# The architecture resolves to numbers: a preset, every shape field, or (no
# architecture given) a model name shoal recognises, as api.capacity resolves it.
_KNOWN = (
    f"(has({_A}) ? (has({_A}.preset) || (has({_A}.layers) && has({_A}.queryHeads) && "
    f"has({_A}.kvHeads) && has({_A}.headSize) && has({_A}.parameters))) : "
    f"{_REPOSITORY} in {_BY_NAME})"
)


def _effective(field: str, attribute: str) -> str:
    """The field if given, else its preset's value."""
    table = ", ".join(f"'{name}': {getattr(arch, attribute)}" for name, arch in PRESETS.items())
    return f"((has({_A}) && has({_A}.{field})) ? {_A}.{field} : {{{table}}}[{_PRESET}])"


_Q = _effective("queryHeads", "query_heads")
_KV = _effective("kvHeads", "kv_heads")
_LAYERS = _effective("layers", "layers")
_MLA_PRESETS = ", ".join(f"'{name}'" for name, arch in PRESETS.items() if arch.attention == "MLA")
_MLA = (
    f"((has({_A}) && has({_A}.attention)) ? {_A}.attention == 'MLA' : "
    f"{_PRESET} in [{_MLA_PRESETS}])"
)
_CONTEXT = (
    "{" + ", ".join(f"'{name}': {arch.context_length}" for name, arch in PRESETS.items()) + "}"
)
# The model's context length, when its preset is known (an architecture
# without a preset gives none).
_HAS_CONTEXT = (
    f"(has({_A}) ? (has({_A}.contextLength) || has({_A}.preset)) : {_REPOSITORY} in {_BY_NAME})"
)
_CONTEXT_OF = (
    f"((has({_A}) && has({_A}.contextLength)) ? {_A}.contextLength : {_CONTEXT}[{_PRESET}])"
)
# DCP rules beyond divisibility: only for GQA models whose TP the DCP divides.
_GQA_DCP = f"{_DCP} == 1 || {_TP} % {_DCP} != 0 || !{_KNOWN} || {_MLA}"

# An entry (as `arg`) that sets a managed setting by option, in any spelling vLLM
# reads (shoal.api.flags): the managed pattern, less vLLM's own unmanaged options.
_SETS_MANAGED = (
    f"arg.replace('_', '-').matches('{managed_pattern()}') && "
    f"!arg.replace('_', '-').matches('{exempt_pattern()}')"
)


# When spec.engine.env may not set each variable, as CEL on the spec (None: ever):
# validation.managed_env's conditions.
_ENV_WHEN: dict[ManagedEnv, str | None] = {
    ManagedEnv.API_KEY: None,
    ManagedEnv.NODE_RANK: f"{_TP} * {_PP} > self.gpu.perNode",
    ManagedEnv.HF_HOME: "has(self.model.cache) && has(self.model.cache.node)",
    ManagedEnv.HF_TOKEN: "has(self.model.source) && has(self.model.source.hf) && "
    "has(self.model.source.hf.tokenSecret)",
}


def _format(template: str, *values: str) -> str:
    """A messageExpression: `'...%d...'.format([...])`. The API server's cost estimate
    treats `'..' + string(n)` as unbounded, but not format()."""
    quoted = template.replace("'", "\\'")
    return f"'{quoted}'.format([{', '.join(values)}])"


def _keeps_off(own: tuple[Mount, ...]) -> str:
    """Pod settings whose volumes and mounts take none of shoal's own names and paths."""
    names = ", ".join(f"'{name}'" for name in sorted({mount.name for mount in own}))
    paths = ", ".join(f"'{path}'" for path in sorted({mount.path for mount in own}))
    return (
        f"(!has(self.volumes) || self.volumes.all(v, !has(v.name) || !(v.name in [{names}]))) "
        "&& (!has(self.volumeMounts) || self.volumeMounts.all(m, !has(m.mountPath) || "
        f"!(m.mountPath in [{paths}])))"
    )


RULES: tuple[CelRule, ...] = (
    CelRule(
        rule="name-dns-label",
        location=OBJECT,
        expression=f"self.metadata.name.matches('{NAME_PATTERN}')",
        message="metadata.name must be a DNS-1035 label: lowercase letters, digits and '-', "
        "starting with a letter and ending with a letter or digit (shoal names Services "
        "after it, and a Service name must start with a letter)",
    ),
    CelRule(
        rule="name-length",
        location=OBJECT,
        expression=f"size(self.metadata.name) <= {MAX_NAME_LENGTH}",
        message=f"metadata.name must be at most {MAX_NAME_LENGTH} characters, so that "
        "StatefulSets <name>-r<index>-w and their pods' controller-revision-hash label "
        "(<set name>-<10-character hash>) fit in 63",
        message_expression=_format(
            f"metadata.name has %d characters, at most {MAX_NAME_LENGTH} fit: shoal names "
            "StatefulSets <name>-r<index>-w, and their pods' controller-revision-hash label "
            "(<set name>-<10-character hash>) must fit in 63",
            "size(self.metadata.name)",
        ),
    ),
    CelRule(
        rule="attention-heads",
        location="",
        expression=f"!{_KNOWN} || {_Q} % {_TP} == 0",
        message="spec.parallelism.tensor must divide the model's query heads",
        message_expression=_format(
            "Total number of attention heads (%d) must be divisible by tensor parallel size "
            "(%d): set spec.parallelism.tensor to a divisor of %d",
            _Q,
            _TP,
            _Q,
        ),
        field_path=".parallelism.tensor",
    ),
    CelRule(
        rule="kv-heads",
        location="",
        expression=f"!{_KNOWN} || {_Q} % {_TP} != 0 || {_KV} % {_TP} == 0 || {_TP} % {_KV} == 0",
        message="spec.parallelism.tensor must divide the model's KV heads or be a multiple of them",
        message_expression=_format(
            "--tensor-parallel-size (%d) must divide the model's %d KV heads or be a multiple "
            "of them: change spec.parallelism.tensor",
            _TP,
            _KV,
        ),
        field_path=".parallelism.tensor",
    ),
    CelRule(
        rule="max-model-len",
        location="",
        expression=f"!has(self.engine.maxModelLen) || !{_HAS_CONTEXT} || "
        f"self.engine.maxModelLen <= {_CONTEXT_OF}",
        message="spec.engine.maxModelLen exceeds the model's context length",
        message_expression=_format(
            "spec.engine.maxModelLen (%d) exceeds the model's context length (%d tokens, "
            "max_position_embeddings): lower spec.engine.maxModelLen to at most %d",
            "self.engine.maxModelLen",
            _CONTEXT_OF,
            _CONTEXT_OF,
        ),
        field_path=".engine.maxModelLen",
    ),
    CelRule(
        rule="pipeline-layers",
        location="",
        expression=f"!{_KNOWN} || {_PP} <= {_LAYERS}",
        message="spec.parallelism.pipeline exceeds the model's layers",
        message_expression=_format(
            "--pipeline-parallel-size (%d) exceeds the model's %d layers: lower "
            "spec.parallelism.pipeline",
            _PP,
            _LAYERS,
        ),
        field_path=".parallelism.pipeline",
    ),
    CelRule(
        rule="node-shape",
        location="",
        expression=f"{_TP} * {_PP} <= self.gpu.perNode || ({_TP} * {_PP}) % self.gpu.perNode == 0",
        message="spec.parallelism: tensor x pipeline must be at most spec.gpu.perNode or a "
        "multiple of it (a replica spans whole nodes)",
        field_path=".parallelism",
    ),
    CelRule(
        rule="dcp-needs-replicated-kv",
        location="",
        expression=f"{_GQA_DCP} || {_TP} > {_KV}",
        message="spec.parallelism.decodeContext needs tensor above the model's KV heads",
        message_expression=_format(
            "Decode context parallelism for GQA/MQA requires --tensor-parallel-size (%d) to be "
            "greater than the model's total number of KV heads (%d): set "
            "spec.parallelism.decodeContext to 1 or raise spec.parallelism.tensor",
            _TP,
            _KV,
        ),
        field_path=".parallelism.decodeContext",
    ),
    CelRule(
        rule="dcp-max",
        location="",
        expression=f"{_GQA_DCP} || {_TP} <= {_KV} || {_DCP} <= {_TP} / {_KV}",
        message="spec.parallelism.decodeContext exceeds tensor / KV heads",
        message_expression=_format(
            "--decode-context-parallel-size (%d) exceeds the maximum supported value (%d) for "
            "--tensor-parallel-size (%d) and %d model KV heads: lower "
            "spec.parallelism.decodeContext",
            _DCP,
            f"{_TP} / {_KV}",
            _TP,
            _KV,
        ),
        field_path=".parallelism.decodeContext",
    ),
    CelRule(
        rule="dcp-query-heads",
        location="",
        expression=f"{_GQA_DCP} || {_TP} <= {_KV} || ({_Q} / {_KV}) % {_DCP} == 0",
        message="spec.parallelism.decodeContext must divide the query heads per KV head",
        message_expression=_format(
            "The model's number of query heads per KV head (%d) must be divisible by "
            "--decode-context-parallel-size (%d) for GQA/MQA: change "
            "spec.parallelism.decodeContext",
            f"{_Q} / {_KV}",
            _DCP,
        ),
        field_path=".parallelism.decodeContext",
    ),
    CelRule(
        rule="dcp-divides-tp",
        location="parallelism",
        expression="self.tensor % self.decodeContext == 0",
        message="spec.parallelism.decodeContext must divide spec.parallelism.tensor",
        message_expression=_format(
            "tp_size=%d must be divisible by dcp_size=%d: set spec.parallelism.decodeContext "
            "to a divisor of spec.parallelism.tensor",
            "self.tensor",
            "self.decodeContext",
        ),
        field_path=".decodeContext",
    ),
    CelRule(
        rule="source-one-of",
        location="model.source",
        expression="has(self.pvc) != has(self.hf)",
        message="spec.model.source: give exactly one of pvc or hf",
    ),
    CelRule(
        rule="cache-one-of",
        location="model.cache",
        expression="has(self.shared) != has(self.node)",
        message="spec.model.cache: give exactly one of shared or node",
    ),
    CelRule(
        rule="cache-needs-hub",
        location="model",
        expression="!has(self.cache) || !has(self.source) || !has(self.source.pvc)",
        message="spec.model.cache: a model on a PersistentVolumeClaim is not downloaded: "
        "remove spec.model.cache or load from the Hub (spec.model.source.hf)",
        field_path=".cache",
    ),
    CelRule(
        rule="architecture-complete",
        location="model.architecture",
        expression="has(self.preset) || (has(self.layers) && has(self.queryHeads) && "
        "has(self.kvHeads) && has(self.headSize) && has(self.parameters))",
        message="spec.model.architecture: give a preset, or all of layers, queryHeads, "
        "kvHeads, headSize and parameters",
    ),
    CelRule(
        rule="architecture-heads",
        location="model.architecture",
        expression="!has(self.queryHeads) || !has(self.kvHeads) || "
        "self.queryHeads % self.kvHeads == 0",
        message="spec.model.architecture: queryHeads must be a multiple of kvHeads",
        field_path=".kvHeads",
    ),
    CelRule(
        rule="mla-kv-heads",
        location="model.architecture",
        expression="!has(self.attention) || self.attention != 'MLA' || !has(self.kvHeads) || "
        "self.kvHeads == 1",
        message="spec.model.architecture: an MLA model caches one latent per token, so "
        "kvHeads must be 1",
        field_path=".kvHeads",
    ),
    CelRule(
        rule="batched-tokens",
        location="engine",
        expression="!has(self.maxNumBatchedTokens) || self.maxNumBatchedTokens >= self.maxNumSeqs",
        message="spec.engine.maxNumBatchedTokens must be at least spec.engine.maxNumSeqs",
        message_expression=_format(
            "max_num_batched_tokens (%d) must be greater than or equal to max_num_seqs (%d): "
            "raise spec.engine.maxNumBatchedTokens or lower spec.engine.maxNumSeqs",
            "self.maxNumBatchedTokens",
            "self.maxNumSeqs",
        ),
        field_path=".maxNumBatchedTokens",
    ),
    CelRule(
        rule="managed-flags",
        location="engine.extraArgs",
        expression=f"self.all(arg, !({_SETS_MANAGED})) && "
        "(size(self) == 0 || self[0].startsWith('-'))",
        message="spec.engine.extraArgs must not set what shoal sets from other fields "
        "(the model, parallelism, replicas, maxModelLen, maxNumSeqs, gpuMemoryUtilization, "
        "servedName, prefixCaching, apiKeySecret, host, port, multi-node flags, a --config "
        "file), in any "
        "spelling vLLM reads",
        message_expression=_format(
            "%s: vLLM reads these as settings shoal sets from other fields (a positional "
            "argument as the model): use spec.model, spec.parallelism, spec.replicas, "
            "spec.engine (an API key: spec.engine.apiKeySecret) or spec.model.servedName "
            "instead",
            f"self.filter(arg, ({_SETS_MANAGED}) || (arg == self[0] && !arg.startsWith('-')))",
        ),
    ),
    *(
        CelRule(
            rule=rule_of(name),
            location="",
            expression="!has(self.engine.env) || "
            + (f"!({when}) || " if when else "")
            + f"self.engine.env.all(e, !has(e.name) || e.name != '{name}')",
            message=refusal(name),
            field_path=".engine.env",
        )
        for name, when in _ENV_WHEN.items()
    ),
    *(
        CelRule(
            rule=rule,
            location=field.removeprefix("spec."),
            expression=_keeps_off(own),
            message=own_mounts_message(field),
        )
        for field, (rule, own) in OWN_MOUNTS.items()
    ),
    CelRule(
        rule="router-timeouts",
        location="router.timeouts",
        expression="self.connectSeconds <= self.firstByteSeconds && "
        "self.firstByteSeconds <= self.totalSeconds",
        message="spec.router.timeouts: connectSeconds <= firstByteSeconds <= totalSeconds "
        "must hold",
    ),
    CelRule(
        rule="load-weights",
        location="router.weights",
        expression="self.kvUsage + self.queue + self.running > 0.0",
        message="spec.router.weights: at least one of kvUsage, queue and running must be above 0",
    ),
    CelRule(
        rule="prompt-one-of",
        location="warmup.prompts[]",
        expression="has(self.text) != has(self.messages)",
        message="each spec.warmup.prompts entry needs exactly one of text or messages",
    ),
    CelRule(
        rule="autoscaling-bounds",
        location="autoscaling",
        expression=f"self.minReplicas <= self.maxReplicas && self.maxReplicas <= {MAX_REPLICAS}",
        message=f"spec.autoscaling: minReplicas <= maxReplicas <= {MAX_REPLICAS} must hold",
        message_expression=_format(
            f"spec.autoscaling: minReplicas (%d) <= maxReplicas (%d) <= {MAX_REPLICAS} must hold",
            "self.minReplicas",
            "self.maxReplicas",
        ),
    ),
    CelRule(
        rule="autoscaling-zero-wait",
        location="",
        expression="!has(self.autoscaling) || self.autoscaling.minReplicas > 0 || "
        "self.router.queue.zeroReplicaWaitSeconds > 0",
        message="spec.autoscaling.minReplicas 0 needs spec.router.queue.zeroReplicaWaitSeconds "
        "above 0 (e.g. 120), so routers hold requests while a replica starts",
        field_path=".router.queue.zeroReplicaWaitSeconds",
    ),
    CelRule(
        rule="autoscaling-zero-queue",
        location="",
        expression="!has(self.autoscaling) || self.autoscaling.minReplicas > 0 || "
        "self.router.queue.maxQueued > 0",
        message="spec.autoscaling.minReplicas 0 needs spec.router.queue.maxQueued above 0 "
        "(the default is 256): with no queue a request at zero replicas is answered 429 "
        "before it counts as demand, and no replica is ever started",
        field_path=".router.queue.maxQueued",
    ),
    CelRule(
        rule="restart-backoff",
        location="health.restartBackoff",
        expression="self.initialSeconds <= self.maxSeconds",
        message="spec.health.restartBackoff: initialSeconds must not exceed maxSeconds",
    ),
)
