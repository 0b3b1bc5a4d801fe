"""The Ray pipeline's child process: started ahead of its work, ended when none comes,
dying before it has read its work, and left to leave Ray while the run goes on."""

from __future__ import annotations

import os
import re
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

import pytest

from foundation.settings import Settings
from ingest_jobs import pipeline, ray_executor
from ingest_jobs.pipeline import IngestOptions
from ingest_jobs.ray_executor import RayPipelineLost, RayWork, start_ray_child
from ingest_jobs.sources import SourceFile
from serve_app.wiring import ingest_config

# Paths and hashes of a large corpus pickle to megabytes: far more than a pipe's buffer, so
# a parent that wrote them where no one reads would block for ever.
LARGE_CORPUS_DOCUMENTS = 20_000


def _dies_at_once(
    settings: Settings, tokenizer_path: str | None, work: Connection, rows: Connection
) -> None:
    """A child that ends before reading its work (a failed import, the OOM killer)."""
    os._exit(3)


def _large_work() -> RayWork:
    items = [
        {
            "source": f"docs/page-{n:05d}.md",
            "path": f"/corpus/docs/page-{n:05d}.md",
            "content_hash": "0" * 64,
        }
        for n in range(LARGE_CORPUS_DOCUMENTS)
    ]
    return RayWork(items, blocks=8, max_tokens=200, embed_actors=1)


@pytest.mark.timeout(120)
def test_a_child_that_dies_before_reading_its_work_fails_the_run_instead_of_hanging() -> None:
    rows = start_ray_child(Settings(), None, child_main=_dies_at_once).rows(_large_work())

    with pytest.raises(RayPipelineLost, match=r"exit code 3\) before it read its work"):
        next(rows)


def _cannot_join_ray(
    settings: Settings, tokenizer_path: str | None, work: Connection, rows: Connection
) -> None:
    """A child whose Ray would not start: it says why, then ends without reading its work."""
    rows.send(("error", "ConnectionError: could not reach Ray at 10.0.0.9:6379"))
    rows.close()
    os._exit(1)


@pytest.mark.timeout(120)
def test_a_child_that_cannot_join_ray_fails_the_run_with_its_own_error() -> None:
    """The child joins Ray before its work arrives: the run reports why it failed to join,
    not only that the process ended."""
    rows = start_ray_child(Settings(), None, child_main=_cannot_join_ray).rows(_large_work())

    with pytest.raises(RuntimeError, match=re.escape("could not reach Ray at 10.0.0.9:6379")):
        next(rows)


class FakeChild:
    closed = False

    def close(self) -> None:
        self.closed = True


def _waits_for_work(
    settings: Settings, tokenizer_path: str | None, work: Connection, rows: Connection
) -> None:
    """Records what it was given instead of work (``None``: nothing to do) and ends."""
    given = work.recv()
    Path(settings.agent_service_home, "given").write_text(repr(given))


@pytest.mark.timeout(120)
def test_a_child_started_ahead_is_told_there_is_no_work_and_ends(tmp_path: Path) -> None:
    child = start_ray_child(Settings(agent_service_home=tmp_path), None, child_main=_waits_for_work)

    child.close()

    assert (tmp_path / "given").read_text() == "None"


@pytest.mark.parametrize(
    ("executor", "ray_address", "files", "ahead"),
    [
        ("ray", None, 3, True),  # forced: the child joins Ray while the driver counts
        ("auto", "127.0.0.1:6379", 3, True),  # a running cluster: auto always uses it
        ("auto", None, 3, False),  # a private Ray only past INGEST_RAY_MIN_CHUNKS: not known yet
        ("local", "127.0.0.1:6379", 3, False),
        ("ray", None, 0, False),  # no sources: nothing to start
    ],
)
def test_the_ray_child_starts_ahead_only_when_ray_is_sure_to_run(
    executor: pipeline.Executor,
    ray_address: str | None,
    files: int,
    ahead: bool,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    started: list[FakeChild] = []

    def fake_start(settings: Settings, tokenizer_path: str | None) -> FakeChild:
        started.append(FakeChild())
        return started[-1]

    monkeypatch.setattr(pipeline, "start_ray_child", fake_start)
    if ray_address:
        monkeypatch.setenv("RAY_ADDRESS", ray_address)
    else:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    options = IngestOptions(roots=[(tmp_path, [])], executor=executor)
    sources = [SourceFile(tmp_path / f"p{n}.md", f"p{n}.md", ()) for n in range(files)]

    with pipeline._ray_child_ahead(options, ingest_config(Settings()), None, sources) as child:
        assert (child is not None) == ahead

    assert len(started) == int(ahead)
    assert all(c.closed for c in started)  # ended at the block's exit (rows never asked for)


def _refuse_to_unpickle() -> None:
    raise ValueError("this work cannot be read here")


class WorkThatDoesNotUnpickle:
    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (_refuse_to_unpickle, ())


def _child_without_ray(
    settings: Settings, tokenizer_path: str | None, work: Connection, rows: Connection
) -> None:
    """The real child, with Ray's start left out (the test is about reading the work)."""
    ray_executor.start_ray = lambda settings: None
    ray_executor._ray_child(settings, tokenizer_path, work, rows)


@pytest.mark.timeout(120)
def test_work_the_child_cannot_read_fails_the_run_instead_of_hanging() -> None:
    work = cast(RayWork, WorkThatDoesNotUnpickle())
    rows = start_ray_child(Settings(), None, child_main=_child_without_ray).rows(work)

    with pytest.raises(RuntimeError, match="ValueError: this work cannot be read here"):
        next(rows)


def _leaves_ray_slowly(
    settings: Settings, tokenizer_path: str | None, work: Connection, rows: Connection
) -> None:
    """Sends its rows, then takes its time leaving Ray: until the test lets it go."""
    work.recv()
    rows.send(("rows", [{"row": 1}]))
    rows.send(("done", None))
    let_go = Path(settings.agent_service_home, "let-go")
    while not let_go.exists():
        time.sleep(0.05)


@pytest.mark.timeout(120)
def test_the_rows_end_while_the_child_leaves_ray_and_close_waits_for_it(tmp_path: Path) -> None:
    """The writer builds the vector index while the child leaves Ray, instead of after."""
    child = start_ray_child(
        Settings(agent_service_home=tmp_path), None, child_main=_leaves_ray_slowly
    )

    assert list(child.rows(_large_work())) == [{"row": 1}]
    assert child._process.is_alive()  # not waited for, not terminated

    (tmp_path / "let-go").touch()
    child.close()

    assert child._process.exitcode == 0  # it ended on its own


def _sends_rows_for_ever(
    settings: Settings, tokenizer_path: str | None, work: Connection, rows: Connection
) -> None:
    work.recv()
    while True:  # blocks once the pipe is full: no one reads it any more
        rows.send(("rows", [{"row": 1}]))


@pytest.mark.timeout(120)
def test_a_child_stopped_short_is_ended_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer failed mid-run: the run reports it now, not after the grace a child
    leaving Ray gets (here longer than the test may run)."""
    monkeypatch.setattr(ray_executor, "CHILD_EXIT_GRACE_S", 600.0)
    child = start_ray_child(Settings(), None, child_main=_sends_rows_for_ever)
    rows = child.rows(_large_work())
    assert next(rows) == {"row": 1}

    child.close()

    assert child._process.exitcode is not None
