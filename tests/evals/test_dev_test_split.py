"""dev and test (issue 42, build item 1): every golden row is on one side, by the recorded rule;
test.yaml and test-followups.yaml are test, followups.yaml is dev; no question is on both
sides; and no test question is copied into a file under tests/, bench/ or docs/.

The last check is the one that keeps the test split a measure no one fitted to: a test that
quotes a test question (or a note that does) would let the agent be tuned on it. It reads the
files as git lists them (tracked, and new files not ignored), so a report under the ignored
bench/out/ is not scanned; a report of a test run belongs under evals/reports/.
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from evals.dataset import DEFAULT_DATASETS, load_dataset, load_datasets
from evals.followups import (
    DEFAULT_FOLLOWUPS_DATASET,
    TEST_FOLLOWUPS_DATASET,
    load_followup_sets,
    load_followups,
)
from evals.splits import (
    GOLDEN_QUOTED_AT_SPLIT,
    GoldenRow,
    golden_kind,
    golden_sides,
    question_key,
    quotes,
    searchable,
)

ROOT = Path(__file__).resolve().parents[2]
DATASETS = ROOT / "evals" / "datasets"
GOLDEN = ROOT / "evals" / "datasets" / "golden.yaml"
TEST = ROOT / "evals" / "datasets" / "test.yaml"
SCANNED = ("tests", "bench", "docs")


@dataclass(frozen=True)
class Question:
    file: str  # the dataset file, relative to the repository
    row: str  # the row id, or "<conversation> turn N" / "<conversation> turn N standalone"
    text: str


def dataset_files() -> Iterator[tuple[Path, str]]:
    """Every file under evals/datasets/ in a format with dev and test: ``golden`` (rows) or
    ``followups`` (conversations). The labelled retrieval benchmark (rows with ``callers``)
    has its own train/held-out split (evals/splits.py) and is not one of them."""
    for path in sorted(DATASETS.glob("*.yaml")):
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        if isinstance(raw, dict) and "conversations" in raw:
            yield path, "followups"
        elif isinstance(raw, dict) and "rows" in raw and "callers" not in raw:
            yield path, "golden"


def questions_by_side() -> dict[str, list[Question]]:
    """Every question of every dataset file, by side: golden-format rows' questions, and
    follow-up conversations' turns and standalone forms."""
    sides: dict[str, list[Question]] = {"dev": [], "test": []}
    for path, kind in dataset_files():
        name = str(path.relative_to(ROOT))
        if kind == "golden":
            for case in load_dataset(path).cases:
                sides[case.split].append(Question(name, case.id, case.row.question))
            continue
        for conversation in load_followups(path, repo_root=ROOT).conversations:
            for number, turn in enumerate(conversation.turns, start=1):
                where = f"{conversation.id} turn {number}"
                sides[conversation.split].append(Question(name, where, turn.question))
                if turn.standalone:
                    standalone = Question(name, f"{where} standalone", turn.standalone)
                    sides[conversation.split].append(standalone)
    return sides


