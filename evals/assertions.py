"""Scoring one ``/ask`` response against one golden row.

One small function per expectation, each returning an ``AssertionResult`` whose evidence
says what was seen and what was expected, so a failing row explains itself in the report.
Matching rules: tool names exact; tool arguments a recursive subset (strings
case-insensitive); citation sources exact or a path suffix on ``/`` boundaries; keywords and
forbidden strings case-insensitive substrings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.answer import AgentAnswer

if TYPE_CHECKING:
    from evals.dataset import Keywords, Row, ToolsCalled
    from evals.judge import JudgeOutcome

MAX_EVIDENCE_ITEMS = 8


@dataclass(frozen=True)
class AssertionResult:
    name: str
    passed: bool
    evidence: str
    skipped: bool = False  # not checked (a rubric with no judge): the row is only PARTIAL

    @property
    def failed(self) -> bool:
        return not self.passed and not self.skipped


def _names(items: Sequence[str]) -> str:
    shown = list(dict.fromkeys(items))
    more = len(shown) - MAX_EVIDENCE_ITEMS
    text = ", ".join(shown[:MAX_EVIDENCE_ITEMS])
    return f"[{text}{f', +{more} more' if more > 0 else ''}]"


def _clip(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- tools ---------------------------------------------------------------------------------


def check_tools_all(expected: Sequence[str], response: AgentAnswer) -> AssertionResult:
    called = [call.name for call in response.tool_calls]
    missing = [name for name in expected if name not in called]
    evidence = f"tools called: {_names(called)}; expected all of {_names(expected)}"
    if missing:
        evidence += f"; missing {_names(missing)}"
    return AssertionResult("tools_called.all", not missing, evidence)


def check_tools_any(expected: Sequence[str], response: AgentAnswer) -> AssertionResult:
    called = [call.name for call in response.tool_calls]
    hit = any(name in called for name in expected)
    evidence = f"tools called: {_names(called)}; expected any of {_names(expected)}"
    return AssertionResult("tools_called.any", hit, evidence)


def check_tools_none(expected: bool | Sequence[str], response: AgentAnswer) -> AssertionResult:
    called = [call.name for call in response.tool_calls]
    if expected is True:
        return AssertionResult(
            "tools_called.none", not called, f"tools called: {_names(called)}; expected none"
        )
    banned = [name for name in called if name in list(expected or [])]
    evidence = f"tools called: {_names(called)}; expected none of {_names(list(expected or []))}"
    if banned:
        evidence += f"; called {_names(banned)}"
    return AssertionResult("tools_called.none", not banned, evidence)


def check_tools_called(spec: ToolsCalled, response: AgentAnswer) -> list[AssertionResult]:
    results: list[AssertionResult] = []
    if spec.all is not None:
        results.append(check_tools_all(spec.all, response))
    if spec.any is not None:
        results.append(check_tools_any(spec.any, response))
    if spec.none is not None:
        results.append(check_tools_none(spec.none, response))
    return results


def value_matches(expected: Any, actual: Any) -> bool:
    """``expected`` is a subset of ``actual``: dicts recursively by key, lists item by item,
    strings case-insensitively, numbers and booleans exactly (``True`` is not ``1``)."""
    if isinstance(expected, Mapping):
        return isinstance(actual, Mapping) and all(
            key in actual and value_matches(value, actual[key]) for key, value in expected.items()
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(expected) == len(actual)
            and all(value_matches(e, a) for e, a in zip(expected, actual, strict=True))
        )
    if isinstance(expected, str):
        return isinstance(actual, str) and expected.casefold() == actual.casefold()
    if isinstance(expected, bool) or isinstance(actual, bool):
        return isinstance(expected, bool) and isinstance(actual, bool) and expected == actual
    if isinstance(expected, int | float):
        return isinstance(actual, int | float) and expected == actual
    return bool(expected == actual)


def check_tool_args(
    expected: Mapping[str, Mapping[str, Any]], response: AgentAnswer
) -> AssertionResult:
    problems: list[str] = []
    for tool, wanted in expected.items():
        calls = [call for call in response.tool_calls if call.name == tool]
        if not calls:
            problems.append(f"{tool} was not called")
        elif not any(value_matches(dict(wanted), call.arguments) for call in calls):
            seen = "; ".join(_clip(json.dumps(call.arguments), 120) for call in calls[:3])
            problems.append(f"{tool} called with {seen}; expected {json.dumps(dict(wanted))}")
    if problems:
        return AssertionResult("tool_args", False, "; ".join(problems))
    return AssertionResult("tool_args", True, f"matched arguments of {_names(list(expected))}")


# --- citations, text -----------------------------------------------------------------------


def source_matches(expected: str, actual: str) -> bool:
    """The same file: equal, or one path is a suffix of the other on a ``/`` boundary (a store
    ingested from an absolute root holds ``/abs/documentation/user/x.md``)."""
    a, b = expected.strip().strip("/"), actual.strip().strip("/")
    return a == b or b.endswith("/" + a) or a.endswith("/" + b)


def check_cited_sources(expected: Sequence[str], response: AgentAnswer) -> AssertionResult:
    cited = [citation.source for citation in response.citations]
    missing = [e for e in expected if not any(source_matches(e, c) for c in cited)]
    evidence = f"cited: {_names(cited)}; expected {_names(expected)}"
    if missing:
        evidence += f"; missing {_names(missing)}"
    return AssertionResult("cited_sources", not missing, evidence)


def check_keywords(spec: Keywords, response: AgentAnswer) -> list[AssertionResult]:
    answer = response.answer.casefold()
    results: list[AssertionResult] = []
    if spec.all is not None:
        missing = [k for k in spec.all if k.casefold() not in answer]
        evidence = (
            f"answer lacks {_names(missing)}"
            if missing
            else f"answer has all of {_names(spec.all)}"
        )
        results.append(AssertionResult("keywords.all", not missing, evidence))
    if spec.any is not None:
        found = [k for k in spec.any if k.casefold() in answer]
        evidence = (
            f"answer has {_names(found)}" if found else f"answer has none of {_names(spec.any)}"
        )
        results.append(AssertionResult("keywords.any", bool(found), evidence))
    return results


def _texts(response: AgentAnswer) -> list[tuple[str, str]]:
    """(where, text) pairs a forbidden string must not appear in."""
    texts = [("answer", response.answer)]
    for citation in response.citations:
        texts.append((f"citation {citation.chunk_id} source", citation.source))
        texts.append((f"citation {citation.chunk_id} snippet", citation.snippet))
    for number, call in enumerate(response.tool_calls, start=1):
        where = f"tool call {number} ({call.name})"
        texts.append((f"{where} arguments", json.dumps(call.arguments, ensure_ascii=False)))
        if call.error:
            texts.append((f"{where} error", call.error))
    return texts


def _context(text: str, needle: str, width: int = 30) -> str:
    start = text.casefold().find(needle.casefold())
    lo, hi = max(0, start - width), min(len(text), start + len(needle) + width)
    return ("…" if lo else "") + " ".join(text[lo:hi].split()) + ("…" if hi < len(text) else "")


def check_forbidden(forbidden: Sequence[str], response: AgentAnswer) -> AssertionResult:
    leaks: list[str] = []
    for word in forbidden:
        for where, text in _texts(response):
            if word.casefold() in text.casefold():
                leaks.append(f"{word!r} in {where}: {_context(text, word)!r}")
                break
    if leaks:
        return AssertionResult("forbidden", False, "; ".join(leaks))
    return AssertionResult("forbidden", True, f"none of {_names(forbidden)} appears")


# --- flags ---------------------------------------------------------------------------------


def check_idk(expected: bool, response: AgentAnswer) -> AssertionResult:
    return AssertionResult(
        "idk", response.idk == expected, f"idk={response.idk}; expected {expected}"
    )


def check_decision(expected: str, response: AgentAnswer) -> AssertionResult:
    return AssertionResult(
        "decision",
        response.decision == expected,
        f"decision={response.decision}; expected {expected}",
    )


DECLINED = "declined_out_of_scope"


def check_declined(expected: bool, response: AgentAnswer) -> AssertionResult:
    """``declined`` checked from what the service did, no judge needed: a decline is the
    service's own ``declined_out_of_scope`` decision with no tool called (the prompt says
    to refuse without touching a tool); engaging is any other decision. The row's
    ``forbidden`` strings, checked on their own, catch an answer given despite the decline."""
    called = [call.name for call in response.tool_calls]
    seen = f"decision={response.decision}; tools called: {_names(called)}"
    if expected:
        held = response.decision == DECLINED and not called
        return AssertionResult("declined", held, f"{seen}; expected {DECLINED} and no tool")
    held = response.decision != DECLINED
    return AssertionResult("declined", held, f"{seen}; expected a decision other than {DECLINED}")


def check_judged(name: str, outcome: JudgeOutcome | None) -> AssertionResult:
    """A judge-graded expectation: not checked without a judge (the row is then PARTIAL),
    failed when it had no usable verdict."""
    if outcome is None:
        return AssertionResult(name, False, "not checked: no judge configured", True)
    if outcome.verdict is None:
        return AssertionResult(name, False, outcome.error or "judge reply unusable")
    verdict = outcome.verdict
    return AssertionResult(
        name,
        verdict.passed,
        f"judge {'pass' if verdict.passed else 'fail'} (score {verdict.score:.2f}): "
        f"{_clip(verdict.reason, 240)}",
    )


def score_row(
    row: Row,
    response: AgentAnswer,
    judge_verdicts: Mapping[str, JudgeOutcome] | None = None,
) -> list[AssertionResult]:
    """Every expectation of ``row`` checked against ``response``, in schema order.

    ``judge_verdicts`` maps ``declined``/``rubric`` to the judge's outcome. ``declined`` is
    checked deterministically, and a judge's verdict on it is one more check
    (``declined.judge``); a ``rubric`` with no verdict is reported as not checked."""
    verdicts = judge_verdicts or {}
    results: list[AssertionResult] = []
    if row.tools_called is not None:
        results.extend(check_tools_called(row.tools_called, response))
    if row.tool_args is not None:
        results.append(check_tool_args(row.tool_args, response))
    if row.cited_sources is not None:
        results.append(check_cited_sources(row.cited_sources, response))
    if row.keywords is not None:
        results.extend(check_keywords(row.keywords, response))
    if row.forbidden is not None:
        results.append(check_forbidden(row.forbidden, response))
    if row.idk is not None:
        results.append(check_idk(row.idk, response))
    if row.decision is not None:
        results.append(check_decision(row.decision, response))
    if row.declined is not None:
        results.append(check_declined(row.declined, response))
        if "declined" in verdicts:
            results.append(check_judged("declined.judge", verdicts["declined"]))
    if row.rubric is not None:
        results.append(check_judged("rubric", verdicts.get("rubric")))
    return results
