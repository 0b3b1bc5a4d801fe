"""One way in (issue 41, item 5): the routes under ``serve_app/api/routes`` reach the service
only through the ``ApiBackend`` and the FastAPI dependencies of ``serve_app.api.deps``; none
reads ``app.state`` or reaches the app through ``request.app``. ``app.state`` is set by the
app factory (``serve_app.api.app``) and read by ``serve_app.api.deps`` alone.

Read from the source with ``ast`` (as ``tests/test_layering.py`` reads imports), so the
check holds for code no test happens to run: ``request.app``, ``<anything>.app.state``,
``request.scope["app"]`` and ``getattr(request, "app")`` all count."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
ROUTES = ROOT / "serve_app" / "api" / "routes"
APP_FACTORY = "serve_app/api/app.py"  # sets app.state
DEPENDENCIES = "serve_app/api/deps.py"  # the one module that reads it
REACHING_THE_APP = {"app", "state"}  # request.app, app.state, <anything>.state


def _route_modules() -> list[Path]:
    return sorted(ROUTES.rglob("*.py"))


def _named(node: ast.AST) -> str | None:
    """The attribute or key ``node`` names: ``x.app`` -> ``app``, ``x["app"]`` -> ``app``,
    ``getattr(x, "app")`` -> ``app``."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return key.value
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in {"getattr", "hasattr", "setattr"}
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ):
        return node.args[1].value
    return None


def reaches_the_app(source: str) -> list[str]:
    """``line: text`` of each place ``source`` reaches the app or its state."""
    found = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.expr) and _named(node) in REACHING_THE_APP
    ]
    found.sort(key=lambda node: (node.lineno, node.col_offset))
    return [f"{node.lineno}: {ast.unparse(node)}" for node in found]


def reads_app_state(source: str) -> list[str]:
    """``line: text`` of each ``<...>app.state`` in ``source`` (``app.state``,
    ``request.app.state``, ``self.app.state``)."""
    return [
        f"{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and node.attr == "state"
        and (_named(node.value) == "app" or ast.unparse(node.value) == "app")
    ]


def test_the_scan_sees_every_way_of_reaching_the_app() -> None:
    source = """
async def route(request, other):
    a = request.app.state.backend
    b = request.app
    c = request.scope["app"]
    d = getattr(request, "app")
    e = other.state.limits
    f = request.headers, request.cookies, request.client
"""
    assert [line.split(":")[0] for line in reaches_the_app(source)] == [
        "3",
        "3",
        "4",
        "5",
        "6",
        "7",
    ]
    assert reads_app_state(source) == ["3: request.app.state"]


def test_there_are_route_modules_to_scan() -> None:
    names = {path.stem for path in _route_modules()}
    assert {"ask", "conversations", "feedback", "health", "ingest", "ui"} <= names


@pytest.mark.parametrize("path", _route_modules(), ids=lambda path: str(path.relative_to(ROOT)))
def test_no_route_reaches_the_app_or_its_state(path: Path) -> None:
    assert reaches_the_app(path.read_text(encoding="utf-8")) == []


def test_only_the_dependencies_read_app_state() -> None:
    readers = {
        str(path.relative_to(ROOT))
        for package in ("serve_app", "deployments")
        for path in sorted((ROOT / package).rglob("*.py"))
        if reads_app_state(path.read_text(encoding="utf-8"))
    }
    assert readers <= {APP_FACTORY, DEPENDENCIES}
    assert DEPENDENCIES in readers
