"""The layers a reader can rely on: the planner sits below the API (no cycle
between them); the pure modules of the controller load no client library; a
state that crosses modules is compared as an enum member, never as its text;
functions of more than two parameters take the rest as keywords."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path

import pytest

import shoal
from shoal.api.spec import OnTimeout
from shoal.api.status import ConditionStatus, ReplicaState
from shoal.controller.decide import EventType, GateReason
from shoal.health.assess import Outcome, Reason
from shoal.warmup.verify import Verdict

PACKAGE = Path(shoal.__file__).parent
CLIENTS = ("kopf", "aiohttp", "httpx", "kr8s", "kubernetes")

PURE_CONTROLLER = (
    "autoscale",
    "cache",
    "decide",
    "desired",
    "election",
    "engine",
    "enginekeys",
    "events",
    "failures",
    "identity",
    "mounts",
    "names",
    "observe",
    "placement",
    "pods",
    "restarts",
    "retire",
    "rollout",
    "router",
    "services",
    "status",
)
IO_CONTROLLER = (
    "autoscaler",
    "children",
    "cli",
    "context",
    "crashlogs",
    "downloads",
    "finalizer",
    "handlers",
    "healthloop",
    "kube",
    "lease",
    "leading",
    "login",
    "logs",
    "metrics",
    "probes",
    "reconcile",
    "recorder",
    "warming",
)
# Pure modules outside the controller whose functions the keyword rule covers.
PURE_ELSEWHERE = ("warmup/verify.py", "warmup/prompts.py", "health/assess.py")


def _modules(package: str) -> list[Path]:
    return sorted(p for p in (PACKAGE / package).glob("*.py") if p.name != "__init__.py")


def _imports(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def _loaded_by(module: str) -> set[str]:
    """Top-level names in sys.modules after importing module in a fresh interpreter."""
    code = f"import sys, {module}; print('\\n'.join(sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return set(done.stdout.split())


def test_the_planner_and_schema_import_nothing_of_the_api_above_them() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for package in ("planner", "schema")
        for path in _modules(package)
        if path.name != "cli.py"  # `shoal plan -f` reads VLLMCluster manifests
        for name in _imports(path)
        if name.startswith("shoal.api") or (package == "schema" and name.startswith("shoal."))
    ]
    assert offenders == []
    loaded = _loaded_by("shoal.planner.plan, shoal.planner.presets, shoal.planner.table")
    assert not {name for name in loaded if name.startswith("shoal.api")}


def test_every_controller_module_is_listed_as_pure_or_io_in_the_package_docstring() -> None:
    names = {path.stem for path in _modules("controller")}
    assert names == set(PURE_CONTROLLER) | set(IO_CONTROLLER)
    docstring = (PACKAGE / "controller" / "__init__.py").read_text()
    pure_part, io_part = docstring.split("\nI/O:")
    assert all(f"`{name}`" in pure_part for name in PURE_CONTROLLER)
    assert all(f"`{name}`" in io_part for name in IO_CONTROLLER)


@pytest.mark.parametrize("name", PURE_CONTROLLER)
def test_a_pure_controller_module_loads_no_kubernetes_or_http_client(name: str) -> None:
    loaded = _loaded_by(f"shoal.controller.{name}")
    assert sorted(set(CLIENTS) & loaded) == []


STATES: tuple[type[StrEnum], ...] = (
    ConditionStatus,
    ReplicaState,
    OnTimeout,
    Verdict,
    GateReason,
    EventType,
    Reason,
    Outcome,
)
STATE_TEXTS = {str(member) for state in STATES for member in state}


def _compared_texts(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        for side in [node.left, *node.comparators]:
            elements = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            for element in elements:
                if isinstance(element, ast.Constant) and element.value in STATE_TEXTS:
                    yield f"{path.relative_to(PACKAGE)}:{node.lineno} compares {element.value!r}"


def test_states_crossing_modules_are_compared_as_enum_members_not_as_text() -> None:
    # Renaming a value then changes what is written, never what is decided.
    paths = [path for package in ("controller", "health", "warmup") for path in _modules(package)]
    assert [found for path in paths for found in _compared_texts(path)] == []


def _positional_overflows(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        names = [a.arg for a in node.args.posonlyargs + node.args.args]
        if names[:1] in (["self"], ["cls"]):
            names = names[1:]
        if len(names) > 2:
            yield f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}({', '.join(names)})"


def test_functions_of_more_than_two_parameters_take_the_rest_as_keywords() -> None:
    paths = [PACKAGE / "controller" / f"{name}.py" for name in PURE_CONTROLLER]
    paths += _modules("api") + _modules("planner") + _modules("schema")
    paths += [PACKAGE / path for path in PURE_ELSEWHERE]
    assert [found for path in paths for found in _positional_overflows(path)] == []
