"""``bench.ingest_phases``'s pieces: per-process CPU from ``/proc``, phase marks from the
pipeline's spans, and the table of runs against the raw encodes around them (the runs
themselves take minutes; their figures are in bench/RESULTS.md)."""

from __future__ import annotations

import os
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider

from bench.ingest_phases import (
    Mark,
    PhaseMarks,
    Run,
    cpu_used,
    phases,
    read_process_cpu,
    table,
)


def _stat(pid: int, command: str, utime: int, stime: int) -> str:
    # /proc/PID/stat: pid (comm) state ppid ... utime stime are fields 14 and 15
    rest = ["S", "1"] + ["0"] * 9 + [str(utime), str(stime)] + ["0"] * 30
    return f"{pid} ({command}) " + " ".join(rest)


def test_process_cpu_is_read_from_stat_even_when_the_command_name_holds_spaces_and_parens(
    tmp_path: Path,
) -> None:
    ticks = os.sysconf("SC_CLK_TCK")
    for pid, command, utime, stime in [(12, "ray::IDLE (x) y", 3 * ticks, ticks), (7, "pg", 0, 5)]:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(_stat(pid, command, utime, stime))
        (tmp_path / str(pid) / "cmdline").write_bytes(command.encode() + b"\0--flag\0")
    (tmp_path / "self").mkdir()  # not a process id
    (tmp_path / "99").mkdir()  # a process gone before its stat was read

    found = read_process_cpu(tmp_path)

    assert found == {12: (4.0, "ray::IDLE (x) y --flag"), 7: (5 / ticks, "pg --flag")}


def test_this_process_is_among_the_real_ones() -> None:
    assert os.getpid() in read_process_cpu()


def test_cpu_used_counts_new_processes_from_zero_drops_small_ones_and_sorts() -> None:
    before = {1: (10.0, "raylet"), 2: (5.0, "driver"), 3: (1.0, "gone")}
    after = {1: (10.1, "raylet"), 2: (9.5, "driver"), 4: (2.0, "actor")}

    assert cpu_used(before, after) == [(4.5, "driver (pid 2)"), (2.0, "actor (pid 4)")]
    assert cpu_used(before, after, floor=0.05)[-1][1] == "raylet (pid 1)"


def test_phase_marks_follow_an_ingestion_runs_spans() -> None:
    clock = PhaseMarks()
    provider = TracerProvider()
    provider.add_span_processor(clock)
    tracer = provider.get_tracer("test")

    with tracer.start_as_current_span("ingest.run"):
        with tracer.start_as_current_span("ingest.discover"):
            pass
        with tracer.start_as_current_span("ingest.embed"):
            for _ in range(3):  # only the first write inside the embed span is a mark
                with tracer.start_as_current_span("ingest.write"):
                    pass
        with tracer.start_as_current_span("ingest.index"):
            pass

    labels = [mark.label for mark in clock.marks]
    assert labels == [
        "run starts",
        "work sent",
        "first rows written",
        "last rows written",
        "index build starts",
        "index build ends",
        "run ends",
    ]
    assert all(a.at <= b.at for a, b in zip(clock.marks, clock.marks[1:], strict=False))
    assert all(os.getpid() in mark.cpu for mark in clock.marks)

    clock.reset()
    with tracer.start_as_current_span("ingest.write"):  # a write outside a run's embed span
        pass
    assert clock.marks == []


def test_phases_are_the_stretches_between_marks_with_each_processs_cpu() -> None:
    marks = [
        Mark("run starts", 0.0, {1: (0.0, "driver")}),
        Mark("work sent", 2.0, {1: (1.9, "driver")}),
        Mark("last rows written", 12.0, {1: (3.0, "driver"), 5: (18.0, "actor")}),
    ]

    stretches = phases(marks)

    assert [(name, seconds) for name, seconds, _ in stretches] == [
        ("run starts -> work sent", 2.0),
        ("work sent -> last rows written", 10.0),
    ]
    assert stretches[0][2] == [(1.9, "driver (pid 1)")]
    assert [(round(s, 3), p) for s, p in stretches[1][2]] == [
        (18.0, "actor (pid 5)"),
        (1.1, "driver (pid 1)"),
    ]


def test_each_pipeline_run_is_set_against_the_raw_encodes_around_it() -> None:
    runs = [
        Run("raw", 100.0, 1000),
        Run("ray", 110.0, 1000),
        Run("raw", 90.0, 1000),
        Run("local", 100.0, 1000),
    ]

    lines = table(runs)

    assert lines[2] == "| raw encode (sorted) | 100.0 s | 10.0 | |"
    assert lines[3] == "| Ray Data | 110.0 s | 9.1 | 0.909 / 0.818 / 0.864 |"
    # no raw after it: the ratio to the one before stands alone
    assert lines[5] == "| in-process | 100.0 s | 10.0 | 0.900 / - / 0.900 |"
