"""``agent-service eval``: what the subcommand does once its arguments are parsed.

Kept here rather than in ``serve_app/cli/`` so the CLI stays a thin parser. Problems the
user can fix (dataset, flags, settings, an unreachable service) raise ``EvalUsageError``,
which the CLI prints and turns into exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import TextIO

from rich.console import Console

from evals.dataset import (
    DEFAULT_DATASETS,
    DEFAULT_SPLIT,
    SPLIT_CHOICES,
    Dataset,
    DatasetError,
    SplitChoice,
    load_datasets,
)
from evals.judge import JudgeConfig
from evals.retrieval_eval import SearchRetriever
from evals.runner import EvalConfig, EvalConfigError, EvalRun, exit_code

# Opens the knowledge base for --retrieval (the CLI passes serve_app.wiring.opened_retriever).
RetrieverOpener = Callable[[], AbstractAsyncContextManager[SearchRetriever]]
# The judge's config, built only when a selected row is judged (the CLI passes
# serve_app.wiring.judge_config): a ValueError (SettingsError) says why there is none.
JudgeConfigFactory = Callable[[], JudgeConfig]

REPORTS_ROOT = Path("evals/reports")


class EvalUsageError(RuntimeError):
    """A usage, configuration or dataset problem: exit 2."""


def _split(values: Sequence[str] | None) -> list[str]:
    return [item.strip() for value in values or () for item in value.split(",") if item.strip()]


@dataclass(frozen=True)
class EvalOptions:
    datasets: list[Path] = field(default_factory=lambda: list(DEFAULT_DATASETS))
    base_url: str | None = None
    concurrency: int = 4
    model: str | None = None
    models: list[str] = field(default_factory=list)
    strict: bool = False
    only: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    junit: Path | None = None
    report: Path | None = None
    out_dir: Path | None = None
    retrieval: bool = False
    k: int = 5
    no_judge: bool = False
    quiet: bool = False
    rescore: Path | None = None
    split: SplitChoice | None = None  # None: DEFAULT_SPLIT (a re-score: the saved run's split)
    worlds: list[str] = field(default_factory=list)

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> EvalOptions:
        return cls(
            datasets=[Path(p) for p in args.datasets] or list(DEFAULT_DATASETS),
            base_url=args.base_url,
            concurrency=args.concurrency,
            model=args.model,
            models=_split([args.models] if args.models else []),
            strict=args.strict,
            only=_split(args.only),
            tags=_split(args.tag),
            junit=Path(args.junit) if args.junit else None,
            report=Path(args.report) if args.report else None,
            out_dir=Path(args.out_dir) if args.out_dir else None,
            retrieval=args.retrieval,
            k=args.k,
            no_judge=args.no_judge,
            quiet=args.quiet,
            rescore=Path(args.rescore) if getattr(args, "rescore", None) else None,
            split=getattr(args, "split", None),
            worlds=_split(getattr(args, "world", None)),
        )

    def check(self) -> None:
        if self.concurrency < 1:
            raise EvalUsageError("--concurrency must be at least 1")
        if self.k < 1:
            raise EvalUsageError("--k must be at least 1")
        if self.model and self.models:
            raise EvalUsageError("give --model or --models, not both")
        if self.retrieval and (self.model or self.models):
            raise EvalUsageError("--retrieval involves no model: drop --model/--models")
        if len(set(self.models)) != len(self.models):
            raise EvalUsageError("--models lists a model twice")
        if self.rescore is not None and (self.models or self.model or self.retrieval):
            raise EvalUsageError("--rescore reads saved answers: drop --model/--models/--retrieval")
        if self.rescore is not None and not self.rescore.is_file():
            raise EvalUsageError(f"--rescore: no such file {self.rescore}")
        if self.split is not None and self.split not in SPLIT_CHOICES:
            raise EvalUsageError(f"--split: one of {', '.join(SPLIT_CHOICES)}")

    @property
    def resolved_split(self) -> SplitChoice:
        """The split to run: --split, else a re-scored run's own, else ``DEFAULT_SPLIT``."""
        if self.split is not None:
            return self.split
        if self.rescore is not None:
            saved = _saved_split(self.rescore)
            if saved is not None:
                return saved
        return DEFAULT_SPLIT

    @property
    def resolved_out_dir(self) -> Path:
        return self.out_dir or REPORTS_ROOT / date.today().isoformat()


def _saved_split(path: Path) -> SplitChoice | None:
    """The split a saved ``responses.jsonl`` was run on (None: not recorded, or unreadable)."""
    import json

    try:
        with path.open(encoding="utf-8") as handle:
            head = json.loads(handle.readline()).get("run", {})
    except (OSError, ValueError, AttributeError):
        return None
    split = head.get("split") if isinstance(head, dict) else None
    return split if split in SPLIT_CHOICES else None


