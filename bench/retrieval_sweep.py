"""Sweep the fusion and depth settings on the training side of the retrieval benchmarks and
pick one configuration (issue 16, item 4): RRF_K, TOP_K_VECTOR, TOP_K_KEYWORD,
RRF_KEYWORD_WEIGHT, KEYWORD_RANKING, KEYWORD_COMMON_ROWS and CHUNK_MAX_TOKENS.

    python -m bench.retrieval_sweep [--sizes 10000] [--chunk-sizes 120,200,300]
        [--rrf-k 10,20,60,120] [--depths 20,40,80] [--weights 1.0,0.5,0.3,0.15]
        [--rankings ts_rank_cd,ts_rank] [--common-rows 0,300,1000,3000]
        [--out-dir bench/out/retrieval_sweep]

Only the training side of ``evals.splits`` is searched (the labelled questions over the
sample docs, and the known-item queries at each ``--sizes``; ``--sizes ''`` for none): the
held-out side is for ``python -m bench.retrieval_quality --split heldout`` once the choice
is made, with the chosen settings in the environment.

How it stays cheap: the sample docs are ingested once per chunk size (the real ingest, a
database of their own, ``retrieval_sweep_c<N>``); the known-item corpora reuse
``bench.retrieval_quality``'s databases. For each keyword ranking and common-word bound the
store is searched once per question at the deepest depths of the grid, and every other point
of the grid runs the real ``HybridRetriever`` (fusion, cut) over those candidates cut to its
own depths (a list's first k rows are what ``LIMIT k`` returns: the keyword side orders by
score then id; the vector side by distance then id, from HNSW with ``ef_search`` above the
deepest depth). Common-word bounds that give the same list of common words give the same
searches and are scored once. ``TOP_K_RERANK`` is not swept: with ``RERANKER=noop`` the
final cut is the fused order's first ``TOP_K_FINAL`` whatever it is.

Scores: hybrid (RRF) nDCG@10 per training side. The choice: the point with the best mean,
over the benchmarks, of their training nDCG@10 (a sample-docs point's chunk size has no
counterpart in the known-item corpora, which are paragraphs, not chunked documents: their
figure is that of the same other settings), among the points whose exact-token questions
(training side) lose at most ``EXACT_TOKEN_SLACK`` against today's defaults; within
``TIE`` of the best, the one that changes the fewest settings; a point of another chunk
size only if it beats the best point at today's by ``CHUNK_MARGIN`` (every store would
have to be ingested again). Writes ``sweep.jsonl`` (every
point) and ``sweep.md`` (the choice, the best points, each setting's best value) to
``--out-dir``, and prints the environment that selects the chosen point.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np

from bench.retrieval_quality import (
    ROOT,
    TEXT_ACL,
    QueryCache,
    known_item_corpus,
    open_sample_store,
    open_text_store,
    text_database,
)
from bench.search import chunk_id
from evals.known_item import KnownItem, score_known_items
from evals.retrieval_labels import DEFAULT_QUALITY_DATASET, QualityDataset, load_quality_dataset
from evals.retrieval_quality import score_config
from evals.splits import select_split
from foundation.database import asyncpg_url, resolve_database_url, with_database
from foundation.settings import Settings, load_settings
from retrieval.embedders import Embedder, build_embedder
from retrieval.rerankers import NoopReranker
from retrieval.search import HybridRetriever, RetrievalConfig
from retrieval.store import (
    Candidate,
    DocumentRecord,
    KeywordRanking,
    PgDocumentStore,
    StoredDocument,
    WriteOutcome,
)
from serve_app.wiring import embedder_config

DEFAULT_OUT_DIR = ROOT / "bench" / "out" / "retrieval_sweep"
EXACT_TOKEN_SLACK = 0.02  # the most a chosen point may lose on training exact-token nDCG@10
TIE = 0.002  # points this close to the best count as tied: the fewest changes wins
CHUNK_MARGIN = 0.01  # another CHUNK_MAX_TOKENS (a re-ingest of every store) must gain this
SAMPLE = "sample (train)"


@dataclass(frozen=True)
class Point:
    """One configuration of the grid (the settings' names in lower case)."""

    chunk_max_tokens: int
    keyword_ranking: str
    keyword_common_rows: int
    top_k_vector: int
    top_k_keyword: int
    rrf_k: int
    rrf_keyword_weight: float

    def changes(self, defaults: Point) -> list[str]:
        """``NAME=value`` of every setting that differs from ``defaults``."""
        return [
            f"{f.name.upper()}={getattr(self, f.name)}"
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(defaults, f.name)
        ]

    def without_chunk(self) -> tuple[object, ...]:
        return dataclasses.astuple(dataclasses.replace(self, chunk_max_tokens=0))


@dataclass(frozen=True)
class Grid:
    chunk_sizes: tuple[int, ...] = (120, 200, 300)
    rankings: tuple[str, ...] = ("ts_rank_cd", "ts_rank")
    common_rows: tuple[int, ...] = (0, 300, 1000, 3000)
    depths: tuple[int, ...] = (20, 40, 80)
    rrf_ks: tuple[int, ...] = (10, 20, 60, 120)
    weights: tuple[float, ...] = (1.0, 0.5, 0.3, 0.15)

    def fusion(self) -> Iterable[tuple[int, int, int, float]]:
        """(TOP_K_VECTOR, TOP_K_KEYWORD, RRF_K, weight) of every fusion point."""
        return product(self.depths, self.depths, self.rrf_ks, self.weights)


@dataclass(frozen=True)
class Options:
    sizes: tuple[int, ...] = (10_000,)
    queries: int = 500
    grid: Grid = field(default_factory=Grid)
    out_dir: Path = DEFAULT_OUT_DIR


@dataclass
class Scored:
    """A point's training figures on one benchmark (hybrid (RRF), no reranker)."""

    benchmark: str
    point: Point
    ndcg: float
    recall: float
    mrr: float
    exact_token: float | None = None  # nDCG@10 of the exact-token questions (sample only)
    common_words: int = 0  # how many common words the bound gave


def defaults_point(settings: Settings) -> Point:
    return Point(
        settings.ingestion.chunk_max_tokens,
        settings.retrieval.keyword_ranking,
        settings.retrieval.keyword_common_rows,
        settings.retrieval.top_k_vector,
        settings.retrieval.top_k_keyword,
        settings.retrieval.rrf_k,
        settings.retrieval.rrf_keyword_weight,
    )


class DeepCandidates:
    """The ``DocumentStore`` port over a real store, searched once per (query, caller) at
    the deepest depths; each search gets that list cut to the depths it asks for."""

    def __init__(self, inner: PgDocumentStore, k_vector: int, k_keyword: int) -> None:
        self.inner = inner
        self.k_vector = k_vector
        self.k_keyword = k_keyword
        self._lists: dict[tuple[str, tuple[str, ...]], list[Candidate]] = {}

    async def hybrid_candidates(
        self,
        query_text: str,
        query_vector: np.ndarray[Any, np.dtype[np.float32]],
        acl: Sequence[str],
        *,
        k_vector: int,
        k_keyword: int,
    ) -> list[Candidate]:
        if k_vector > self.k_vector or k_keyword > self.k_keyword:
            raise ValueError("a search deeper than the sweep's deepest depths")
        key = (query_text, tuple(acl))
        deep = self._lists.get(key)
        if deep is None:
            deep = await self.inner.hybrid_candidates(
                query_text, query_vector, acl, k_vector=self.k_vector, k_keyword=self.k_keyword
            )
            self._lists[key] = deep
        cut = []
        for c in deep:
            vector = (
                c.vector_rank if c.vector_rank is not None and c.vector_rank <= k_vector else None
            )
            keyword = (
                c.keyword_rank
                if c.keyword_rank is not None and c.keyword_rank <= k_keyword
                else None
            )
            if vector is None and keyword is None:
                continue
            distance = c.distance if vector is not None else None
            cut.append(
                dataclasses.replace(c, vector_rank=vector, keyword_rank=keyword, distance=distance)
            )
        return cut

    async def documents(self) -> dict[str, StoredDocument]:
        return await self.inner.documents()

    async def write_document(self, doc: DocumentRecord) -> WriteOutcome:
        raise NotImplementedError("the sweep only reads")

    async def write_documents(self, docs: Sequence[DocumentRecord]) -> list[WriteOutcome]:
        raise NotImplementedError("the sweep only reads")

    async def delete_sources(self, sources: Iterable[str]) -> int:
        raise NotImplementedError("the sweep only reads")

    async def visible_chunk_ids(self, chunk_ids: Iterable[str], acl: Sequence[str]) -> set[str]:
        return await self.inner.visible_chunk_ids(chunk_ids, acl)

    async def counts(self) -> tuple[int, int]:
        return await self.inner.counts()

    async def close(self) -> None:
        await self.inner.close()


def retriever(
    store: DeepCandidates,
    embedder: Embedder,
    settings: Settings,
    kv: int,
    kk: int,
    rrf_k: int,
    weight: float,
) -> HybridRetriever:
    config = RetrievalConfig(
        top_k_vector=kv,
        top_k_keyword=kk,
        top_k_rerank=settings.retrieval.top_k_rerank,
        top_k_final=settings.retrieval.top_k_final,
        rrf_k=rrf_k,
        keyword_weight=weight,
    )
    return HybridRetriever(store, embedder, NoopReranker(), config)


Aliases = dict[tuple[str, int], int]  # (ranking, bound not searched) -> the bound searched


async def ranked_stores(
    settings: Settings, url: str, grid: Grid
) -> tuple[list[tuple[str, int, tuple[str, ...], PgDocumentStore]], Aliases]:
    """(ranking, bound, its common words, store) for every ranking and every bound whose
    common words differ from an earlier bound's (the same words: the same searches), and
    which searched bound stands for each other one."""
    stores = []
    aliases: Aliases = {}
    for ranking in grid.rankings:
        seen: dict[tuple[str, ...], int] = {}
        for rows in grid.common_rows:
            store = await PgDocumentStore.connect(
                url,
                embedding_dim=settings.embedding.resolved_dim,
                min_size=1,
                max_size=2,
                ef_search=settings.retrieval.hnsw_ef_search,
                keyword_common_rows=rows,
                keyword_ranking=_ranking(ranking),
            )
            words = tuple(await store.common_words(refresh=True))
            if words in seen:
                await store.close()
                aliases[(ranking, rows)] = seen[words]
                continue
            seen[words] = rows
            stores.append((ranking, rows, words, store))
    return stores, aliases


def _ranking(name: str) -> KeywordRanking:
    if name == "ts_rank_cd":
        return "ts_rank_cd"
    if name == "ts_rank":
        return "ts_rank"
    raise ValueError(f"--rankings: unknown keyword ranking {name!r}")


async def analyze(url: str) -> None:
    """Fresh planner statistics of the chunks (where the common words are read from)."""
    import asyncpg

    conn = await asyncpg.connect(asyncpg_url(url))
    try:
        await conn.execute("ANALYZE chunks")
    finally:
        await conn.close()


async def sweep_sample(
    settings: Settings, grid: Grid, dataset: QualityDataset, queries: QueryCache
) -> list[Scored]:
    results: list[Scored] = []
    server_url = await resolve_database_url(settings)
    for chunk in grid.chunk_sizes:
        chunked = settings.model_copy(update={"chunk_max_tokens": chunk})
        database = f"retrieval_sweep_c{chunk}"
        started = time.perf_counter()
        store, ingest = await open_sample_store(chunked, database, queries.inner)
        pages, chunks = await store.counts()
        await store.close()
        print(
            f"chunk {chunk}: {database} holds {pages} pages, {chunks} chunks (ingest: "
            f"{ingest.new} new, {ingest.unchanged} unchanged) in "
            f"{time.perf_counter() - started:.0f} s",
            file=sys.stderr,
        )
        url = with_database(server_url, database)
        await analyze(url)
        stores, aliases = await ranked_stores(settings, url, grid)
        scored: list[Scored] = []
        for ranking, rows, words, real in stores:
            deep = DeepCandidates(real, max(grid.depths), max(grid.depths))
            started = time.perf_counter()
            try:
                for kv, kk, rrf_k, weight in grid.fusion():
                    searcher = retriever(deep, queries, settings, kv, kk, rrf_k, weight)
                    scores = await score_config(
                        dataset, searcher, "hybrid", settings.retrieval.top_k_final
                    )
                    point = Point(chunk, ranking, rows, kv, kk, rrf_k, weight)
                    scored.append(
                        Scored(
                            SAMPLE,
                            point,
                            scores.mean(lambda s: s.ndcg),
                            scores.mean(lambda s: s.recall),
                            scores.mean(lambda s: s.reciprocal_rank),
                            scores.mean(lambda s: s.ndcg, "exact-token"),
                            len(words),
                        )
                    )
            finally:
                await deep.close()
            print(
                f"chunk {chunk}, {ranking}, common rows {rows} ({len(words)} common words): "
                f"{len(list(grid.fusion()))} points in {time.perf_counter() - started:.0f} s",
                file=sys.stderr,
            )
        results += expand_bounds(scored, aliases)
    return results


def expand_bounds(results: list[Scored], aliases: Aliases) -> list[Scored]:
    """Each bound that was not searched gets the figures of the bound that gave the same
    common words."""
    out = list(results)
    for (ranking, rows), searched in aliases.items():
        out += [
            dataclasses.replace(r, point=dataclasses.replace(r.point, keyword_common_rows=rows))
            for r in results
            if r.point.keyword_ranking == ranking and r.point.keyword_common_rows == searched
        ]
    return out


async def sweep_known_items(
    settings: Settings, grid: Grid, size: int, queries_n: int, queries: QueryCache
) -> list[Scored]:
    items, vectors = known_item_corpus(settings, queries.inner, size, queries_n)
    database = text_database(items, queries.inner)
    store, _ = await open_text_store(settings, items, vectors, database)
    await store.close()
    url = with_database(await resolve_database_url(settings), database)
    await analyze(url)
    known = select_split(
        [
            KnownItem(f"q{i:04d}", query, chunk_id(answer))
            for i, (query, answer) in enumerate(zip(items.queries, items.answers, strict=True))
        ],
        lambda item: item.query,
        "train",
    )
    benchmark = f"known-item {size} (train)"
    results: list[Scored] = []
    stores, aliases = await ranked_stores(settings, url, grid)
    for ranking, rows, words, real in stores:
        deep = DeepCandidates(real, max(grid.depths), max(grid.depths))
        started = time.perf_counter()
        try:
            for kv, kk, rrf_k, weight in grid.fusion():
                searcher = retriever(deep, queries, settings, kv, kk, rrf_k, weight)
                config = await score_known_items(
                    known,
                    searcher,
                    "hybrid",
                    final_k=settings.retrieval.top_k_final,
                    pool=settings.retrieval.top_k_rerank,
                    acl=[TEXT_ACL],
                )
                point = Point(0, ranking, rows, kv, kk, rrf_k, weight)
                results.append(
                    Scored(
                        benchmark,
                        point,
                        config.mean(lambda s: s.ndcg),
                        config.mean(lambda s: s.recall),
                        config.mean(lambda s: s.reciprocal_rank),
                        None,
                        len(words),
                    )
                )
        finally:
            await deep.close()
        print(
            f"{size}: {ranking}, common rows {rows} ({len(words)} common words): "
            f"{len(list(grid.fusion()))} points over {len(known)} queries in "
            f"{time.perf_counter() - started:.0f} s",
            file=sys.stderr,
        )
    return expand_bounds(results, aliases)


@dataclass
class Choice:
    point: Point
    objective: float
    by_benchmark: dict[str, float]
    exact_token: float | None


def choose(results: Sequence[Scored], defaults: Point) -> tuple[Choice, Choice, list[Choice]]:
    """(the chosen point, today's defaults, every sample point ranked by the objective)."""
    others: dict[str, dict[tuple[object, ...], Scored]] = {}
    for r in results:
        if r.benchmark != SAMPLE:
            others.setdefault(r.benchmark, {})[r.point.without_chunk()] = r
    choices = []
    for r in results:
        if r.benchmark != SAMPLE:
            continue
        by = {SAMPLE: r.ndcg}
        for name, table in others.items():
            match = table.get(r.point.without_chunk())
            if match is None:
                break
            by[name] = match.ndcg
        else:
            choices.append(Choice(r.point, statistics.fmean(by.values()), by, r.exact_token))
    choices.sort(key=lambda c: (-c.objective, len(c.point.changes(defaults))))
    today = next(c for c in choices if c.point == defaults)
    floor = (today.exact_token or 0.0) - EXACT_TOKEN_SLACK
    allowed = [c for c in choices if (c.exact_token or 0.0) >= floor]

    def pick(among: list[Choice]) -> Choice:
        tied = [c for c in among if c.objective >= among[0].objective - TIE]
        return min(tied, key=lambda c: (len(c.point.changes(defaults)), -c.objective))

    chosen = pick(allowed)
    if chosen.point.chunk_max_tokens != defaults.chunk_max_tokens:
        # Another chunk size means re-ingesting every store: it has to earn that.
        same = [c for c in allowed if c.point.chunk_max_tokens == defaults.chunk_max_tokens]
        if same and chosen.objective - same[0].objective < CHUNK_MARGIN:
            chosen = pick(same)
    return chosen, today, choices


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def report_markdown(
    results: Sequence[Scored], defaults: Point, grid: Grid, context: dict[str, str]
) -> str:
    chosen, today, choices = choose(results, defaults)
    benchmarks = list(chosen.by_benchmark)
    lines = ["## Fusion and depth swept on the training side", ""]
    lines += [f"- {k}: {v}" for k, v in context.items()]
    lines += [
        f"- grid: CHUNK_MAX_TOKENS {list(grid.chunk_sizes)}, KEYWORD_RANKING "
        f"{list(grid.rankings)}, KEYWORD_COMMON_ROWS {list(grid.common_rows)}, TOP_K_VECTOR "
        f"x TOP_K_KEYWORD {list(grid.depths)}^2, RRF_K {list(grid.rrf_ks)}, "
        f"RRF_KEYWORD_WEIGHT {list(grid.weights)}: {len(choices)} points",
        f"- objective: mean hybrid nDCG@10 over {', '.join(benchmarks)}; exact-token "
        f"nDCG@10 (sample, train) at least today's minus {EXACT_TOKEN_SLACK}; within {TIE} "
        f"of the best, the fewest changed settings; another CHUNK_MAX_TOKENS only if it "
        f"gains {CHUNK_MARGIN} over the best at today's (it means re-ingesting every store)",
        "",
    ]
    header = ["point", "objective", *benchmarks, "exact-token (sample train)", "floor"]
    lines += ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    floor = (today.exact_token or 0.0) - EXACT_TOKEN_SLACK

    def row(label: str, c: Choice) -> str:
        cells = [fmt(c.objective), *(fmt(c.by_benchmark[b]) for b in benchmarks)]
        kept = "kept" if (c.exact_token or 0.0) >= floor else "below"
        return f"| {label} | " + " | ".join([*cells, fmt(c.exact_token), kept]) + " |"

    lines.append(row("today's defaults", today))
    lines.append(
        row("chosen: " + (", ".join(chosen.point.changes(defaults)) or "no change"), chosen)
    )
    # Points that differ only in a common-word bound giving the same words: listed once.
    listed: set[tuple[object, ...]] = set()
    shown = 0
    for c in choices:
        key = (
            dataclasses.replace(c.point, keyword_common_rows=-1),
            c.objective,
            tuple(c.by_benchmark.values()),
        )
        if key in listed:
            continue
        listed.add(key)
        shown += 1
        lines.append(row(f"#{shown}: " + (", ".join(c.point.changes(defaults)) or "defaults"), c))
        if shown == 20:
            break
    lines += [
        "",
        "(#n: the best points by the objective, each listed once: a KEYWORD_COMMON_ROWS that "
        "gives the same common words as another gives the same searches; the list shows the "
        "one nearest today's defaults, 'floor': the exact-token floor kept or not.)",
        "",
        "Each setting's best objective with the others free (and with the others at "
        "today's defaults):",
        "",
    ]
    lines += ["| setting | value | best objective | others at defaults |", "|---|---|---:|---:|"]
    for f in dataclasses.fields(Point):
        values = sorted(
            {getattr(c.point, f.name) for c in choices}, key=lambda v: (str(type(v)), v)
        )
        for value in values:
            mine = [c for c in choices if getattr(c.point, f.name) == value]
            alone = [
                c
                for c in mine
                if dataclasses.replace(c.point, **{f.name: getattr(defaults, f.name)}) == defaults
            ]
            lines.append(
                f"| {f.name.upper()} | {value} | {fmt(max(c.objective for c in mine))} | "
                f"{fmt(alone[0].objective) if alone else 'n/a'} |"
            )
    env = " ".join(chosen.point.changes(defaults))
    lines += ["", f"Chosen environment: `{env or '(the defaults)'}`", ""]
    return "\n".join(lines)


def parse_ints(text: str, name: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise SystemExit(f"{name}: not a list of integers: {text!r}") from None


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.retrieval_sweep",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = Grid()
    parser.add_argument("--sizes", default="10000", help="known-item sizes ('' for none)")
    parser.add_argument("--queries", type=int, default=Options.queries)
    parser.add_argument("--chunk-sizes", default=",".join(map(str, g.chunk_sizes)))
    parser.add_argument("--rankings", default=",".join(g.rankings))
    parser.add_argument("--common-rows", default=",".join(map(str, g.common_rows)))
    parser.add_argument("--depths", default=",".join(map(str, g.depths)))
    parser.add_argument("--rrf-k", default=",".join(map(str, g.rrf_ks)))
    parser.add_argument("--weights", default=",".join(map(str, g.weights)))
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    args = parser.parse_args(argv)
    rankings = tuple(r.strip() for r in args.rankings.split(",") if r.strip())
    for r in rankings:
        _ranking(r)
    try:
        weights = tuple(float(v) for v in args.weights.split(",") if v.strip())
    except ValueError:
        parser.error(f"--weights: not a list of numbers: {args.weights!r}")
    grid = Grid(
        parse_ints(args.chunk_sizes, "--chunk-sizes"),
        rankings,
        parse_ints(args.common_rows, "--common-rows"),
        parse_ints(args.depths, "--depths"),
        parse_ints(args.rrf_k, "--rrf-k"),
        weights,
    )
    return Options(parse_ints(args.sizes, "--sizes"), args.queries, grid, args.out_dir)


def grid_with_defaults(grid: Grid, defaults: Point) -> Grid:
    """The grid, holding today's defaults too (the choice is compared with them)."""

    def add(values: tuple[Any, ...], value: Any) -> tuple[Any, ...]:
        return values if value in values else (*values, value)

    return Grid(
        grid.chunk_sizes,  # '' skips the sample docs (the chunk size is the part's own)
        add(grid.rankings, defaults.keyword_ranking),
        add(grid.common_rows, defaults.keyword_common_rows),
        add(add(grid.depths, defaults.top_k_vector), defaults.top_k_keyword),
        add(grid.rrf_ks, defaults.rrf_k),
        add(grid.weights, defaults.rrf_keyword_weight),
    )


def write_part(out_dir: Path, tag: str, results: Sequence[Scored]) -> Path:
    """One part's figures (a chunk size of the sample docs, a known-item size)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"part-{tag}.jsonl"
    path.write_text(
        "".join(
            json.dumps({**dataclasses.asdict(r), "point": dataclasses.asdict(r.point)}) + "\n"
            for r in results
        ),
        encoding="utf-8",
    )
    print(f"wrote {path}", file=sys.stderr)
    return path


def read_parts(out_dir: Path) -> tuple[list[Scored], list[str]]:
    """Every part in ``out_dir`` (this run's and earlier runs'), and their names."""
    results: list[Scored] = []
    names: list[str] = []
    for path in sorted(out_dir.glob("part-*.jsonl")):
        names.append(path.stem.removeprefix("part-"))
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            point = Point(**record.pop("point"))
            results.append(Scored(**{**record, "point": point}))
    return results, names


async def run(settings: Settings, options: Options) -> None:
    """Each part of the sweep, written as soon as it is done (a run may do some parts and
    another run the rest: the report reads them all)."""
    queries = QueryCache(build_embedder(embedder_config(settings)))
    dataset = load_quality_dataset(ROOT / DEFAULT_QUALITY_DATASET, repo_root=ROOT)
    train = dataclasses.replace(
        dataset, rows=tuple(select_split(dataset.rows, lambda row: row.id, "train"))
    )
    for chunk in options.grid.chunk_sizes:
        one = dataclasses.replace(options.grid, chunk_sizes=(chunk,))
        write_part(
            options.out_dir, f"sample-c{chunk}", await sweep_sample(settings, one, train, queries)
        )
    for size in options.sizes:
        results = await sweep_known_items(settings, options.grid, size, options.queries, queries)
        write_part(options.out_dir, f"known-{size}", results)


def observed_grid(results: Sequence[Scored]) -> Grid:
    def values(name: str) -> tuple[Any, ...]:
        return tuple(sorted({getattr(r.point, name) for r in results} - {0}))

    chunks = tuple(sorted({r.point.chunk_max_tokens for r in results if r.benchmark == SAMPLE}))
    return Grid(
        chunks,
        tuple(sorted({r.point.keyword_ranking for r in results})),
        tuple(sorted({r.point.keyword_common_rows for r in results})),
        tuple(
            sorted(
                {r.point.top_k_vector for r in results} | {r.point.top_k_keyword for r in results}
            )
        ),
        values("rrf_k"),
        tuple(sorted({r.point.rrf_keyword_weight for r in results}, reverse=True)),
    )


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    options = parse_args(argv)
    settings = load_settings()
    defaults = defaults_point(settings)
    options = dataclasses.replace(options, grid=grid_with_defaults(options.grid, defaults))
    started = time.perf_counter()
    if options.grid.chunk_sizes or options.sizes:  # else: only the report of earlier parts
        asyncio.run(run(settings, options))
    results, parts = read_parts(options.out_dir)
    if not any(r.benchmark == SAMPLE and r.point == defaults for r in results):
        print(
            f"no figures of today's defaults on the sample docs in {options.out_dir} yet "
            f"(a part sample-c{defaults.chunk_max_tokens} holding them): no report",
            file=sys.stderr,
        )
        return 1
    context = {
        "command (the last)": "python -m bench.retrieval_sweep " + " ".join(sys.argv[1:]),
        "parts": ", ".join(parts) + f" (part-*.jsonl in {options.out_dir})",
        "split": "the train side of evals.splits only (sample questions by id, known-item "
        "queries by text)",
        "seconds (the last command)": f"{time.perf_counter() - started:.0f}",
    }
    markdown = report_markdown(results, defaults, observed_grid(results), context)
    (options.out_dir / "sweep.md").write_text(markdown, encoding="utf-8")
    print(markdown)
    print(f"wrote {options.out_dir / 'sweep.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
