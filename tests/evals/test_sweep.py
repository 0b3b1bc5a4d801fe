"""Model sweeps: the comparison table and plot (fast), and one real Ray run (slow)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from evals.assertions import AssertionResult
from evals.dataset import load_dataset
from evals.runner import EvalRun, RowResult, Status
from evals.sweep import comparison_markdown, plot_pass_rate_vs_cost, run_sweep
from serve_app.wiring import eval_config
from tests.evals.eval_helpers import FakeService, answer, fake_service, settings, write_dataset

START = datetime(2025, 3, 4, tzinfo=UTC)


def fake_run(model: str, statuses: list[Status], cost: float | None, ms: float) -> EvalRun:
    ok = [AssertionResult("idk", True, "idk=False; expected False")]
    rows = [
        RowResult(
            f"r{i}",
            "golden.yaml",
            "q",
            status,
            ok,
            latency_ms=ms * (i + 1),
            answer="a",
            model=model,
            input_tokens=100,
            output_tokens=10,
            cost_usd=None if cost is None else cost / len(statuses),
        )
        for i, status in enumerate(statuses)
    ]
    return EvalRun("http://x", "golden", model, None, START, START + timedelta(seconds=5), rows)


def test_comparison_table() -> None:
    runs = [
        fake_run("big", [Status.PASS, Status.PASS, Status.XPASS, Status.FAIL], 0.004, 100),
        fake_run("small", [Status.PASS, Status.PARTIAL, Status.XFAIL, Status.ERROR], None, 50),
    ]
    text = comparison_markdown(runs)
    assert (
        "| big | 75.0% | 2 | 0 | 1 | 0 | 0 | 1 | 200 ms | 400 ms | 400 | 40 | $0.004000 |" in text
    )
    # a partially checked row is not a pass
    assert "| small | 25.0% | 1 | 1 | 0 | 1 | 1 | 0 | 100 ms | 200 ms | 400 | 40 | n/a |" in text
    assert "Pass rate = fully passed (PASS + XPASS: every declared expectation checked" in text


def test_plots_are_pngs(tmp_path: Path) -> None:
    priced = [fake_run("a", [Status.PASS], 0.01, 10), fake_run("b", [Status.FAIL], 0.002, 10)]
    path = plot_pass_rate_vs_cost(priced, tmp_path / "sweep.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    local = [fake_run("a", [Status.PASS], None, 10), fake_run("b", [Status.FAIL], 0.0, 10)]
    assert plot_pass_rate_vs_cost(local, tmp_path / "local.png").stat().st_size > 1000


@pytest.mark.slow
def test_a_sweep_runs_each_model_as_a_ray_task(tmp_path: Path) -> None:
    service = FakeService()
    service.reply("What is CV-E1033?", answer("A sensor went offline."))
    dataset = load_dataset(
        write_dataset(
            tmp_path,
            "version: 1\nrows:\n  - {id: a, question: 'What is CV-E1033?', "
            "keywords: {all: [sensor]}}\n",
        )
    )
    with fake_service(service) as url:
        runs = run_sweep(
            dataset, url, eval_config(settings(tmp_path)), ["local/one", "local/two"], num_cpus=1
        )
    assert [r.model for r in runs] == ["local/one", "local/two"]
    assert all(r.counts[Status.PASS] == 1 for r in runs)
    assert sorted(a["model"] for a in service.asked) == ["local/one", "local/two"]
    assert "local/two" in comparison_markdown(runs)
