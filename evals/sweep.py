"""Model sweeps (``--models a,b,c``): the same dataset against the same service, once per
answer model (the per-request ``model`` override), each run a Ray task, all in parallel.

The tasks are I/O bound (HTTP to the service and the judge), so each asks for a fraction
of a CPU: two models run side by side even on a one-CPU local Ray. The comparison is a
Markdown table and a PNG of pass rate against cost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evals.dataset import Dataset
from evals.judge import JudgeConfig
from evals.report import fmt_ms, fmt_rate, fmt_usd, md_cell, split_line
from evals.runner import EvalConfig, EvalRun, Status, run_eval

TASK_CPUS = 0.25


def run_model(
    dataset: Dataset,
    base_url: str,
    config: EvalConfig,
    model: str,
    concurrency: int,
    judge_config: JudgeConfig | None,
    strict: bool = False,
) -> EvalRun:
    """One model's run, start to end (the body of a sweep's Ray task)."""

    async def go() -> EvalRun:
        judge = judge_config.build() if judge_config is not None else None
        try:
            return await run_eval(
                dataset,
                base_url,
                config,
                concurrency,
                model=model,
                judge=judge,
                strict=strict,
                progress=False,
                check_ready=False,  # checked once by the driver
            )
        finally:
            if judge is not None:
                await judge.aclose()

    return asyncio.run(go())


def _ensure_ray(num_cpus: int | None, address: str | None) -> bool:
    """Connect to ``address`` (RAY_ADDRESS), or start a private local Ray; True when started
    here."""
    import ray

    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(
            address="local",  # a Ray of its own, never a stale cluster from /tmp/ray
            num_cpus=num_cpus or 1,
            include_dashboard=False,
            object_store_memory=80 * 1024 * 1024,
            log_to_driver=False,
            configure_logging=False,
        )
    return True


def run_sweep(
    dataset: Dataset,
    base_url: str,
    config: EvalConfig,
    models: Sequence[str],
    *,
    concurrency: int = 4,
    judge_config: JudgeConfig | None = None,
    strict: bool = False,
    task_cpus: float = TASK_CPUS,
    num_cpus: int | None = None,
) -> list[EvalRun]:
    """Every model's ``EvalRun``, in the order of ``models``, each run as a Ray task."""
    if not models:
        raise ValueError("a sweep needs at least one model")
    import ray

    started = _ensure_ray(num_cpus, config.ray_address)
    try:
        task: Any = ray.remote(num_cpus=task_cpus, max_retries=0)(run_model)
        refs = [
            task.remote(dataset, base_url, config, model, concurrency, judge_config, strict)
            for model in models
        ]
        runs: list[EvalRun] = ray.get(refs)
        return runs
    finally:
        if started:
            ray.shutdown()


# --- the comparison ---------------------------------------------------------------------------


def comparison_markdown(runs: Sequence[EvalRun]) -> str:
    """One line per model: pass rate, status counts, latency, tokens and cost."""
    lines = [
        f"# Model sweep: {runs[0].dataset if runs else ''}",
        "",
        f"{split_line(runs[0]) if runs else ''}. "
        f"Base URL `{runs[0].base_url if runs else ''}`; judge "
        f"{(runs[0].judge_model if runs else None) or 'none'}. Pass rate = fully passed "
        "(PASS + XPASS: every declared expectation checked and held) / all rows; PARTIAL rows "
        "(some expectation not checked) are not passes.",
        "",
        "| model | pass rate | PASS | PARTIAL | FAIL | ERROR | XFAIL | XPASS | p50 | p95 "
        "| tokens in | tokens out | cost |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        c = run.counts
        lines.append(
            f"| {md_cell(run.label)} | {fmt_rate(run.pass_rate)} | {c[Status.PASS]} "
            f"| {c[Status.PARTIAL]} | {c[Status.FAIL]} | {c[Status.ERROR]} "
            f"| {c[Status.XFAIL]} | {c[Status.XPASS]} "
            f"| {fmt_ms(run.p50_ms)} | {fmt_ms(run.p95_ms)} | {run.input_tokens:,} "
            f"| {run.output_tokens:,} | {fmt_usd(run.cost_usd)} |"
        )
    return "\n".join(lines) + "\n"


def plot_pass_rate_vs_cost(runs: Sequence[EvalRun], path: Path) -> Path:
    """A scatter of pass rate against cost, one annotated point per model. When no model
    reported a cost (local models), the x axis is total tokens instead, and says so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    priced = any((run.cost_usd or 0) > 0 for run in runs)
    xs = [
        (run.cost_usd or 0.0) if priced else float(run.input_tokens + run.output_tokens)
        for run in runs
    ]
    ys = [run.pass_rate * 100 for run in runs]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    try:
        ax.scatter(xs, ys, s=60, zorder=3)
        for index, (run, x, y) in enumerate(zip(runs, xs, ys, strict=True)):
            ax.annotate(
                f"{run.label}\n{fmt_rate(run.pass_rate)}",
                (x, y),
                textcoords="offset points",
                xytext=(8, 8 - 14 * (index % 3)),
                fontsize=8,
            )
        ax.set_xlabel("cost of the run (USD)" if priced else "tokens in + out (no cost reported)")
        ax.set_ylabel("pass rate (%)")
        ax.set_ylim(0, 105)
        ax.set_xlim(left=0, right=max([*xs, 1e-9]) * 1.3)
        ax.grid(True, alpha=0.3)
        ax.set_title(f"{runs[0].dataset if runs else ''}: pass rate vs cost")
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path
