"""``conversations.recheck``: stored turns as a reader may see them now. A citation of a chunk
the reader cannot see is dropped with its snippet and the answer that cited it is withheld;
a turn whose citations are all visible, or that cited nothing, is unchanged; nothing is
changed in place (a reader whose access comes back sees the turn whole)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from conversations.recheck import WITHHELD_ANSWER, cited_chunk_ids, recheck
from conversations.store import Turn, TurnRecord
from foundation.records import CitationOut as Citation
from foundation.records import ToolCallTrace

NOW = datetime(2026, 12, 4, tzinfo=UTC)


def cite(chunk_id: str) -> Citation:
    return Citation(
        chunk_id=chunk_id, source=f"{chunk_id}.md", section="S", snippet=f"text {chunk_id}"
    )


def turn(number: int, answer: str, *chunk_ids: str) -> Turn:
    record = TurnRecord(
        question=f"q{number}",
        answer=answer,
        decision="answered",
        idk=False,
        model="m",
        citations=tuple(cite(c) for c in chunk_ids),
        tool_calls=(
            ToolCallTrace(
                name="search_docs", arguments={"query": "q"}, ok=True, error=None, duration_ms=1.0
            ),
        ),
    )
    return Turn(number=number, created_at=NOW, record=record)


TURNS = [
    turn(1, "Rollbacks need a manifest [^aaa]. Readers sync [^bbb].", "aaa", "bbb"),
    turn(2, "Readers sync nightly [^bbb].", "bbb"),
    turn(3, "Hello."),
]


def test_the_cited_ids_of_every_turn() -> None:
    assert cited_chunk_ids(TURNS) == {"aaa", "bbb"}
    assert cited_chunk_ids([]) == set()


def test_a_hidden_citation_is_dropped_and_its_answer_withheld() -> None:
    one, two, three = recheck(TURNS, visible={"bbb"})
    assert one.answer_withheld and one.record.answer == WITHHELD_ANSWER
    assert [c.chunk_id for c in one.record.citations] == ["bbb"]
    assert "aaa" not in repr(one.record.citations) and "manifest" not in one.record.answer
    # what the reader wrote and the trace stay
    assert (one.record.question, one.record.tool_calls) == ("q1", TURNS[0].record.tool_calls)
    assert (two, three) == (TURNS[1], TURNS[2])  # all visible, or nothing cited: as stored
    # nothing changed in place: with access back, the turn is whole again
    assert recheck(TURNS, visible={"aaa", "bbb"}) == TURNS


def test_a_withheld_answer_is_the_services_note() -> None:
    """Who wrote the answer shown: the note is the service's, whoever wrote the stored one."""
    stored = [replace(t, record=replace(t.record, answered_by="model")) for t in TURNS]
    one, two, _ = recheck(stored, visible={"bbb"})
    assert (one.record.answer, one.record.answered_by) == (WITHHELD_ANSWER, "service")
    assert two.record.answered_by == "model"  # shown as stored
    assert recheck(stored, visible={"aaa", "bbb"}) == stored


def test_nothing_visible_withholds_every_answer_that_cited_something() -> None:
    got = recheck(TURNS, visible=set())
    assert [t.answer_withheld for t in got] == [True, True, False]
    assert [t.record.citations for t in got] == [(), (), ()]
    assert got[2] == TURNS[2]