def model_slug(model: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("_") or "model"


def _judge_config(
    options: EvalOptions, dataset: Dataset, judge: JudgeConfigFactory | None
) -> JudgeConfig | None:
    if options.no_judge or not any(case.row.judged for case in dataset.cases):
        return None
    if judge is None:
        raise EvalUsageError("judged rows need a judge (or run with --no-judge)")
    try:
        return judge()
    except ValueError as exc:  # SettingsError: no key for a remote judge
        raise EvalUsageError(str(exc)) from None


def run_eval_command(
    options: EvalOptions,
    config: EvalConfig,
    out: TextIO,
    *,
    judge: JudgeConfigFactory | None = None,
    open_retriever: RetrieverOpener | None = None,
) -> int:
    """Run the subcommand; returns the exit code (0/1) or raises ``EvalUsageError``."""
    options.check()
    try:
        dataset = load_datasets(options.datasets).select(
            options.only, options.tags, options.resolved_split, options.worlds
        )
    except DatasetError as exc:
        problems = "\n  ".join(exc.problems)
        raise EvalUsageError(f"invalid dataset:\n  {problems}") from None
    err = Console(file=sys.stderr, quiet=options.quiet)
    console = Console(file=out, width=None if out.isatty() else 140)
    try:
        if options.retrieval:
            if open_retriever is None:
                raise EvalUsageError("--retrieval needs a knowledge base (run it from the CLI)")
            return _retrieval(options, dataset, console, open_retriever)
        if options.rescore:
            return _rescore(options, dataset, console)
        if options.models:
            return _sweep(options, dataset, config, judge, console, err)
        return _single(options, dataset, config, judge, console, err)
    except EvalConfigError as exc:
        raise EvalUsageError(str(exc)) from None


def _write_run(run: EvalRun, directory: Path, options: EvalOptions, *, single: bool) -> list[Path]:
    from evals.report import write_junit, write_markdown
    from evals.runner import write_responses

    junit = options.junit if single and options.junit else directory / "junit.xml"
    report = options.report if single and options.report else directory / "report.md"
    return [
        write_junit(run, junit, strict=options.strict),
        write_markdown(run, report, strict=options.strict),
        write_responses(run, directory / "responses.jsonl"),
    ]


def _rescore(options: EvalOptions, dataset: Dataset, console: Console) -> int:
    """Score saved responses (``--rescore responses.jsonl``) against the dataset as it is now:
    no service, no judge calls (saved verdicts are reused)."""
    from evals.report import print_summary
    from evals.runner import read_responses, rescore

    assert options.rescore is not None
    run = rescore(dataset, read_responses(options.rescore), str(options.rescore))
    print_summary(run, console, strict=options.strict)
    directory = options.out_dir or options.rescore.parent
    for path in _write_run(run, directory, options, single=True):
        console.print(f"wrote {path}")
    return exit_code(run, strict=options.strict)


def _single(
    options: EvalOptions,
    dataset: Dataset,
    config: EvalConfig,
    judge_factory: JudgeConfigFactory | None,
    console: Console,
    err: Console,
) -> int:
    from evals.report import print_summary
    from evals.runner import run_eval

    judge_config = _judge_config(options, dataset, judge_factory)
    base_url = options.base_url or config.base_url

    async def go() -> EvalRun:
        judge = judge_config.build() if judge_config is not None else None
        try:
            return await run_eval(
                dataset,
                base_url,
                config,
                options.concurrency,
                model=options.model,
                judge=judge,
                strict=options.strict,
                progress=not options.quiet,
                console=err,
            )
        finally:
            if judge is not None:
                await judge.aclose()

    run = asyncio.run(go())
    print_summary(run, console, strict=options.strict)
    for path in _write_run(run, options.resolved_out_dir, options, single=True):
        console.print(f"wrote {path}")
    return exit_code(run, strict=options.strict)


def _sweep(
    options: EvalOptions,
    dataset: Dataset,
    config: EvalConfig,
    judge_factory: JudgeConfigFactory | None,
    console: Console,
    err: Console,
) -> int:
    import httpx

    from evals.report import print_summary
    from evals.runner import check_service, eval_secret
    from evals.sweep import comparison_markdown, plot_pass_rate_vs_cost, run_sweep

    eval_secret(config)  # fail before starting Ray
    judge_config = _judge_config(options, dataset, judge_factory)
    base_url = (options.base_url or config.base_url).rstrip("/")

    async def ready() -> None:
        async with httpx.AsyncClient() as client:
            await check_service(client, base_url)

    asyncio.run(ready())
    err.print(f"sweep: {len(options.models)} models as Ray tasks: {', '.join(options.models)}")
    runs = run_sweep(
        dataset,
        base_url,
        config,
        options.models,
        concurrency=options.concurrency,
        judge_config=judge_config,
        strict=options.strict,
    )
    out_dir = options.resolved_out_dir
    for run, model in zip(runs, options.models, strict=True):
        print_summary(run, console, strict=options.strict)
        for path in _write_run(run, out_dir / model_slug(model), options, single=False):
            console.print(f"wrote {path}")
    table = comparison_markdown(runs)
    sweep_md = options.report or out_dir / "sweep.md"
    sweep_md.parent.mkdir(parents=True, exist_ok=True)
    plot = plot_pass_rate_vs_cost(runs, sweep_md.with_suffix(".png"))
    sweep_md.write_text(table + f"\n![pass rate vs cost]({plot.name})\n", encoding="utf-8")
    console.print(table)
    console.print(f"wrote {sweep_md}\nwrote {plot}")
    return max(exit_code(run, strict=options.strict) for run in runs)


def _retrieval(
    options: EvalOptions,
    dataset: Dataset,
    console: Console,
    open_retriever: RetrieverOpener,
) -> int:
    from evals.retrieval_eval import RetrievalReport, retrieval_markdown, run_retrieval_eval

    if not any(case.row.cited_sources for case in dataset.cases):
        raise EvalUsageError("no selected row has cited_sources: nothing to measure")

    async def go() -> RetrievalReport:
        async with open_retriever() as retriever:
            return await run_retrieval_eval(dataset, retriever, k=options.k)

    report = asyncio.run(go())
    text = retrieval_markdown(report)
    console.print(text, markup=False, highlight=False)
    path = options.report or options.resolved_out_dir / "retrieval.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    console.print(f"wrote {path}")
    return 0
