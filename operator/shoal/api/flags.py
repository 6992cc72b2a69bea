"""spec.engine.extraArgs as vLLM reads them: which setting each entry sets,
whatever its spelling (`--x_y`, `--x-y`, `--x=y`, `--x.key`, a unique prefix
such as `--tensor-parallel`, `-tp2`), so a setting shoal derives from
another field cannot be set around the check. Mirrors vLLM's
FlexibleArgumentParser and argparse over the options vLLM 0.32 has
(`vllm_options`, generated from vLLM's parser). Pure."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from shoal.api.vllm_options import ALLOW_ABBREV, OPTIONS

_MODEL = "spec.model.name (or spec.model.source)"
_MULTI_NODE = "shoal (multi-node replicas)"
_DATA_PARALLEL = "spec.replicas (each replica is its own engine behind the router)"

# Settings shoal sets from other fields, and what to set instead.
MANAGED_SETTINGS: dict[str, str] = {
    "model": _MODEL,
    "model_tag": _MODEL,
    "served_model_name": "spec.model.servedName",
    "revision": "spec.model.source.hf.revision",
    "tensor_parallel_size": "spec.parallelism.tensor",
    "pipeline_parallel_size": "spec.parallelism.pipeline",
    "decode_context_parallel_size": "spec.parallelism.decodeContext",
    "data_parallel_size": _DATA_PARALLEL,
    "data_parallel_size_local": _DATA_PARALLEL,
    "data_parallel_rank": _DATA_PARALLEL,
    "data_parallel_start_rank": _DATA_PARALLEL,
    "data_parallel_address": _DATA_PARALLEL,
    "data_parallel_rpc_port": _DATA_PARALLEL,
    "max_model_len": "spec.engine.maxModelLen",
    "max_num_seqs": "spec.engine.maxNumSeqs",
    "max_num_batched_tokens": "spec.engine.maxNumBatchedTokens",
    "gpu_memory_utilization": "spec.engine.gpuMemoryUtilization",
    "enable_prefix_caching": "spec.engine.prefixCaching",
    "shutdown_timeout": "spec.engine.shutdownTimeoutSeconds",
    "prefix_caching_hash_algo": "shoal (the router recomputes block hashes with sha256_cbor)",
    # The key belongs in a Secret: an argument shows in the pod spec and `ps`.
    "api_key": "spec.engine.apiKeySecret",
    "host": "shoal (the pod's address)",
    "port": "shoal (the engine port)",
    "headless": _MULTI_NODE,
    "nnodes": _MULTI_NODE,
    "node_rank": _MULTI_NODE,
    "master_addr": _MULTI_NODE,
    "master_port": _MULTI_NODE,
    # A config file can set any of the above.
    "config": "the spec's fields, or each setting as its own extraArgs entry",
}
_NEGATIVE = re.compile(r"^-\d")


@dataclass(frozen=True)
class Refused:
    """An extraArgs entry setting what shoal sets."""

    arg: str
    setting: str  # vLLM's name for it (model_tag: the positional model)
    use: str  # what to set instead

    def __str__(self) -> str:
        if self.setting == "model_tag":
            return f"{self.arg!r} would be read as the model to serve: set {self.use} instead"
        return f"{self.arg} sets vLLM's {self.setting}, which shoal sets: use {self.use} instead"


def _long_key(arg: str) -> str:
    """`--x_y.z=v` -> `--x-y`: what vLLM's parser hands argparse as the option."""
    key = arg.split("=", 1)[0]
    head = key[2:].split(".", 1)[0]
    return "--" + head.replace("_", "-")


def _candidates(key: str) -> list[str]:
    """Options argparse could read key as: itself, or those it abbreviates
    (several: argparse refuses it as ambiguous, and vLLM does not start)."""
    if key in OPTIONS:
        return [key]
    if key.startswith("--"):
        return [o for o in OPTIONS if o.startswith(key)] if ALLOW_ABBREV and len(key) > 2 else []
    # A single dash: a short option with its value attached (-tp2), or abbreviated.
    return [
        o
        for o in OPTIONS
        if not o.startswith("--")
        and (key.startswith(o) or (ALLOW_ABBREV and o.startswith(key) and len(key) > 1))
    ]


