"""The train/held-out split of the retrieval benchmarks (issue 16, item 4)."""

from __future__ import annotations

from pathlib import Path

from evals.retrieval_labels import DEFAULT_QUALITY_DATASET, load_quality_dataset
from evals.splits import SPLITS, select_split, split_counts, split_of

ROOT = Path(__file__).resolve().parents[2]


def test_the_split_is_a_pure_function_of_the_key() -> None:
    keys = [f"q{i:04d}" for i in range(2000)]
    first = [split_of(k) for k in keys]
    assert first == [split_of(k) for k in keys]
    # Pinned: a change of salt or hash would silently move rows between the sides.
    pinned = ("alerts-types", "alerts-hysteresis", "alerts-create-rule", "q0000")
    assert [split_of(k) for k in pinned] == ["train", "heldout", "train", "heldout"]
    share = first.count("train") / len(first)
    assert 0.57 < share < 0.63


def test_the_sides_are_disjoint_and_cover_every_row() -> None:
    rows = [f"row-{i}" for i in range(500)]
    train = select_split(rows, str, "train")
    heldout = select_split(rows, str, "heldout")
    assert not set(train) & set(heldout)
    assert sorted(train + heldout) == sorted(rows)
    assert select_split(rows, str, None) == rows


def test_adding_rows_moves_no_existing_row() -> None:
    rows = [f"row-{i}" for i in range(300)]
    before = set(select_split(rows, str, "heldout"))
    after = set(select_split([*rows, *(f"new-{i}" for i in range(100))], str, "heldout"))
    assert after & set(rows) == before


def test_the_labelled_questions_split_in_every_category() -> None:
    dataset = load_quality_dataset(ROOT / DEFAULT_QUALITY_DATASET, repo_root=ROOT)
    counts = split_counts(dataset.rows, lambda r: r.id, lambda r: r.category)
    assert sum(n for c in counts.values() for n in c.values()) == len(dataset.rows)
    for category, sides in counts.items():
        assert all(sides[s] > 0 for s in SPLITS), category
