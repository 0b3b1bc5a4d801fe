"""How finished documents are grouped into write transactions (``ingest_jobs.pipeline``):
in-process fakes, no database. A document is written whole, once, in a batch that holds
what finished while the writer was busy; a failing pipeline still gets its finished
documents written before the failure is raised."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from ingest_jobs.pipeline import WRITE_BATCH_DOCUMENTS, Batch, collect_documents
from ingest_jobs.sources import PreparedSource


def _doc(source: str) -> PreparedSource:
    return PreparedSource(
        source=source,
        title=None,
        body="",
        content_hash="h",
        fingerprint="f",
        permissions=[],
        metadata={},
    )


def _row(source: str, ordinal: int, n_chunks: int) -> dict[str, Any]:
    return {"source": source, "ordinal": ordinal, "n_chunks": n_chunks}


class ScriptedFeed:
    """Rows in order; ``idle`` is true where the script says the writer caught up (after
    the row at each index in ``caught_up``); ``fail`` raises after the last row."""

    def __init__(
        self, rows: list[dict[str, Any]], caught_up: set[int], fail: Exception | None = None
    ) -> None:
        self._rows, self._caught_up, self._fail = rows, caught_up, fail
        self._at = -1

    def idle(self) -> bool:
        return self._at in self._caught_up or self._at == len(self._rows) - 1

    async def rows(self) -> AsyncIterator[dict[str, Any]]:
        for at, row in enumerate(self._rows):
            self._at = at
            yield row
        if self._fail is not None:
            raise self._fail


class Writes:
    def __init__(self) -> None:
        self.batches: list[list[tuple[str, list[int]]]] = []

    async def __call__(self, batch: Batch) -> None:
        self.batches.append([(d.source, sorted(r["ordinal"] for r in rows)) for d, rows in batch])


async def test_documents_finished_while_the_writer_was_busy_share_one_write() -> None:
    pending = {s: _doc(s) for s in ("a", "b", "c", "d")}
    rows = [_row("a", 0, 1), _row("b", 0, 2), _row("b", 1, 2), _row("c", 0, 1)]
    rows += [_row("b", 1, 2), _row("d", 0, 1)]  # a repeated row (a retried Ray task)
    writes = Writes()
    await collect_documents(ScriptedFeed(rows, caught_up={3}), pending, writes)
    assert writes.batches == [
        [("a", [0]), ("b", [0, 1]), ("c", [0])],  # nothing was idle until row 3
        [("d", [0])],
    ]
    assert pending == {}


async def test_a_full_batch_is_written_without_waiting_for_the_writer_to_catch_up() -> None:
    n = WRITE_BATCH_DOCUMENTS + 3
    pending = {f"p{i}": _doc(f"p{i}") for i in range(n)}
    writes = Writes()
    await collect_documents(ScriptedFeed([_row(s, 0, 1) for s in pending], set()), pending, writes)
    assert [len(b) for b in writes.batches] == [WRITE_BATCH_DOCUMENTS, 3]


async def test_a_failing_pipeline_still_writes_what_it_finished_then_raises() -> None:
    pending = {s: _doc(s) for s in ("a", "b", "c")}
    rows = [_row("a", 0, 1), _row("b", 0, 2)]  # b never gets its second chunk
    writes = Writes()
    with pytest.raises(RuntimeError, match="actor died"):
        await collect_documents(
            ScriptedFeed(rows, caught_up=set(), fail=RuntimeError("actor died")), pending, writes
        )
    assert writes.batches == [[("a", [0])]]
    assert sorted(pending) == ["b", "c"]  # what the failure report lists as not ingested
