"""bench.router's bookkeeping: what a golden row needs, and the report's counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.router import Report, RoutedRow, needs, report_markdown, route_of
from evals.dataset import FALLBACK_IDENTITY, Case, Row


def case(tags: list[str], tools: list[str] | None = None) -> Case:
    row = Row.model_validate(
        {
            "id": "row",
            "question": "q?",
            "tags": tags,
            **({"tools_called": {"all": tools}} if tools else {"idk": True}),
        }
    )
    return Case(row, FALLBACK_IDENTITY, Path("golden.yaml"), 1)


@pytest.mark.parametrize(
    ("tags", "tools", "expected"),
    [
        (["off-topic"], None, "off-topic"),
        (["greeting"], None, "greeting"),
        (["doc", "permission"], None, "documentation"),
        (["permission"], ["search_docs"], "documentation"),
        (["multi-hop"], None, "live_data"),
        (["permission"], ["get_room"], "live_data"),
        (["doc"], ["get_building"], "both"),
        (["idk"], None, "neither"),
    ],
)
def test_what_a_row_needs_comes_from_its_tags_and_expected_tools(
    tags: list[str], tools: list[str] | None, expected: str
) -> None:
    assert needs(case(tags, tools)) == expected


def test_the_report_counts_served_rows_and_lists_the_misrouted() -> None:
    assert route_of(["x", "route: both (entities and a documented token)"]) == (
        "both",
        "entities and a documented token",
    )
    assert route_of(["no plan"]) == ("-", "")
    rows = [
        RoutedRow("a", "documentation", "documentation", "both", "why a", 0.02),
        RoutedRow("b", "live data, one tool", "live_data", "both", "why b", 0.03),
        RoutedRow("c", "greeting", "greeting", "greeting", "hi", 0.001),
    ]
    text = report_markdown(Report(rows))
    assert "Routed to a route that serves the row: 2/3 (66.7%)" in text
    assert "- `b` needs live_data, routed `both`: why b" in text  # both never serves live data
    assert "`a` needs" not in text.split("## Every row")[0]