def settings(key: str) -> list[str]:
    """The vLLM settings (dests) an option spelling could set."""
    return sorted({OPTIONS[o][0] for o in _candidates(key)})


def refused_args(args: Sequence[str]) -> list[Refused]:
    """The entries of extraArgs that set (or could set) a managed setting,
    including a positional argument, which vLLM reads as the model."""
    refused: list[Refused] = []
    takes_value = False
    for arg in args:
        if takes_value:
            takes_value = False
            continue
        if not arg.startswith("-") or _NEGATIVE.match(arg) or arg == "-":
            refused.append(Refused(arg, "model_tag", MANAGED_SETTINGS["model_tag"]))
            continue
        key = _long_key(arg) if arg.startswith("--") else arg.split("=", 1)[0]
        candidates = _candidates(key)
        managed = [OPTIONS[o][0] for o in candidates if OPTIONS[o][0] in MANAGED_SETTINGS]
        if managed:
            refused.append(Refused(arg, managed[0], MANAGED_SETTINGS[managed[0]]))
        dotted = arg.startswith("--") and "." in arg.split("=", 1)[0]
        attached = "=" in arg or (not arg.startswith("--") and key not in OPTIONS)
        if dotted:
            takes_value = "=" not in arg
        elif not attached:
            # An option vLLM does not know (or an ambiguous one) fails at start
            # anyway; what follows it is taken as its value, not the model.
            takes_value = len(candidates) != 1 or OPTIONS[candidates[0]][1]
    return refused


def _prefix_pattern(option: str) -> str:
    """RE2 for option and every abbreviation of it (of the entry with '_'
    read as '-', as vLLM does): argparse reads a prefix as the option, or refuses it as
    ambiguous. (No unmanaged option is itself a prefix of a managed one:
    tests/unit/test_api_flags.py holds vLLM's options to that.)"""
    pattern = ""
    for c in reversed(option[3:]):
        pattern = f"({re.escape(c) if c != '-' else '-'}{pattern})?"
    return re.escape(option[2]) + pattern


def _short_options(managed: bool) -> list[str]:
    return sorted(
        o
        for o, (dest, _) in OPTIONS.items()
        if not o.startswith("--") and (dest in MANAGED_SETTINGS) == managed
    )


def _short_abbreviations() -> list[str]:
    """Proper prefixes of managed short options (`-t` of `-tp`), which argparse reads
    as the option, or refuses as ambiguous."""
    if not ALLOW_ABBREV:
        return []
    return sorted({o[:end] for o in _short_options(True) for end in range(2, len(o))})


def managed_pattern() -> str:
    """One RE2 pattern matching an extraArgs entry (its '_' read as '-')
    that sets a managed setting by option, unless exempt_pattern matches it too
    (the CEL rule's; a positional needs the entries around it, which the
    operator's check reads)."""
    long_options = sorted(
        o for o, (dest, _) in OPTIONS.items() if o.startswith("--") and dest in MANAGED_SETTINGS
    )
    longs = "|".join(_prefix_pattern(o) for o in long_options)
    shorts = "|".join(re.escape(o[1:]) for o in _short_options(True))
    abbreviations = "|".join(re.escape(o[1:]) for o in _short_abbreviations())
    return f"^(--({longs})([=.].*)?|-({shorts}).*|-({abbreviations})(=.*)?)$"


def exempt_pattern() -> str:
    """RE2 for the unmanaged short options managed_pattern would take for managed
    ones: argparse reads an option vLLM has exactly as itself (`-dpb`, the data-parallel
    backend, begins like `-dp`; `-dc` is a prefix of `-dcp`)."""
    managed = re.compile(managed_pattern())
    exempt = [o for o in _short_options(False) if managed.match(o)]
    return f"^-({'|'.join(re.escape(o[1:]) for o in exempt)})(=.*)?$"
