"""The floors of the house (docs/layout.md, The floors): each package imports only the floors
below it, and no two modules import each other in a circle.

Read from the source with ``ast`` (every ``import``, including those inside functions and
under ``TYPE_CHECKING``), so a lazy import cannot hide an arrow."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# package -> the project packages it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "foundation": set(),
    "retrieval": {"foundation"},
    "local_world": {"foundation"},
    "conversations": {"foundation"},
    "usage_limits": {"foundation"},
    "agent": {"retrieval", "foundation"},
    "ingest_jobs": {"retrieval", "foundation"},
    "evals": {"agent", "retrieval", "foundation"},
    "serve_app": {
        "evals",
        "ingest_jobs",
        "agent",
        "retrieval",
        "conversations",
        "usage_limits",
        "local_world",
        "foundation",
    },
    "deployments": {
        "serve_app",
        "evals",
        "ingest_jobs",
        "agent",
        "retrieval",
        "conversations",
        "usage_limits",
        "foundation",
    },
}
PROJECT = {*ALLOWED, "bench", "migrations", "tests"}
# serve_app/app.py, the deprecated alias for configs written before deployments/graph.py,
# resolves the graph by name (importlib), so it needs no exemption here.
ALIASES: set[str] = set()
# Modules the libraries must not import: each takes a small typed config of its own
# (AgentConfig, RetrievalConfig, EmbedderConfig, RerankerConfig, StoreConfig, IngestConfig,
# ConversationsConfig, LimitPolicy, EvalConfig, JudgeConfig), built from Settings in
# serve_app.wiring.
LIBRARIES = {
    "agent",
    "retrieval",
    "ingest_jobs",
    "conversations",
    "usage_limits",
    "local_world",
    "evals",
}
LIBRARY_FORBIDDEN = {"foundation.settings"}
AGENT_FORBIDDEN = LIBRARY_FORBIDDEN


def _modules() -> Iterator[tuple[str, Path]]:
    for package in ALLOWED:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if str(relative) in ALIASES:
                continue
            parts = list(relative.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            yield ".".join(parts), path


def _imports(path: Path, module: str) -> set[str]:
    """The project modules ``path`` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] in PROJECT}


MODULES = dict(_modules())
GRAPH = {module: _imports(path, module) for module, path in MODULES.items()}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_the_floors_below(package: str) -> None:
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if module.split(".")[0] == package
        for target in targets
        if target.split(".")[0] not in {package, *ALLOWED[package]}
    )
    assert wrong == []


def _reads_settings(package: str) -> list[str]:
    return sorted(
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if module.split(".")[0] == package
        for target in targets
        if any(target == f or target.startswith(f + ".") for f in LIBRARY_FORBIDDEN)
    )


def test_the_agent_core_takes_no_settings() -> None:
    assert _reads_settings("agent") == []


@pytest.mark.parametrize("package", sorted(LIBRARIES))
def test_a_library_takes_its_own_config_not_the_settings(package: str) -> None:
    assert _reads_settings(package) == []


# The small-model strategy is a plug-in of the agent core (agent.strategy): the core (the loop,
# its ports, tools, prompts, finishing) imports nothing of it, so the native path reads and
# runs without it; the composition root (serve_app.wiring) chooses it.
SMALL_MODEL = "agent.small_model"


def test_the_agent_core_imports_nothing_of_the_small_model_strategy() -> None:
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if module.split(".")[0] == "agent" and not module.startswith(SMALL_MODEL)
        for target in targets
        if target == SMALL_MODEL or target.startswith(SMALL_MODEL + ".")
    )
    assert wrong == []


def test_no_import_circles_between_modules() -> None:
    # Edges between modules only (``from pkg import name`` counts as an edge to ``pkg`` when
    # ``pkg.name`` is no module).
    edges = {
        module: {t for t in targets if t in MODULES and t != module}
        for module, targets in GRAPH.items()
    }
    seen: dict[str, int] = {}  # 1 = on the current path, 2 = done
    circles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        seen[module] = 1
        for target in sorted(edges[module]):
            if seen.get(target) == 1:
                circles.append([*path[path.index(target) :], target])
            elif target not in seen:
                visit(target, [*path, target])
        seen[module] = 2

    for module in sorted(edges):
        if module not in seen:
            visit(module, [module])
    assert circles == []
