"""Rated turns as golden-row candidates (``agent-service eval export-feedback``).

Each rated turn (``conversations.feedback.RatedTurn``; read here through ``RatedTurnLike``,
since evals does not import the conversations library) becomes one row of the dataset schema
(``evals.dataset.Row``), for a person to review before it joins a golden set:

* ``id``: ``feedback-<conversation id>-<turn>`` (stable: exporting again gives the same ids);
* ``question``: the turn's question, as typed (a follow-up may need the earlier turns to
  make sense on its own: the reviewer rewrites it standalone);
* ``as``: the rater, who asked it (a turn belongs to its asker): their ``sub``, and the roles
  and domains they had when they rated it (stored with the feedback);
* ``tools_called: {all: [...]}``: the tools whose calls succeeded in the turn, in order
  (``{none: true}`` when it called none);
* ``cited_sources``: the sources of the chunks its answer cited;
* ``rubric``: the rater's expected answer, when they gave one;
* ``tags``: ``from-feedback`` and ``feedback-up``/``feedback-down``.

Above each row, YAML comments say what a reviewer needs and the schema has no field for:
the rating, when, the trace id, the rater's comment and the answer that was rated (clipped).
For a thumbs-down turn the tools and sources are what the rated answer did, which its rater
judged wrong: check them against the expected answer.

A turn with nothing to expect (no expected answer, no successful tool call though it made
some, no citation) cannot be a row (a row needs an expectation): it is left out and listed
(``Export.skipped``), as is one the schema refuses.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import yaml
from pydantic import ValidationError

from evals.dataset import Row

TAG = "from-feedback"
ANSWER_CHARS = 300
COMMENT_CHARS = 500
# What YAML refuses anywhere in a stream (comments included), and what ends a comment line.
_NON_PRINTABLE = re.compile("[^\x09\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


class RatedTurnLike(Protocol):
    """What the export reads of a rated turn (``conversations.feedback.RatedTurn``)."""

    @property
    def conversation_id(self) -> uuid.UUID: ...
    @property
    def turn(self) -> int: ...
    @property
    def question(self) -> str: ...
    @property
    def answer(self) -> str: ...
    @property
    def decision(self) -> str: ...
    @property
    def trace_id(self) -> str | None: ...
    @property
    def rating(self) -> str: ...
    @property
    def comment(self) -> str | None: ...
    @property
    def expected_answer(self) -> str | None: ...
    @property
    def rater_sub(self) -> str: ...
    @property
    def rater_roles(self) -> tuple[str, ...]: ...
    @property
    def rater_domains(self) -> tuple[str, ...]: ...
    @property
    def rated_at(self) -> datetime: ...
    @property
    def tools_run(self) -> tuple[str, ...]: ...
    @property
    def cited_sources(self) -> tuple[str, ...]: ...
    @property
    def tool_calls(self) -> Sequence[object]: ...


@dataclass
class Export:
    """The candidates file's text, and what was left out."""

    text: str
    rows: int
    # Rated turns left out: (row id, why): nothing to expect, or not a valid row
    skipped: list[tuple[str, str]] = field(default_factory=list)


def row_id(turn: RatedTurnLike) -> str:
    return f"feedback-{turn.conversation_id}-{turn.turn}"


def candidate_row(turn: RatedTurnLike) -> dict[str, Any] | None:
    """The row (as YAML data, keys in the golden set's order), or None when there is
    nothing to expect."""
    row: dict[str, Any] = {"id": row_id(turn), "question": turn.question.strip()}
    identity: dict[str, Any] = {"sub": turn.rater_sub}
    identity["roles"] = list(turn.rater_roles)
    identity["domains"] = list(turn.rater_domains)
    row["as"] = identity
    if turn.tools_run:
        row["tools_called"] = {"all": list(turn.tools_run)}
    elif not turn.tool_calls:
        row["tools_called"] = {"none": True}
    if turn.cited_sources:
        row["cited_sources"] = list(turn.cited_sources)
    if turn.expected_answer and turn.expected_answer.strip():
        row["rubric"] = turn.expected_answer.strip()
    if not any(k in row for k in ("tools_called", "cited_sources", "rubric")):
        return None
    row["tags"] = [TAG, f"feedback-{turn.rating}"]
    return row


def _comment_text(text: str, limit: int) -> str:
    flat = _NON_PRINTABLE.sub("\ufffd", " ".join(text.split()))
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _notes(turn: RatedTurnLike) -> list[str]:
    lines = [
        f"rated {turn.rating} on {turn.rated_at.isoformat(timespec='seconds')}; "
        f"conversation {turn.conversation_id} turn {turn.turn}; "
        f"trace {turn.trace_id or '-'}; decision {turn.decision}",
    ]
    if turn.comment:
        lines.append(f"comment: {_comment_text(turn.comment, COMMENT_CHARS)}")
    lines.append(f"rated answer: {_comment_text(turn.answer, ANSWER_CHARS)}")
    if turn.rating == "down" and "rubric" not in (candidate_row(turn) or {}):
        lines.append("no expected answer given: write the rubric before using this row")
    return [f"  # {line}" for line in lines]


HEADER = """\
# Golden-row CANDIDATES from users' feedback (agent-service eval export-feedback).
# Review every row before adding it to a golden set: a follow-up's question may need the
# earlier turns; for a thumbs-down row, tools_called and cited_sources are what the rated
# answer did (judged wrong by its rater): correct them against the expected answer (rubric).
# `as` is the rater (the asker), with the roles and domains they had when rating.
"""


def export_candidates(turns: Iterable[RatedTurnLike], *, description: str | None = None) -> Export:
    """The candidates as a dataset file (``evals.dataset.load_dataset`` reads it back).
    With no row, the file holds the header and an empty ``rows``: not a loadable dataset,
    and the command says there was nothing to export."""
    chunks: list[str] = [HEADER, "version: 1\n"]
    text = description or "Golden-row candidates from user feedback (review before use)."
    chunks.append(yaml.safe_dump({"description": text}, allow_unicode=True, width=100))
    body: list[str] = []
    rows: list[dict[str, Any]] = []
    skipped: list[tuple[str, str]] = []
    for turn in turns:
        row = candidate_row(turn)
        if row is None:
            skipped.append((row_id(turn), "nothing to expect"))
            continue
        try:
            Row.model_validate(row)  # the dataset's own schema
        except ValidationError as exc:
            skipped.append((row_id(turn), f"not a valid row ({exc.error_count()} errors)"))
            continue
        rows.append(row)
        dumped = yaml.safe_dump([row], allow_unicode=True, sort_keys=False, width=100)
        body.append("\n".join([*_notes(turn), _indent(dumped)]))
    if rows:
        chunks.append("rows:\n" + "\n\n".join(body) + "\n")
    else:
        chunks.append("rows: []\n")
    return Export(text="".join(chunks), rows=len(rows), skipped=skipped)


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" if line else line for line in text.rstrip("\n").split("\n"))
