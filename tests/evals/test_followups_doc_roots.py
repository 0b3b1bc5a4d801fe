"""A follow-up file over another corpus names the DOC_ROOTS it is served with (issue 42, item
1): its labels resolve under those folders, with their default ACLs; without them the loader
assumes the sample corpus's folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from evals.dataset import DatasetError
from evals.followups import load_followups

ROOT = Path(__file__).resolve().parents[2]

SECOND_ROOTS = """doc_roots:
  - "documentation-second/guides="
  - "documentation-second/reference=role:business_staff"
"""

BODY = """callers:
  staff: {roles: [business_staff], domains: [aurelia-health]}
  customer: {roles: [standard_customer], domains: [solace_hotels]}
conversations:
  - id: c1
    as: %s
    turns:
      - q: "first question"
      - q: "second question"
        standalone: "second question, standalone"
        answers: ["%s"]
"""

REFERENCE = "reference/workplace-settings-reference.md > Forecasts"
GUIDE = "guides/occupancy-forecasts.md > What is forecast"


def _write(tmp_path: Path, roots: str, caller: str, label: str) -> Path:
    path = tmp_path / "f.yaml"
    path.write_text(f"version: 1\ndocs: documentation-second\n{roots}" + BODY % (caller, label))
    return path


def test_labels_resolve_under_the_files_doc_roots(tmp_path: Path) -> None:
    dataset = load_followups(_write(tmp_path, SECOND_ROOTS, "staff", REFERENCE), repo_root=ROOT)
    (label,) = dataset.conversations[0].turns[1].labels
    assert label.page == "reference/workplace-settings-reference.md"
    assert label.section.endswith("Forecasts")


def test_the_doc_roots_default_acl_applies(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="not visible to customer"):
        load_followups(_write(tmp_path, SECOND_ROOTS, "customer", REFERENCE), repo_root=ROOT)
    load_followups(_write(tmp_path, SECOND_ROOTS, "customer", GUIDE), repo_root=ROOT)


def test_without_doc_roots_the_sample_folders_are_assumed(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such page"):
        load_followups(_write(tmp_path, "", "staff", GUIDE), repo_root=ROOT)


def test_a_bad_doc_roots_acl_is_a_dataset_error(tmp_path: Path) -> None:
    roots = 'doc_roots: ["documentation-second/guides=role:nobody"]\n'
    with pytest.raises(DatasetError, match="doc_roots"):
        load_followups(_write(tmp_path, roots, "staff", GUIDE), repo_root=ROOT)


def test_the_second_worlds_frozen_conversations_load() -> None:
    dataset = load_followups(ROOT / "evals/datasets/test-second-followups.yaml", repo_root=ROOT)
    assert len(dataset.conversations) >= 10
