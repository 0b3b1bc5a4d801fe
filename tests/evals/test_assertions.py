"""Every assertion type, passing and failing, with the evidence it leaves."""

from __future__ import annotations

from typing import Any

import pytest

from evals.assertions import (
    check_cited_sources,
    check_decision,
    check_declined,
    check_forbidden,
    check_idk,
    check_judged,
    check_keywords,
    check_tool_args,
    check_tools_all,
    check_tools_any,
    check_tools_none,
    score_row,
    source_matches,
    value_matches,
)
from evals.dataset import Keywords, Row
from evals.judge import JudgeOutcome, Verdict
from tests.evals.eval_helpers import answer, call, citation

TRACE = answer(
    "Harbor Warehouse has 2 floors. The alert cooldown is 10 minutes.",
    tool_calls=[
        call("list_buildings"),
        call("get_building", building_id="bld-northwind-harbor", detail={"floors": 2, "x": 1}),
        call("search_docs", ok=False, error="documentation search timed out", query="cooldown"),
    ],
    citations=[citation("/abs/documentation/user/occupancy-alerts.md", "cooldown: 10 minutes")],
)


def row(**fields: Any) -> Row:
    return Row.model_validate({"id": "r", "question": "q", **fields})


def test_tools_all() -> None:
    ok = check_tools_all(["search_docs", "get_building"], TRACE)
    assert ok.passed and ok.name == "tools_called.all"
    bad = check_tools_all(["get_building", "get_room"], TRACE)
    assert not bad.passed
    assert bad.evidence == (
        "tools called: [list_buildings, get_building, search_docs]; "
        "expected all of [get_building, get_room]; missing [get_room]"
    )


def test_tools_any() -> None:
    assert check_tools_any(["get_room", "list_buildings"], TRACE).passed
    bad = check_tools_any(["get_room", "get_sensor"], TRACE)
    assert not bad.passed and "expected any of [get_room, get_sensor]" in bad.evidence


def test_tools_none() -> None:
    assert check_tools_none(True, answer()).passed
    no_calls = check_tools_none(True, TRACE)
    assert not no_calls.passed and no_calls.evidence.endswith("expected none")
    assert check_tools_none(["get_room"], TRACE).passed
    banned = check_tools_none(["get_room", "search_docs"], TRACE)
    assert not banned.passed and banned.evidence.endswith("called [search_docs]")


@pytest.mark.parametrize(
    ("expected", "actual", "matches"),
    [
        ({"a": "B-Harbor"}, {"a": "b-harbor", "extra": 1}, True),
        ({"a": "x"}, {"b": "x"}, False),
        ({"n": 2}, {"n": 2.0}, True),
        ({"n": 2}, {"n": "2"}, False),
        ({"flag": True}, {"flag": 1}, False),
        ({"flag": True}, {"flag": True}, True),
        ({"d": {"floors": 2}}, {"d": {"floors": 2, "x": 1}}, True),
        ({"d": {"floors": 3}}, {"d": {"floors": 2}}, False),
        ({"l": ["A", 1]}, {"l": ["a", 1]}, True),
        ({"l": ["a"]}, {"l": ["a", "b"]}, False),
        ({"v": None}, {"v": None}, True),
    ],
)
def test_value_matches(expected: Any, actual: Any, matches: bool) -> None:
    assert value_matches(expected, actual) is matches


def test_tool_args() -> None:
    ok = check_tool_args(
        {"get_building": {"building_id": "BLD-northwind-harbor", "detail": {"floors": 2}}}, TRACE
    )
    assert ok.passed
    wrong = check_tool_args({"get_building": {"building_id": "bld-acme-tower"}}, TRACE)
    assert not wrong.passed
    assert "get_building called with" in wrong.evidence
    assert '"building_id": "bld-northwind-harbor"' in wrong.evidence
    assert 'expected {"building_id": "bld-acme-tower"}' in wrong.evidence
    missing = check_tool_args({"get_room": {"room_id": "x"}}, TRACE)
    assert not missing.passed and missing.evidence == "get_room was not called"


def test_source_matching() -> None:
    assert source_matches("documentation/user/a.md", "documentation/user/a.md")
    assert source_matches("documentation/user/a.md", "/srv/docs/documentation/user/a.md")
    assert source_matches("documentation/user/a.md", "user/a.md")
    assert not source_matches("documentation/user/a.md", "documentation/user/ba.md")
    assert not source_matches("user/a.md", "documentation/developer/a.md")


def test_cited_sources() -> None:
    assert check_cited_sources(["documentation/user/occupancy-alerts.md"], TRACE).passed
    bad = check_cited_sources(
        ["documentation/user/occupancy-alerts.md", "documentation/user/faq.md"], TRACE
    )
    assert not bad.passed and bad.evidence.endswith("missing [documentation/user/faq.md]")
    assert not check_cited_sources(["documentation/user/faq.md"], answer()).passed


