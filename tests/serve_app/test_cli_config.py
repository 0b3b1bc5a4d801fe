"""``agent-service config``: every variable Settings declares is listed, with its default and
its value in this environment, and no secret or credential is ever printed."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from pydantic import BaseModel

from foundation.settings import RAY_OWN_VARIABLES, Settings, variables
from serve_app.cli import EXIT_OK, main

SECRETS = {
    "OPENROUTER_API_KEY": "sk-or-never-printed-1",
    "EVAL_JWT_SECRET": "eval-secret-never-printed-2",
    "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Basic never-printed-3",
    "RAY_AUTH_TOKEN": "ray-token-never-printed-4",
}
DATABASE_URL = "postgresql://agent:db-password-never-printed-5@db.internal:5432/agent"


def run(*argv: str) -> str:
    out = io.StringIO()
    assert main(["config", *argv], out=out) == EXIT_OK
    return out.getvalue()


def every_field() -> set[tuple[str, str]]:
    """(section, field) for every field of Settings and of each section ("" for its own)."""
    found: set[tuple[str, str]] = set()
    for name, info in Settings.model_fields.items():
        section = info.annotation
        if isinstance(section, type) and issubclass(section, BaseModel):
            found.update((name, field) for field in section.model_fields)
        else:
            found.add(("", name))
    return found


@pytest.fixture
def secrets_set(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DATABASE_URL", DATABASE_URL)


def test_json_lists_every_settings_field_with_default_and_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOP_K_FINAL", "7")
    monkeypatch.setenv("LOCAL_LLM_THREADS", "1")
    data = json.loads(run("--format", "json"))
    entries = data["settings"]
    listed = {(entry["section"] or "", entry["field"]) for entry in entries}
    assert listed == every_field()
    assert len(entries) == len(listed)  # each once
    by_name = {entry["variable"]: entry for entry in entries}
    assert set(by_name) == {v.name for v in variables()}
    assert by_name["TOP_K_FINAL"]["default"] == 5 and by_name["TOP_K_FINAL"]["value"] == 7
    assert by_name["LOCAL_LLM_THREADS"]["value"] == 1
    assert by_name["OPENROUTER_API_KEY"]["aliases"] == [
        "LLM_API_KEY",
        "DEEPSEEK_API_KEY",
        "GOOGLE_API_KEY",
    ]
    assert all(entry["description"] for entry in entries), "every variable says what it does"
    assert [e["variable"] for e in data["read_by_ray"]] == [v.name for v in RAY_OWN_VARIABLES]


@pytest.mark.usefixtures("secrets_set")
@pytest.mark.parametrize("fmt", ["table", "json", "markdown"])
def test_no_secret_or_credential_is_printed(fmt: str) -> None:
    shown = run("--format", fmt)
    for value in [*SECRETS.values(), DATABASE_URL]:
        assert value not in shown
    assert "never-printed" not in shown


@pytest.mark.usefixtures("secrets_set")
def test_secrets_are_redacted_and_a_database_url_keeps_all_but_its_password() -> None:
    by_name: dict[str, Any] = {
        e["variable"]: e for e in [*json.loads(run("--format", "json"))["settings"]]
    }
    ray = {e["variable"]: e for e in json.loads(run("--format", "json"))["read_by_ray"]}
    for name in ("OPENROUTER_API_KEY", "EVAL_JWT_SECRET", "OTEL_EXPORTER_OTLP_HEADERS"):
        assert by_name[name]["secret"] is True
        assert by_name[name]["value"] == "**********"
    assert ray["RAY_AUTH_TOKEN"]["value"] == "**********"
    assert by_name["DATABASE_URL"]["value"] == (
        "postgresql://agent:**********@db.internal:5432/agent"
    )
    assert by_name["AGENT_SERVICE_HOME"]["secret"] is False


def test_a_credential_named_variable_is_secret_whatever_its_type() -> None:
    secret = {v.name for v in variables() if v.secret}
    assert {"OPENROUTER_API_KEY", "EVAL_JWT_SECRET", "OTEL_EXPORTER_OTLP_HEADERS"} <= secret
    assert all(
        v.secret
        for v in variables()
        if any(n.endswith(("_KEY", "_SECRET", "_TOKEN")) or "PASSWORD" in n for n in v.names)
    )


def test_markdown_depends_on_the_declarations_only(monkeypatch: pytest.MonkeyPatch) -> None:
    before = run("--format", "markdown")
    monkeypatch.setenv("TOP_K_FINAL", "9")
    monkeypatch.setenv("ANSWER_MODEL", "some/other-model")
    assert run("--format", "markdown") == before
    for variable in variables():
        assert f"| `{variable.name}`" in before
    for other in RAY_OWN_VARIABLES:
        assert f"| `{other.name}`" in before


def test_table_names_every_variable() -> None:
    shown = run()
    for variable in variables():
        assert variable.name[:30] in shown
