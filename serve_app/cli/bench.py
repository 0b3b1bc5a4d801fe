"""``agent-service bench``: a benchmark of ``bench/`` (``python -m bench.NAME``), or the list."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from foundation.settings import Settings
from serve_app.cli.common import EXIT_OK, CliError

NOT_BENCHMARKS = {"__init__", "loadgen", "stack", "text_corpus"}  # bench/ libraries


def bench_root() -> Path:
    """The repository root: the folder holding ``bench/`` next to the ``serve_app`` package
    (benchmarks are part of the source checkout, not of the installed package)."""
    return Path(__file__).resolve().parents[2]


def bench_modules(root: Path) -> dict[str, str]:
    """Benchmark name (module of ``root/bench``) -> its docstring's first paragraph (the
    summary), sorted by name. Read with ``ast``: listing imports none of them (they import
    Ray, torch...)."""
    import ast

    folder = root / "bench"
    found: dict[str, str] = {}
    for path in sorted(folder.glob("*.py")):
        if path.stem in NOT_BENCHMARKS or path.stem.startswith("_"):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (OSError, SyntaxError, ValueError):
            found[path.stem] = "(unreadable)"
            continue
        doc = (ast.get_docstring(tree) or "").strip()
        found[path.stem] = " ".join(doc.split("\n\n")[0].split())  # the first paragraph
    return found


def bench_listing(modules: dict[str, str]) -> str:
    width = max((len(name) for name in modules), default=0)
    return "\n".join(f"  {name:<{width}}  {summary}" for name, summary in modules.items())


def bench_command(name: str, args: Sequence[str]) -> list[str]:
    """The command that runs benchmark ``name`` with ``args`` (from the repository root)."""
    return [sys.executable, "-m", f"bench.{name}", *args]


def cmd_bench(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    root = bench_root()
    if not (root / "bench").is_dir():
        raise CliError(
            f"no bench/ folder in {root}: the benchmarks run from a source checkout "
            "(pip install -e .)"
        )
    modules = bench_modules(root)
    if args.list or not args.name:
        print("benchmarks (agent-service bench NAME [ARGS...]; NAME --help for options):", file=out)
        print(bench_listing(modules), file=out)
        return EXIT_OK
    if args.name not in modules:
        raise CliError(
            f"unknown benchmark {args.name!r}; the benchmarks are:\n{bench_listing(modules)}"
        )
    out.flush()
    proc = subprocess.Popen(bench_command(args.name, args.args), cwd=root)
    interrupted = False
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            # The benchmark got the same Ctrl-C: let it shut Ray down; a second one stops it.
            if interrupted:
                proc.terminate()
            interrupted = True


def add_parsers(sub: Any) -> None:
    """The ``bench`` command."""
    bench = sub.add_parser(
        "bench",
        help="run a benchmark of bench/ (results: bench/RESULTS.md), or list them",
        description="Runs `python -m bench.NAME ARGS...` from the repository root and exits with "
        "its code; everything after NAME goes to the benchmark (NAME --help shows its "
        "options). Without NAME, or with --list: the benchmarks and what each measures. "
        "Benchmarks take minutes and the whole machine: run one at a time, on an idle one.",
    )
    bench.add_argument("--list", action="store_true", help="list the benchmarks")
    bench.add_argument("name", nargs="?", metavar="NAME", help="the benchmark (module name)")
    bench.add_argument(
        "args", nargs=argparse.REMAINDER, metavar="ARGS", help="passed to the benchmark"
    )
    bench.set_defaults(handler=cmd_bench)
