"""Retrieval-only eval: recall@k and MRR over distinct sources, asked as the row's user."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from evals.dataset import load_dataset
from evals.retrieval_eval import retrieval_markdown, run_retrieval_eval, score_sources, user_acl
from foundation.acl import caller_entries
from tests.evals.eval_helpers import write_dataset

U = "documentation/user"


@dataclass(frozen=True)
class Hit:
    source: str


@dataclass
class FakeRetriever:
    """Ranked sources per query; records each call's ACL and depth."""

    ranked: dict[str, list[str]]
    calls: list[tuple[str, list[str], int | None]] = field(default_factory=list)

    async def search(
        self, query: str, *, acl: Sequence[str], top_k: int | None = None
    ) -> list[Hit]:
        self.calls.append((query, list(acl), top_k))
        return [Hit(s) for s in self.ranked.get(query, [])][: top_k or 5]


DATASET = f"""
version: 1
defaults:
  as: {{sub: staff, roles: [business_staff], domains: [acme]}}
rows:
  - id: first-hit
    question: "  cooldown  "
    cited_sources: [{U}/occupancy-alerts.md]
  - id: second-source
    question: "export"
    as: {{sub: c, roles: [standard_customer], domains: [civic]}}
    cited_sources: [{U}/exporting-reports.markdown, {U}/faq.md]
  - id: missed
    question: "billing"
    cited_sources: [{U}/billing-and-seats.md]
  - id: no-sources
    question: "hi"
    idk: false
"""


async def test_recall_and_mrr_per_row_and_overall(tmp_path: Path) -> None:
    retriever = FakeRetriever(
        {
            "cooldown": [f"/abs/{U}/occupancy-alerts.md", f"/abs/{U}/occupancy-alerts.md"],
            # repeated chunks of one source count once: faq is the 2nd distinct source
            "export": [f"{U}/glossary.md", f"{U}/glossary.md", f"{U}/faq.md", f"{U}/x.md"],
            "billing": [f"{U}/a.md", f"{U}/b.md", f"{U}/c.md", f"{U}/billing-and-seats.md"],
        }
    )
    dataset = load_dataset(write_dataset(tmp_path, DATASET))
    report = await run_retrieval_eval(dataset, retriever, k=3)
    rows = {r.id: r for r in report.rows}
    assert list(rows) == ["first-hit", "second-source", "missed"]  # rows without sources skipped
    assert (rows["first-hit"].recall, rows["first-hit"].reciprocal_rank) == (1.0, 1.0)
    assert (rows["second-source"].recall, rows["second-source"].reciprocal_rank) == (0.5, 0.5)
    assert rows["second-source"].sources == [f"{U}/glossary.md", f"{U}/faq.md", f"{U}/x.md"]
    assert (rows["missed"].recall, rows["missed"].first_rank) == (0.0, None)  # 4th > k
    assert report.mean_recall == pytest.approx(0.5)
    assert report.mrr == pytest.approx(0.5)
    query, acl, depth = retriever.calls[0]
    assert query == "cooldown" and depth == 12
    assert acl == caller_entries(["business_staff"], ["acme"])
    assert retriever.calls[1][1] == caller_entries(["standard_customer"], ["civic"])
    text = retrieval_markdown(report)
    assert "mean recall@3 0.500; MRR@3 0.500" in text
    assert f"| `missed` | 0.00 | 0.00 | - | {U}/billing-and-seats.md |" in text


def test_score_sources_and_acl() -> None:
    row = score_sources("r", ["a.md", "b.md"], ["x/b.md", "x/a.md"])
    assert (row.recall, row.reciprocal_rank, row.first_rank) == (1.0, 1.0, 1)
    assert score_sources("r", ["a.md"], []).recall == 0.0
    from evals.dataset import Identity

    assert user_acl(Identity(sub="x", roles=["admin"], domains=[])) == caller_entries(["admin"], [])


class FakeStore:
    closed = False

    async def close(self) -> None:
        FakeStore.closed = True


def test_the_cli_retrieval_mode_writes_its_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command path with the store and retriever replaced (the real store is covered by
    the integration tests)."""
    import io

    import serve_app.wiring as wiring
    from serve_app.cli import EXIT_OK, EXIT_USAGE, main

    retriever = FakeRetriever({"cooldown": [f"{U}/occupancy-alerts.md"]})

    async def open_store(settings: object) -> FakeStore:
        return FakeStore()

    monkeypatch.setattr(wiring, "open_store", open_store)
    monkeypatch.setattr(wiring, "build_retriever", lambda settings, store: retriever)
    dataset = write_dataset(tmp_path, DATASET)
    out = io.StringIO()
    args = ["eval", str(dataset), "--retrieval", "--k", "2", "--split", "all"]
    code = main([*args, "--out-dir", str(tmp_path)], out)
    assert code == EXIT_OK
    assert FakeStore.closed
    text = (tmp_path / "retrieval.md").read_text()
    assert "split all: 3 rows with cited_sources; k = 2" in text
    assert "mean recall@2 0.333; MRR@2 0.333" in out.getvalue()
    assert [depth for _, _, depth in retriever.calls] == [8, 8, 8]
    code = main([*args, "--only", "no-sources"], io.StringIO())
    assert code == EXIT_USAGE
