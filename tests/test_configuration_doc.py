"""docs/configuration.md documents exactly the variables Settings declares (and the Ray ones
the service sets), as `agent-service config --format markdown` renders them: a variable added
to Settings without a row, or a row left for a variable that is gone, fails here."""

from __future__ import annotations

import re
from pathlib import Path

from foundation.settings import RAY_OWN_VARIABLES, variables
from serve_app.cli.config import generated_part, render_markdown

PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
REGENERATE = "run `.venv/bin/agent-service config --write-docs docs/configuration.md`"
# A table row's first cell: `NAME` and, in parentheses, the aliases it also accepts.
ROW = re.compile(r"^\| (`[A-Z][A-Z0-9_]*`(?: \((?:`[A-Z][A-Z0-9_]*`(?:, )?)+\))?) \|", re.M)
NAME = re.compile(r"`([A-Z][A-Z0-9_]*)`")


def documented_names(text: str) -> set[str]:
    """Every variable named in the first column of a table row of ``text``."""
    return {name for cell in ROW.findall(text) for name in NAME.findall(cell)}


def declared_names() -> set[str]:
    return {name for v in variables() for name in v.names} | {o.name for o in RAY_OWN_VARIABLES}


def test_every_declared_variable_has_a_row_and_every_row_a_variable() -> None:
    documented = documented_names(PAGE.read_text(encoding="utf-8"))
    declared = declared_names()
    assert sorted(declared - documented) == [], f"declared but not documented: {REGENERATE}"
    assert sorted(documented - declared) == [], f"documented but not in Settings: {REGENERATE}"


def test_the_tables_are_what_agent_service_config_renders() -> None:
    generated = generated_part(PAGE.read_text(encoding="utf-8"))
    assert generated is not None, "docs/configuration.md lost its BEGIN/END markers"
    assert generated == render_markdown(), REGENERATE


def test_the_check_itself_sees_a_missing_and_an_extra_row() -> None:
    rendered = render_markdown()
    assert documented_names(rendered) == declared_names()
    without = "\n".join(line for line in rendered.splitlines() if "`TOP_K_FINAL`" not in line)
    assert declared_names() - documented_names(without) == {"TOP_K_FINAL"}
    extra = rendered + "| `TOP_K_NEVER_DECLARED` | `1` | a row left behind |\n"
    assert documented_names(extra) - declared_names() == {"TOP_K_NEVER_DECLARED"}