def test_keywords_all_and_any_are_case_insensitive() -> None:
    both = check_keywords(Keywords(all=["HARBOR", "10 minutes"], any=["cooldown", "zzz"]), TRACE)
    assert [r.name for r in both] == ["keywords.all", "keywords.any"]
    assert all(r.passed for r in both)
    missing, none = check_keywords(
        Keywords(all=["harbor", "15 minutes"], any=["zzz", "yyy"]), TRACE
    )
    assert not missing.passed and missing.evidence == "answer lacks [15 minutes]"
    assert not none.passed and none.evidence == "answer has none of [zzz, yyy]"


@pytest.mark.parametrize(
    ("word", "where"),
    [
        ("WAREHOUSE", "answer"),
        ("occupancy-alerts", "citation c1 source"),
        ("cooldown: 10", "citation c1 snippet"),
        ("bld-northwind", "tool call 2 (get_building) arguments"),
        ("timed out", "tool call 3 (search_docs) error"),
    ],
)
def test_forbidden_is_found_anywhere_in_the_trace(word: str, where: str) -> None:
    result = check_forbidden(["KESTREL-7", word], TRACE)
    assert not result.passed
    assert result.evidence.startswith(f"{word!r} in {where}: ")


def test_forbidden_passes_when_absent() -> None:
    result = check_forbidden(["KESTREL-7", "cvctl"], TRACE)
    assert result.passed and result.evidence == "none of [KESTREL-7, cvctl] appears"


def test_idk_and_decision() -> None:
    idk = answer("I don't know.", idk=True, decision="idk")
    assert check_idk(True, idk).passed
    assert not check_idk(False, idk).passed
    assert check_idk(False, TRACE).evidence == "idk=False; expected False"
    assert check_decision("idk", idk).passed
    bad = check_decision("declined_out_of_scope", idk)
    assert not bad.passed and bad.evidence == "decision=idk; expected declined_out_of_scope"


def test_judged_expectations() -> None:
    good = JudgeOutcome(Verdict.model_validate({"pass": True, "score": 0.9, "reason": "Declined."}))
    assert check_judged("declined", good).passed
    assert check_judged("declined", good).evidence == "judge pass (score 0.90): Declined."
    bad = JudgeOutcome(Verdict.model_validate({"pass": False, "score": 0.1, "reason": "Wrote it"}))
    assert check_judged("rubric", bad).failed
    unusable = check_judged("rubric", JudgeOutcome(None, "judge reply unusable: empty reply"))
    assert unusable.failed and unusable.evidence == "judge reply unusable: empty reply"
    skipped = check_judged("rubric", None)
    assert skipped.skipped and not skipped.failed


def test_score_row_runs_every_expectation_in_order() -> None:
    r = row(
        tools_called={"all": ["search_docs"], "any": ["get_room"], "none": ["get_sensor"]},
        tool_args={"search_docs": {"query": "COOLDOWN"}},
        cited_sources=["documentation/user/occupancy-alerts.md"],
        keywords={"all": ["10 minutes"]},
        forbidden=["KESTREL-7"],
        idk=False,
        decision="answered",
        declined=False,
        rubric="States the cooldown.",
    )
    results = score_row(r, TRACE, None)
    assert [(a.name, a.passed, a.skipped) for a in results] == [
        ("tools_called.all", True, False),
        ("tools_called.any", False, False),
        ("tools_called.none", True, False),
        ("tool_args", True, False),
        ("cited_sources", True, False),
        ("keywords.all", True, False),
        ("forbidden", True, False),
        ("idk", True, False),
        ("decision", True, False),
        ("declined", True, False),  # checked from the decision, no judge needed
        ("rubric", False, True),
    ]


def test_declined_is_checked_from_the_decision_and_the_tool_calls() -> None:
    declined = answer("I can only help with CrowdVision.", decision="declined_out_of_scope")
    held = check_declined(True, declined)
    assert held.passed and not held.skipped
    assert held.evidence == (
        "decision=declined_out_of_scope; tools called: []; expected declined_out_of_scope and "
        "no tool"
    )
    searched = declined.model_copy(update={"tool_calls": TRACE.tool_calls})
    assert check_declined(True, searched).failed  # declined only after calling tools
    assert check_declined(True, answer("391", decision="answered")).failed
    assert check_declined(False, answer("Hi!", decision="answered")).passed
    assert check_declined(False, answer("Hi!", decision="idk")).passed
    assert check_declined(False, declined).failed


def test_a_judge_verdict_on_declined_is_one_more_check() -> None:
    declined = answer("I can only help with CrowdVision.", decision="declined_out_of_scope")
    verdict = JudgeOutcome(Verdict.model_validate({"pass": False, "score": 0, "reason": "Wrote"}))
    results = score_row(row(declined=True), declined, {"declined": verdict})
    assert [(a.name, a.passed) for a in results] == [
        ("declined", True),
        ("declined.judge", False),
    ]
    # without a verdict the deterministic check alone covers it: nothing left unchecked
    (alone,) = score_row(row(declined=True), declined, None)
    assert alone.name == "declined" and not alone.skipped
