"""A real-text corpus for the search benchmark: the docstrings of the installed Python packages
and the standard library (read with ``ast``, nothing is imported), split into paragraphs and
embedded with the configured embedder, cached on disk.

Docstrings are real technical English with real word statistics (code names, common words
that match tens of thousands of chunks, rare identifiers), so both sides of the hybrid search
see realistic work, and the vectors are the embedder's own, with their real geometry (MiniLM's
embeddings are far from uniform: they crowd into a narrow cone, which is what makes HNSW
recall hard). Queries are the first sentences of docstrings held out of the corpus.
"""

from __future__ import annotations

import ast
import hashlib
import re
import sys
import sysconfig
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt

from retrieval.embedders import Embedder

MIN_WORDS, MAX_WORDS = 8, 64  # a paragraph; longer ones are cut (MiniLM reads ~85 tokens)
QUERY_MAX_WORDS = 24
WHITESPACE = re.compile(r"\s+")
SENTENCE_END = re.compile(r"(?<=[.!?])\s")


def _source_roots() -> list[Path]:
    roots = {Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])}
    roots.add(Path(sysconfig.get_paths()["platlib"]))
    return sorted(r for r in roots if r.is_dir())


def _docstrings(path: Path) -> Iterator[str]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(path.read_bytes())
    except (SyntaxError, ValueError, OSError, RecursionError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            if doc:
                yield doc


def docstrings() -> Iterator[str]:
    """Every docstring of every ``.py`` file under the stdlib and site-packages, in a stable
    order (sorted paths)."""
    for root in _source_roots():
        for path in sorted(root.rglob("*.py")):
            yield from _docstrings(path)


def paragraphs(doc: str) -> Iterator[str]:
    for block in re.split(r"\n\s*\n", doc):
        words = WHITESPACE.sub(" ", block.replace("\x00", " ")).strip().split(" ")
        if len(words) >= MIN_WORDS:
            yield " ".join(words[:MAX_WORDS])


def first_sentence(doc: str) -> str | None:
    text = WHITESPACE.sub(" ", doc).strip()
    sentence = SENTENCE_END.split(text, maxsplit=1)[0]
    words = sentence.split(" ")
    if len(words) < 5:
        return None
    return " ".join(words[:QUERY_MAX_WORDS])


def build_texts(n_chunks: int, n_queries: int, seed: int) -> tuple[list[str], list[str]]:
    """``n_chunks`` distinct paragraphs and ``n_queries`` first sentences of other docstrings
    (held out: none of their paragraphs is in the corpus)."""
    seen: set[str] = set()
    docs: list[list[str]] = []
    leads: list[str | None] = []
    for doc in docstrings():
        paras = [p for p in paragraphs(doc) if p not in seen]
        if not paras:
            continue
        seen.update(paras)
        docs.append(paras)
        leads.append(first_sentence(doc))
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(docs))
    queries: list[str] = []
    chunks: list[str] = []
    for i in order:
        lead = leads[i]
        if len(queries) < n_queries and lead is not None:
            queries.append(lead)  # this docstring is held out of the corpus
        elif len(chunks) < n_chunks:
            chunks.extend(docs[i][: n_chunks - len(chunks)])
        if len(chunks) >= n_chunks and len(queries) >= n_queries:
            break
    if len(chunks) < n_chunks:
        raise SystemExit(
            f"only {len(chunks)} docstring paragraphs are installed here; ask for fewer chunks"
        )
    return chunks, queries


def embed_cached(
    texts: list[str], embedder: Embedder, cache_dir: Path, label: str
) -> npt.NDArray[np.float32]:
    """The embedder's vectors for ``texts``, from ``cache_dir`` when this exact list was
    embedded before by the same model (a 100k-chunk corpus takes minutes to embed on 2 cores)."""
    digest = hashlib.sha256()
    digest.update(f"{embedder.name}\0{getattr(embedder, 'dtype', '')}\0".encode())
    for text in texts:
        digest.update(text.encode())
        digest.update(b"\0")
    path = cache_dir / f"{label}-{len(texts)}-{digest.hexdigest()[:16]}.npy"
    if path.exists():
        vectors: npt.NDArray[np.float32] = np.load(path)
        return vectors
    from rich.progress import Progress

    batch = 64
    out = np.zeros((len(texts), embedder.dim), dtype=np.float32)
    with Progress(transient=True) as progress:
        task = progress.add_task(f"embedding {len(texts)} {label}", total=len(texts))
        for start in range(0, len(texts), batch):
            out[start : start + batch] = embedder.encode(texts[start : start + batch])
            progress.advance(task, min(batch, len(texts) - start))
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, out)
    tmp.replace(path)
    return out


if __name__ == "__main__":  # a quick count: python -m bench.text_corpus
    total = sum(1 for doc in docstrings() for _ in paragraphs(doc))
    print(f"{total} docstring paragraphs under {', '.join(map(str, _source_roots()))}")
    sys.exit(0)