def scanned_files() -> list[Path]:
    """The files under tests/, bench/ and docs/: git's list (tracked, and untracked ones not
    ignored) when this is a checkout, else a walk that skips caches and bench/out."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", *SCANNED],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.decode()
        files = [ROOT / name for name in listed.split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for top in SCANNED:
            for folder, dirs, names in os.walk(ROOT / top):
                dirs[:] = [d for d in dirs if not d.startswith((".", "__")) and d != "out"]
                files += [Path(folder) / name for name in names]
    return sorted(path for path in files if path.is_file())


def texts() -> dict[str, tuple[str, str]]:
    found: dict[str, tuple[str, str]] = {}
    for path in scanned_files():
        try:
            found[str(path.relative_to(ROOT))] = searchable(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue  # images and other binaries hold no question
    return found


# --- the leak scan ------------------------------------------------------------------------------


def test_no_test_question_appears_under_tests_bench_or_docs() -> None:
    files = texts()
    assert len(files) > 100  # the scan sees the repository, not an empty list
    leaks = [
        f"{name}: quotes the test question of {q.file} {q.row}: {q.text!r}"
        for q in questions_by_side()["test"]
        for name, views in files.items()
        if question_key(q.text) in views[0] + views[1] and quotes(views, q.text)
    ]
    assert not leaks, (
        "test-split questions are frozen: no file under tests/, bench/ or docs/ may copy one "
        "(write your own question, or use a dev row; evals/README.md, 'dev and test'):\n"
        + "\n".join(leaks)
    )


def test_the_scan_finds_a_quote_however_it_is_written() -> None:
    question = "How long can a sensor stay silent before it is flagged?"
    for text in (
        f'ask("{question}")',
        'ASK = "how long can a SENSOR stay\n    silent before it is flagged?"',
        'ASK = (\n    "How long can a sensor stay silent "\n    "before it is flagged?"\n)',
        f"- a bench note: `{question}` scored 0.5",
    ):
        assert quotes(searchable(text), question), text
    for text in (
        "How long can a sensor stay silent before it is flagged",
        "Xhow long can a sensor stay silent before it is flagged?",
    ):
        assert not quotes(searchable(text), question), text


def test_no_question_is_on_both_sides() -> None:
    sides = questions_by_side()
    dev = {question_key(q.text): q for q in sides["dev"]}
    both = [
        f"{q.file} {q.row} (test) and {dev[question_key(q.text)].file} "
        f"{dev[question_key(q.text)].row} (dev): {q.text!r}"
        for q in sides["test"]
        if question_key(q.text) in dev
    ]
    assert not both, "\n".join(both)


# --- the sides ----------------------------------------------------------------------------------


def test_test_yaml_and_test_followups_are_test_and_followups_yaml_is_dev() -> None:
    assert {case.split for case in load_dataset(TEST).cases} == {"test"}
    test_followups = load_followups(ROOT / TEST_FOLLOWUPS_DATASET, repo_root=ROOT)
    assert {c.split for c in test_followups.conversations} == {"test"}
    followups = load_followups(ROOT / DEFAULT_FOLLOWUPS_DATASET, repo_root=ROOT)
    assert {c.split for c in followups.conversations} == {"dev"}


def test_every_golden_row_names_its_side() -> None:
    raw = yaml.safe_load(GOLDEN.read_text(encoding="utf-8"))
    unnamed = [row["id"] for row in raw["rows"] if "split" not in row]
    assert not unnamed, f"golden.yaml rows without a split: key: {unnamed}"


def golden_rows() -> list[GoldenRow]:
    return [GoldenRow(c.id, c.row.question, tuple(c.row.tags)) for c in load_dataset(GOLDEN).cases]


def test_the_golden_sides_are_the_recorded_rule() -> None:
    """golden.yaml's split: keys equal evals.splits.golden_sides over its rows, with the rows
    that were quoted when the split was made: the keys are data, the rule says why."""
    recorded = {case.id: case.split for case in load_dataset(GOLDEN).cases}
    assert set(recorded) >= GOLDEN_QUOTED_AT_SPLIT
    assert golden_sides(golden_rows(), GOLDEN_QUOTED_AT_SPLIT) == recorded


def test_the_golden_split_is_balanced_by_kind() -> None:
    rows = golden_rows()
    sides = {case.id: case.split for case in load_dataset(GOLDEN).cases}
    units: dict[str, list[GoldenRow]] = {}
    for row in rows:
        units.setdefault(question_key(row.question), []).append(row)
    kinds: dict[str, Counter[str]] = {}
    for members in units.values():
        assert len({sides[r.id] for r in members}) == 1, [r.id for r in members]
        kinds.setdefault(golden_kind(members[0].tags), Counter())[sides[members[0].id]] += 1
    for kind, count in kinds.items():
        assert count["dev"] >= (count["dev"] + count["test"]) // 2, (kind, count)
    assert Counter(sides.values()) == {"dev": 41, "test": 26}


def test_the_rule_on_a_small_set() -> None:
    rows = [
        GoldenRow("a", "Q one?", ("doc", "paraphrase")),
        GoldenRow("a2", "q  ONE?", ("doc", "permission")),  # the same question: one unit
        GoldenRow("b", "Q two?", ("doc", "paraphrase")),
        GoldenRow("c", "Q three?", ("doc", "paraphrase")),
        GoldenRow("d", "Q four?", ("doc", "paraphrase")),
        GoldenRow("e", "Hi", ("greeting",)),
    ]
    sides = golden_sides(rows, quoted={"c"})
    assert sides["a"] == sides["a2"]
    assert sides["c"] == "dev"  # quoted
    assert Counter(sides[i] for i in "abcd") == {"dev": 2, "test": 2}  # half of 4 kinds
    assert sides["e"] == "test"  # a kind of one: half rounded down is none
    assert golden_sides(rows, quoted={"c"}) == sides  # a pure function
    assert golden_sides(rows, quoted={"e", "c", "d"})["e"] == "dev"


def test_the_default_files_split_as_documented() -> None:
    dataset = load_datasets([ROOT / path for path in DEFAULT_DATASETS])
    counts = Counter(case.split for case in dataset.cases)
    assert counts["dev"] == 41 and counts["test"] == 26 + len(load_dataset(TEST).cases)
    followups = load_followup_sets(
        [ROOT / DEFAULT_FOLLOWUPS_DATASET, ROOT / TEST_FOLLOWUPS_DATASET], repo_root=ROOT
    )
    per_side = Counter(c.split for c in followups.conversations)
    assert per_side["dev"] == 41 and per_side["test"] >= 28


@pytest.mark.parametrize("side", ["dev", "test"])
def test_followup_sets_select_a_side(side: str) -> None:
    chosen = load_followup_sets(
        [ROOT / DEFAULT_FOLLOWUPS_DATASET, ROOT / TEST_FOLLOWUPS_DATASET],
        split=side,  # type: ignore[arg-type]
        repo_root=ROOT,
    )
    assert {c.split for c in chosen.conversations} == {side}
    assert chosen.split == side
    assert chosen.split_line().startswith(f"split {side}: {len(chosen.conversations)} conv")
