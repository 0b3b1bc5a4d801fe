"""The Ray pipeline's child process dying before it has read its work."""

from __future__ import annotations

import os
from multiprocessing.connection import Connection

import pytest

from foundation.settings import Settings
from ingest_jobs.ray_executor import RayPipelineLost, RayWork, iter_ray_isolated

# Paths and hashes of a large corpus pickle to megabytes: far more than a pipe's buffer, so
# a parent that wrote them where no one reads would block for ever.
LARGE_CORPUS_DOCUMENTS = 20_000


def _dies_at_once(
    settings: Settings, tokenizer_path: str | None, work: Connection, rows: Connection
) -> None:
    """A child that ends before reading its work (a failed import, the OOM killer)."""
    os._exit(3)


@pytest.mark.timeout(120)
def test_a_child_that_dies_before_reading_its_work_fails_the_run_instead_of_hanging() -> None:
    items = [
        {
            "source": f"docs/page-{n:05d}.md",
            "path": f"/corpus/docs/page-{n:05d}.md",
            "content_hash": "0" * 64,
        }
        for n in range(LARGE_CORPUS_DOCUMENTS)
    ]
    work = RayWork(items, blocks=8, max_tokens=200, embed_actors=1)

    rows = iter_ray_isolated(work, Settings(), None, child_main=_dies_at_once)

    with pytest.raises(RayPipelineLost, match=r"exit code 3\) before it read its work"):
        next(rows)
