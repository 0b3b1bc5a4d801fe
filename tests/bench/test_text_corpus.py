"""The known-item corpus of ``bench.text_corpus`` on hand-made docstrings (the real one reads
every installed docstring, minutes; its figures are in bench/RESULTS.md)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from bench import text_corpus
from bench.text_corpus import DocEntry, build_known_items, known_item, paragraphs, query_source

DOC = """Return the number of seconds since the epoch as a float value.

The epoch is the point where the time starts, and is platform dependent. On
Windows and most Unix systems the epoch is January 1, 1970.

Note that even though the time is always returned as a floating point number."""


def test_a_known_item_is_the_first_sentence_and_the_paragraph_after_it() -> None:
    query, answer = known_item(DOC) or ("", "")
    assert query == "Return the number of seconds since the epoch as a float value."
    assert answer.startswith("The epoch is the point where the time starts")
    assert answer.endswith("January 1, 1970.")
    # the sentence leads the first paragraph: the rest of that paragraph is the answer
    inline = "Open the file and return a stream. " + "The mode says how the file is read. " * 3
    assert known_item(inline) == (
        "Open the file and return a stream.",
        ("The mode says how the file is read. " * 3).strip(),
    )


@pytest.mark.parametrize(
    "doc",
    [
        "Too short. The rest of this docstring is long enough to be a paragraph on its own.",
        "One sentence only, with no answer after it at all",
        "Return x.y(z) for the a_b c_d e_f g_h.\n\nfoo(bar) -> baz(qux) == 1 + 2 * 3 ** 4 // 5 % 6",
    ],
)
def test_no_known_item_without_a_prose_query_and_answer(doc: str) -> None:
    assert known_item(doc) is None


def test_queries_come_from_the_standard_library_outside_its_tests(tmp_path: Path) -> None:
    stdlib = tmp_path / "lib" / "python3.11"
    assert query_source(stdlib / "json" / "decoder.py", stdlib)
    assert not query_source(stdlib / "site-packages" / "pip" / "x.py", stdlib)
    assert not query_source(stdlib / "test" / "test_json.py", stdlib)
    assert not query_source(tmp_path / "venv" / "site-packages" / "numpy" / "x.py", stdlib)


def _entries(n_targets: int, n_others: int) -> list[DocEntry]:
    docs: list[DocEntry] = []
    for i in range(n_targets):
        answer = f"target {i} answer paragraph with enough words to count here"
        docs.append(
            (
                [answer, f"target {i} second paragraph held out with its docstring"],
                (f"Query number {i} about something.", answer),
                f"mod{i}.py",
            )
        )
    for i in range(n_others):
        docs.append(
            (
                [f"other {i} paragraph {j} of a distractor docstring here" for j in range(3)],
                None,
                "",
            )
        )
    return docs


def _patch(monkeypatch: pytest.MonkeyPatch, docs: list[DocEntry]) -> None:
    leads = Counter(item[0].lower() for _, item, _ in docs if item)
    paras = Counter(p for ps, _, _ in docs for p in ps)
    monkeypatch.setattr(text_corpus, "_read_docstrings", lambda: (docs, leads, paras))


def test_build_known_items_holds_each_answer_once_and_the_rest_of_its_docstring_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _patch(monkeypatch, _entries(10, 20))
    items = build_known_items(40, 5, seed=1)
    assert len(items.texts) == 40 and len(set(items.texts)) == 40
    assert len(items.queries) == len(items.answers) == len(items.origins) == 5
    for query, answer, origin in zip(items.queries, items.answers, items.origins, strict=True):
        i = int(query.split()[2])
        assert items.texts[answer].startswith(f"target {i} answer")
        assert origin == f"mod{i}.py"
    held = {int(q.split()[2]) for q in items.queries}
    for text in items.texts:  # a query's other paragraphs are never in the corpus
        assert not any(text.startswith(f"target {i} second") for i in held)
    assert build_known_items(40, 5, seed=1) == items  # seeded
    assert build_known_items(40, 5, seed=2) != items


def test_ambiguous_queries_are_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = _entries(3, 10)
    # target 0's sentence also leads another docstring; target 1's answer is another's paragraph
    docs.append((["x y z w v u t s"], ("Query number 0 about something.", "x y z w v u t s"), "a"))
    docs.append(([docs[1][0][0]], None, ""))
    _patch(monkeypatch, docs)
    items = build_known_items(20, 1, seed=0)
    assert items.queries == ["Query number 2 about something."]
    with pytest.raises(SystemExit, match="known-item docstrings"):
        build_known_items(20, 2, seed=0)


def test_paragraphs_are_what_the_corpus_is_made_of() -> None:
    assert list(paragraphs("short\n\n" + "word " * 70)) == [" ".join(["word"] * 64)]
