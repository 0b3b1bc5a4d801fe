"""Claims bound to their evidence (issue 42, item 3): a figure the evidence holds is still
ungrounded when the answer says it of something else, or in another unit. Property tests over
generated violations, with invented attributes and values (no estate or corpus of ours)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st

from agent.grounding import build_evidence, ungrounded

ATTRIBUTES = (
    ("capacity", "capacity"),
    ("floor_area_m2", "floor area"),
    ("refresh_interval", "refresh interval"),
    ("retention_days", "retention period"),
    ("max_bookings", "max bookings"),
    ("badge_count", "badge count"),
)
values = st.integers(min_value=2, max_value=9_999)


def missing(answer: str, *evidence: Any) -> list[str]:
    texts = [e if isinstance(e, str) else json.dumps(e) for e in evidence]
    return ungrounded(answer, build_evidence(texts))


@given(
    pair=st.permutations(range(len(ATTRIBUTES))).map(lambda p: p[:2]),
    first=values,
    second=values,
)
def test_a_real_number_moved_to_another_fields_attribute_is_flagged(
    pair: list[int], first: int, second: int
) -> None:
    assume(first != second)
    (key_a, words_a), (key_b, words_b) = ATTRIBUTES[pair[0]], ATTRIBUTES[pair[1]]
    record = {"room": {key_a: first, key_b: second}}
    assert missing(f"The room's {words_a} is {first}.", record) == []
    assert missing(f"The room's {words_b} is {first}.", record) == [str(first)]


@given(
    first=values,
    second=values,
    subjects=st.sampled_from([("tiles", "alerts"), ("exports", "reminders"), ("badges", "logs")]),
)
def test_a_number_taken_from_another_sentence_is_flagged(
    first: int, second: int, subjects: tuple[str, str]
) -> None:
    assume(first != second)
    one, other = subjects
    page = f"The {one} refresh every {first} seconds. The {other} are delayed by {second} seconds."
    assert missing(f"The {one} refresh every {first} seconds.", page) == []
    assert missing(f"The {one} refresh every {second} seconds.", page) == [f"{second} seconds"]


@given(
    value=values, units=st.sampled_from([("people", "m²"), ("m²", "people"), ("seconds", "ppm")])
)
def test_a_unit_swapped_for_another_quantitys_is_flagged(
    value: int, units: tuple[str, str]
) -> None:
    stated, swapped = units
    page = f"The hall is rated for {value} {stated}."
    assert missing(f"The hall is rated for {value} {stated}.", page) == []
    assert missing(f"The hall is rated for {value} {swapped}.", page) != []


def test_a_figure_said_in_other_words_of_the_same_field_is_kept() -> None:
    """No synonym list: a figure whose words share nothing with any other statement stands
    ("holds 14 people" of a capacity field), as does one under its field's own name."""
    record = {"room": {"name": "Annex", "capacity": 14, "floor": 3}}
    assert missing("The Annex holds 14 people and is on floor 3.", record) == []
    assert missing("Its capacity is 14.", record) == []
