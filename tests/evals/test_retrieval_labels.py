"""The labelled retrieval benchmark: its loader on a small tree of pages, and the real file
against the real sample documentation (every label a real section of a real page)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from evals.dataset import DatasetError
from evals.retrieval_labels import (
    ANSWERABLE,
    ANSWERS,
    CATEGORIES,
    RELATED,
    DocCorpus,
    QualityDataset,
    load_quality_dataset,
    sample_doc_roots,
)
from foundation.acl import is_visible
from tests.evals.retrieval_helpers import make_repo, write_rows

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "evals/datasets/retrieval_sample.yaml"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path)


write = write_rows


def problems(repo: Path, rows: str) -> list[str]:
    with pytest.raises(DatasetError) as caught:
        load_quality_dataset(write(repo, rows), repo_root=repo)
    return caught.value.problems


def test_labels_resolve_to_full_section_paths_with_grades(repo: Path) -> None:
    path = write(
        repo,
        """\
        - id: good
          category: multi-section
          as: staff
          q: "  How?  "
          answers: ["user/a.md > Alpha > Steps", "developer/b.md > Gamma"]
          related: ["user/a.md > Page A", "user/a.md > Alpha"]
        - id: none
          category: unanswerable
          as: std
          q: "Nothing?"
        - id: hidden
          category: acl-hidden
          as: staff
          q: "Keys?"
          hidden: ["user/secret.md > Keys"]
        """,
    )
    dataset = load_quality_dataset(path, repo_root=repo)
    good, none, hidden = dataset.rows
    assert [(label.page, label.section, label.grade) for label in good.labels] == [
        ("user/a.md", "Page A > Alpha > Steps", ANSWERS),
        ("developer/b.md", "Page B > Gamma", ANSWERS),
        ("user/a.md", "Page A", RELATED),  # the intro, before any sub-heading
        ("user/a.md", "Page A > Alpha", RELATED),
    ]
    assert good.answer_keys == {
        ("user/a.md", "Page A > Alpha > Steps"),
        ("developer/b.md", "Page B > Gamma"),
    }
    assert good.answerable and not none.answerable and not hidden.answerable
    assert none.labels == () and hidden.hidden[0].section == "Secret > Keys"
    assert good.caller.acl == ["domain:acme", "role:business_staff", "role:standard_customer"]


def test_every_problem_names_the_row_and_the_label(repo: Path) -> None:
    found = problems(
        repo,
        """\
        - id: no-page
          category: lexical
          as: std
          q: "q"
          answers: ["user/missing.md > Alpha"]
        - id: no-heading
          category: lexical
          as: std
          q: "q"
          answers: ["user/a.md > Gamma"]
        - id: ambiguous
          category: lexical
          as: std
          q: "q"
          answers: ["user/a.md > Steps"]
        - id: empty-section
          category: lexical
          as: std
          q: "q"
          answers: ["user/a.md > Empty"]
        - id: not-readable
          category: lexical
          as: std
          q: "q"
          answers: ["developer/b.md > Gamma"]
        - id: hidden-but-readable
          category: acl-hidden
          as: admin
          q: "q"
          hidden: ["user/secret.md > Keys"]
        - id: no-caller
          category: lexical
          as: nobody
          q: "q"
          answers: ["user/a.md > Alpha"]
        - id: twice
          category: lexical
          as: std
          q: "q"
          answers: ["user/a.md > Alpha"]
          related: ["user/a.md > Page A > Alpha"]
        - id: twice
          category: unanswerable
          as: std
          q: "q"
          related: ["user/a.md > Alpha"]
        - id: one-part
          category: multi-section
          as: std
          q: "q"
          answers: ["user/a.md > Alpha"]
        - id: no-separator
          category: lexical
          as: std
          q: "q"
          answers: ["user/a.md Alpha"]
        """,
    )
    text = "\n".join(found)
    for expected in [
        "row 1 (id 'no-page'): answers: 'user/missing.md > Alpha': no such page",
        "row 2 (id 'no-heading'): answers: 'user/a.md > Gamma': page user/a.md has no section",
        "row 3 (id 'ambiguous'): answers: 'user/a.md > Steps': names 2 sections",
        "row 4 (id 'empty-section'): answers: 'user/a.md > Empty': page user/a.md has no",
        "row 5 (id 'not-readable'): 'developer/b.md' is not visible to std",
        "row 6 (id 'hidden-but-readable'): hidden: 'user/secret.md' is visible to admin",
        "row 7 (id 'no-caller'): as: unknown caller 'nobody'",
        "row 8 (id 'twice'): 'user/a.md > Page A > Alpha' is labelled twice",
        "row 9 (id 'twice'): id: duplicate of row 8",
        "row 9 (id 'twice'): answers/related: a unanswerable row has none to label",
        "row 10 (id 'one-part'): answers: a multi-section row needs at least two sections",
        "row 11 (id 'no-separator'): answers: 'user/a.md Alpha': expected '<page> > <section>'",
    ]:
        assert expected in text, f"missing {expected!r} in:\n{text}"
    assert all(line.startswith(str(repo / "evals/datasets/labels.yaml")) for line in found)


def test_schema_problems_name_the_row_and_field(repo: Path) -> None:
    found = problems(
        repo,
        """\
        - id: typo
          category: lexical
          as: std
          q: "q"
          answer: ["user/a.md > Alpha"]
        - id: bad-category
          category: vague
          as: std
          q: "q"
        """,
    )
    assert any("row 1 (id 'typo'): answer: unknown key" in p for p in found)
    assert any("row 2 (id 'bad-category'): category:" in p for p in found)


def test_sources_map_to_page_keys(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = DocCorpus(repo / "documentation", sample_doc_roots(repo))
    absolute = (repo / "documentation/user/a.md").as_posix()
    assert corpus.key_of(absolute) == "user/a.md"
    monkeypatch.chdir(repo)
    assert corpus.key_of("documentation/developer/b.md") == "developer/b.md"  # relative root
    assert corpus.key_of("/elsewhere/user/a.md") is None
    assert corpus.page("user/secret.md") is not None
    assert corpus.page("user/secret.md").acl == ("role:admin",)  # type: ignore[union-attr]
    assert corpus.page("developer/b.md").acl == ("role:business_staff",)  # type: ignore[union-attr]
    assert corpus.page("../outside.md") is None


# --- the real benchmark ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real() -> QualityDataset:
    return load_quality_dataset(REAL)


def test_the_benchmark_is_big_enough_and_covers_every_category(real: QualityDataset) -> None:
    counts = {c: sum(r.category == c for r in real.rows) for c in CATEGORIES}
    assert len(real.rows) >= 150
    assert counts["unanswerable"] >= 15 and counts["acl-hidden"] >= 5
    assert counts["multi-section"] >= 15
    assert all(counts[c] >= 30 for c in ("exact-token", "lexical", "paraphrase"))
    assert sum(counts[c] for c in ANSWERABLE) >= 150


def _heading_lines(path: Path) -> set[str]:
    """The ATX heading texts of a page, read without the chunker."""
    found = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.fullmatch(r" {0,3}#{1,6}[ \t]+(.*?)[ \t]*", line)
        if match:
            found.add(match.group(1))
    return found


def test_every_label_points_at_a_real_section_of_a_real_page(real: QualityDataset) -> None:
    docs = ROOT / "documentation"
    for row in real.rows:
        for label in (*row.labels, *row.hidden):
            path = docs / label.page
            assert path.is_file(), f"{row.id}: {label.page}"
            page = real.corpus.page(label.page)
            assert page is not None and label.section in page.sections, f"{row.id}: {label}"
            # every heading of the section path is a heading line of the file
            missing = set(label.section.split(" > ")) - _heading_lines(path)
            assert not missing, f"{row.id}: {label.page} has no heading {missing}"


def test_labels_respect_who_asks(real: QualityDataset) -> None:
    for row in real.rows:
        for label in row.labels:
            page = real.corpus.page(label.page)
            assert page is not None and is_visible(page.acl, row.caller.acl), row.id
        for label in row.hidden:
            page = real.corpus.page(label.page)
            assert page is not None and not is_visible(page.acl, row.caller.acl), row.id
    hidden_callers = {row.caller.name for row in real.rows if row.category == "acl-hidden"}
    # the trick callers of FACTS.md: a domain named like a role unlocks nothing
    assert {"std_domain_named_admin", "std_domain_named_business_admin"} <= hidden_callers


def test_row_ids_are_unique_and_answerable_rows_have_an_answer(real: QualityDataset) -> None:
    assert len({row.id for row in real.rows}) == len(real.rows)
    for row in real.rows:
        assert bool(row.answer_keys) == row.answerable, row.id
