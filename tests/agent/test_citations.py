"""Citation markers: extraction, stripping invented ones, and the streaming filter."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agent.citations import (
    SNIPPET_CHARS,
    ChunkInfo,
    Citation,
    CitationStreamFilter,
    cited_ids,
    extract_citations,
    snippet,
    strip_hallucinated,
)

GOOD = "0123456789ab"
OTHER = "a1b2c3d4e5f6"
BAD = "deadbeef0000"
RETRIEVED = {
    GOOD: ChunkInfo("user/occupancy.md", "Live occupancy", "Occupancy is   updated\nevery minute."),
    OTHER: ChunkInfo("developer/sensors.md", None, "Sensors report " + "readings " * 60),
}


def test_extract_citations_resolves_dedupes_and_strips() -> None:
    answer = (
        f"Occupancy updates every minute [^{GOOD}]. Sensors report readings [^{OTHER}][^{BAD}]. "
        f"Again [^{GOOD}] and an invented one [^{BAD}] here [^nope]."
    )
    result = extract_citations(answer, RETRIEVED)
    assert result.citations == [
        Citation(GOOD, "user/occupancy.md", "Live occupancy", "Occupancy is updated every minute."),
        Citation(OTHER, "developer/sensors.md", None, snippet(RETRIEVED[OTHER].text)),
    ]
    assert result.hallucinated == [BAD, "nope"]
    assert result.answer == (
        f"Occupancy updates every minute [^{GOOD}]. Sensors report readings [^{OTHER}]. "
        f"Again [^{GOOD}] and an invented one here."
    )


def test_extract_citations_without_markers() -> None:
    result = extract_citations("Hello there.", RETRIEVED)
    assert (result.citations, result.hallucinated, result.answer) == ([], [], "Hello there.")


def test_snippet_is_short_and_normalised() -> None:
    text = RETRIEVED[OTHER].text
    cut = snippet(text)
    assert len(cut) <= SNIPPET_CHARS
    assert cut.endswith("…") and "  " not in cut
    assert snippet("a\n\tb   c") == "a b c"
    assert len(snippet("x" * 1000)) == SNIPPET_CHARS


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"Foo [^{BAD}]. Bar", "Foo. Bar"),
        (f"Foo [^{BAD}] bar", "Foo bar"),
        (f"Foo[^{BAD}] bar", "Foo bar"),
        (f"Foo [^{BAD}]", "Foo"),
        (f"Foo [^{BAD}]bar", "Foo bar"),
        (f"Foo [^{GOOD}][^{BAD}].", f"Foo [^{GOOD}]."),
        (f"Foo [^{BAD}][^{GOOD}].", f"Foo [^{GOOD}]."),
        (f"Foo [^{BAD}] [^{BAD}], bar", "Foo, bar"),
        (f"Foo [^{BAD}]\nBar", "Foo\nBar"),
        (f"(see [^{BAD}])", "(see)"),
        (f"[[^{BAD}]", ""),  # fragments right before an invented marker go with it
        (f"[^ab[^{BAD}]", ""),
        (f"a [ [^{BAD}] b", "a b"),
        ("a [^] b [^x y] c [not] d", "a [^] b [^x y] c [not] d"),
        ("[^" + "a" * 65 + "]", "[^" + "a" * 65 + "]"),
        ("x [^" + "a" * 64 + "].", "x."),
        # a deletion never glues the text around it into a new (invented) marker
        (f"[^ab[^{BAD}]c]", "c]"),
        (f"[[^{BAD}]^ab]", "^ab]"),
        (f"see [^ab [^{BAD}]]", "see]"),
        (f"see [^ab [^{BAD}] x]", "see x]"),
        (f"[^ab[^{GOOD}]", f"[^ab[^{GOOD}]"),
    ],
)
def test_strip_hallucinated(text: str, expected: str) -> None:
    assert strip_hallucinated(text, RETRIEVED.keys()) == expected
    assert _stream(text, [len(text)]) == expected


def test_cited_ids_accepts_any_short_id() -> None:
    assert cited_ids("a [^x] b [^Chunk_1-2] [^x] [^" + "z" * 65 + "]") == ["x", "Chunk_1-2"]


def _stream(text: str, cuts: list[int], valid: set[str] | None = None) -> str:
    filt = CitationStreamFilter(valid if valid is not None else set(RETRIEVED))
    bounds = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return "".join(filt.feed(text[a:b]) for a, b in itertools.pairwise(bounds)) + filt.flush()


def test_stream_filter_holds_partial_markers_and_reports_citations() -> None:
    filt = CitationStreamFilter({GOOD})
    assert filt.feed("Busy ") == "Busy"  # the space waits: a marker may follow
    assert filt.feed("[") == ""
    assert filt.feed("^0123") == ""
    assert filt.pop_citations() == []
    assert filt.feed("456789ab]") == f" [^{GOOD}]"
    assert filt.pop_citations() == [GOOD]
    assert filt.feed(f" room [^{BAD}") == " room"
    assert filt.feed("]") == ""  # invented: never sent
    assert filt.feed(". Also [^") == ". Also"
    assert filt.feed(f"{GOOD}] [") == f" [^{GOOD}]"
    assert filt.pop_citations() == []  # each id once per stream
    assert filt.feed("x") == " [x"  # proven not a marker
    assert filt.flush() == ""
    assert filt.cited == [GOOD] and filt.hallucinated == [BAD]
    with pytest.raises(RuntimeError):
        filt.feed("more")


def test_stream_filter_flushes_a_dangling_partial_marker() -> None:
    filt = CitationStreamFilter({GOOD})
    assert filt.feed("see [^01") == "see"
    assert filt.flush() == " [^01"


# Texts rich in markers, partial markers, brackets, spaces and punctuation.
PIECES = st.sampled_from(
    [
        f"[^{GOOD}]",
        f"[^{OTHER}]",
        f"[^{BAD}]",
        "[^x]",
        "[^",
        "[",
        "]",
        "^",
        " ",
        "  ",
        "\t",
        "\n",
        ".",
        ",",
        ")",
        "word",
        "a",
        "é",
        "[^" + "b" * 64 + "]",
        "[^" + "c" * 65 + "]",
    ]
)
TEXTS = st.lists(PIECES, max_size=25).map("".join) | st.text(
    alphabet=st.sampled_from(list("[^]ab0 .\n,x")), max_size=40
)


@settings(max_examples=500, deadline=None)
@given(
    text=TEXTS,
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=15),
    valid=st.sets(st.sampled_from([GOOD, OTHER, "x", "b" * 64])),
)
@example(text=f"Foo [^{BAD}] [^{BAD}]. ", cuts=[5, 6, 12], valid={GOOD})
def test_stream_filter_equals_strip_hallucinated_for_any_split(
    text: str, cuts: list[int], valid: set[str]
) -> None:
    expected = strip_hallucinated(text, valid)
    filt = CitationStreamFilter(valid)
    bounds = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    outputs = [filt.feed(text[a:b]) for a, b in itertools.pairwise(bounds)]
    outputs.append(filt.flush())
    assert "".join(outputs) == expected
    # no invented marker in the output, not even one split over outputs or glued together
    assert set(cited_ids("".join(outputs))) <= valid
    assert filt.cited == [i for i in cited_ids(text) if i in valid]
    assert filt.hallucinated == [i for i in cited_ids(text) if i not in valid]
