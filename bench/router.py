"""The router on its own (issue 14, item 2): every golden row's question, asked as its
caller, against the route the service's planner takes, without a model's time or its noise.

    python -m bench.router [--split dev|test|all] [--dataset FILE ...]
        [--out-dir bench/out/router] [--database retrieval_quality]

The rows are golden.yaml's and test.yaml's on ``--split``'s side, ``dev`` by default: routing
rules are fitted on dev; a routing table of the frozen test rows is asked for by name
(evals/README.md, "dev and test"). Only rows of the sample world run (the simulators here are
the sample world's).

Each row runs through the real ``Agent`` (json_schema mode, plan first, composed live
answers: the local models' path) with the eight tools over the in-process simulators as the
row's caller and the service's retriever over the sample documentation (ingested as
``bench.retrieval_quality`` does it, into the same benchmark database), and a scripted model
(``bench.followups.faithful_model``). The route is the run's ``route: ...`` note: the
planner decides it before any model call, so the model cannot change it.

What a row needs, from its tags and its expected tools: documentation (a ``doc`` tag, or
``search_docs`` among the tools it must call), live data (``live-data``, ``multi-hop`` or
``unknown-building``, or a live tool it must call), both, or neither. The route that serves
it is the one of the same name, and ``both`` for documentation too (a question naming a
building may need its page and the building); ``both`` does not serve a live-data question
(it costs a model call instead of an answer composed from the tools). Off-topic rows need
``open`` (the only route where the model may decline), greetings ``greeting``, a row that
needs neither (an IDK question about nothing documented) ``documentation`` or ``open``.
The report is the confusion matrix (the kinds of ``evals.report``), the share of rows
routed to a route that serves them, each misrouted row with the planner's reason, and the
planning time per row (the signals are meant to cost milliseconds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from agent.loop import Agent
from agent.small_model.followups import PassThroughRewriter
from evals.dataset import (
    DEFAULT_DATASETS,
    DEFAULT_SPLIT,
    DEFAULT_WORLD,
    SPLIT_CHOICES,
    Case,
    DatasetError,
    SplitChoice,
    load_datasets,
)
from evals.report import SERVICE_ROUTES, row_route
from foundation.identity import AuthUser
from local_world.claims import encode_flat_claims

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT_DIR = ROOT / "bench" / "out" / "router"
LIVE_TAGS = frozenset({"live-data", "multi-hop", "unknown-building"})
LIVE_TOOLS = frozenset(
    {
        "list_buildings",
        "get_building",
        "get_room",
        "get_room_occupancy",
        "list_sensors",
        "get_latest_sensor_data",
        "get_sensor_history",
    }
)
_ROUTE_NOTE = re.compile(r"^route: (\w+)")


def needs(case: Case) -> str:
    """What the row asks for: ``off-topic``, ``greeting``, ``both``, ``documentation``,
    ``live_data`` or ``neither``."""
    tags = set(case.row.tags)
    if "off-topic" in tags:
        return "off-topic"
    if "greeting" in tags:
        return "greeting"
    expected = set(case.row.tools_called.all or []) if case.row.tools_called else set()
    docs = "doc" in tags or "search_docs" in expected
    live = bool(tags & LIVE_TAGS or expected & LIVE_TOOLS)
    if docs and live:
        return "both"
    if docs:
        return "documentation"
    return "live_data" if live else "neither"


# ``both`` does not serve a live-data question: it costs a model call instead of an answer
# composed from the tools. A documentation question that names a building ("rule set
# NW-HARBOR-CAP-3 ... at the Harbor warehouse") may take it: the model needs the page anyway.
SERVING: dict[str, frozenset[str]] = {
    "off-topic": frozenset({"open"}),
    "greeting": frozenset({"greeting"}),
    "both": frozenset({"both"}),
    "documentation": frozenset({"documentation", "both"}),
    "live_data": frozenset({"live_data"}),
    "neither": frozenset({"documentation", "open"}),
}


@dataclass(frozen=True)
class RoutedRow:
    id: str
    kind: str  # evals.report's kind of row
    needs: str
    route: str  # "-" when the run left no route note
    why: str
    seconds: float

    @property
    def served(self) -> bool:
        return self.route in SERVING[self.needs]


def route_of(notes: Sequence[str]) -> tuple[str, str]:
    for note in notes:
        match = _ROUTE_NOTE.match(note)
        if match:
            return match.group(1), note.removeprefix(f"route: {match.group(1)}").strip(" ()")
    return "-", ""


def user_of(case: Case) -> AuthUser:
    identity = case.user
    claims = encode_flat_claims(identity.sub, identity.roles, identity.domains)
    return AuthUser.from_claims_header(claims)


async def route_rows(agent: Agent, cases: Sequence[Case]) -> list[RoutedRow]:
    rows: list[RoutedRow] = []
    for case in cases:
        started = time.perf_counter()
        answer = await agent.answer(case.row.question, user_of(case))
        seconds = time.perf_counter() - started
        route, why = route_of(answer.notes)
        rows.append(RoutedRow(case.id, row_route(case.row.tags), needs(case), route, why, seconds))
    return rows


@dataclass
class Report:
    rows: list[RoutedRow]
    context: dict[str, str] = field(default_factory=dict)


def report_markdown(report: Report) -> str:
    rows = report.rows
    served = sum(r.served for r in rows)
    times = sorted(r.seconds * 1000 for r in rows)
    p50 = statistics.median(times)
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    lines = ["# Router benchmark", ""]
    lines += [f"- {key}: {value}" for key, value in report.context.items()]
    lines += [
        "",
        f"Routed to a route that serves the row: {served}/{len(rows)} "
        f"({served / len(rows):.1%}); planning time per row p50 {p50:.0f} ms, p95 {p95:.0f} ms "
        "(the whole run with a scripted model: signals, grounding and the service's tool steps)",
        "",
        "| kind | " + " | ".join(SERVICE_ROUTES) + " | - | served |",
        "|---|" + "---:|" * (len(SERVICE_ROUTES) + 2),
    ]
    kinds = list(dict.fromkeys(r.kind for r in rows))
    for kind in kinds:
        mine = [r for r in rows if r.kind == kind]
        counts = [sum(r.route == route for r in mine) for route in (*SERVICE_ROUTES, "-")]
        lines.append(
            f"| {kind} | " + " | ".join(map(str, counts)) + f" | {sum(r.served for r in mine)}"
            f"/{len(mine)} |"
        )
    missed = [r for r in rows if not r.served]
    lines += ["", "## Misrouted", ""]
    if not missed:
        lines.append("None.")
    for row in missed:
        lines.append(f"- `{row.id}` needs {row.needs}, routed `{row.route}`: {row.why}")
    lines += [
        "",
        "## Every row",
        "",
        "| row | needs | route | why | ms |",
        "|---|---|---|---|---:|",
    ]
    for row in rows:
        lines.append(
            f"| `{row.id}` | {row.needs} | {row.route} | {row.why} | {row.seconds * 1000:.0f} |"
        )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Options:
    datasets: tuple[Path, ...] = tuple(ROOT / path for path in DEFAULT_DATASETS)
    out_dir: Path = DEFAULT_OUT_DIR
    database: str = "retrieval_quality"
    split: SplitChoice = DEFAULT_SPLIT


async def run_benchmark(options: Options) -> Report:
    from bench.followups import PINNED, in_process_tools
    from bench.retrieval_quality import open_sample_store
    from foundation.settings import load_settings
    from local_world.clock import FixedClock
    from local_world.world import build_world
    from retrieval.embedders import build_embedder
    from retrieval.rerankers import build_reranker
    from serve_app.wiring import build_retriever, embedder_config, reranker_config

    settings = load_settings()
    dataset = load_datasets(options.datasets).select(split=options.split, worlds=[DEFAULT_WORLD])
    cases = dataset.cases
    embedder = build_embedder(embedder_config(settings))
    store, _ = await open_sample_store(settings, options.database, embedder)
    make, client = None, None
    try:
        retriever = build_retriever(
            settings, store, embedder=embedder, reranker=build_reranker(reranker_config(settings))
        )
        make, client = in_process_tools(build_world(), retriever, FixedClock(PINNED))
        report = Report(await route_rows(make(PassThroughRewriter()), cases))
        pages, chunks = await store.counts()
        report.context.update(
            {
                "date": date.today().isoformat(),
                "command": "python -m bench.router " + " ".join(sys.argv[1:]),
                "dataset": f"split {dataset.split}: "
                + ", ".join(
                    f"{path.name} {count}" for path, count in dataset.counts_by_file().items()
                )
                + f" ({len(cases)} rows of the {DEFAULT_WORLD} world)",
                "corpus": f"{pages} pages, {chunks} chunks; embedder {settings.embedding.model}",
            }
        )
    finally:
        if client is not None:
            await client.aclose()
        await store.close()
    return report


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.router",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--dataset",
        type=Path,
        action="append",
        help="a dataset file (repeatable; default golden.yaml and test.yaml)",
    )
    parser.add_argument(
        "--split",
        choices=SPLIT_CHOICES,
        default=DEFAULT_SPLIT,
        help="dev (default: may be fitted on), test (frozen: the run of record) or all",
    )
    parser.add_argument("--out-dir", type=Path, default=Options.out_dir)
    parser.add_argument("--database", default=Options.database)
    args = parser.parse_args(argv)
    datasets = tuple(p.resolve() for p in args.dataset) if args.dataset else Options.datasets
    return Options(datasets, args.out_dir, args.database, args.split)


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    options = parse_args(argv)
    try:
        report = asyncio.run(run_benchmark(options))
    except DatasetError as exc:
        print("invalid dataset:\n  " + "\n  ".join(exc.problems), file=sys.stderr)
        return 2
    text = report_markdown(report)
    print(text)
    options.out_dir.mkdir(parents=True, exist_ok=True)
    (options.out_dir / "report.md").write_text(text, encoding="utf-8")
    print(f"wrote {options.out_dir / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
