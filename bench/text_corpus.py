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
import functools
import hashlib
import re
import sys
import sysconfig
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
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
    for _, doc in sourced_docstrings():
        yield doc


def sourced_docstrings() -> Iterator[tuple[Path, str]]:
    """``docstrings()`` with the file each comes from."""
    for root in _source_roots():
        for path in sorted(root.rglob("*.py")):
            for doc in _docstrings(path):
                yield path, doc


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


# --- the known-item task (bench.retrieval_quality --corpus text) ---

KNOWN_ITEM_VERSION = 1  # part of the cached corpus's key: a change of the rules builds anew
PROSE_WORD = re.compile(r"^[A-Za-z][a-z]+[,.;:]?$")  # an English-looking word, not code


@dataclass(frozen=True)
class KnownItems:
    """A corpus and its known-item queries: ``queries[i]`` was taken from the docstring whose
    paragraph is ``texts[answers[i]]`` (and whose other paragraphs are not in ``texts``)."""

    texts: list[str]
    queries: list[str]
    answers: list[int]
    origins: list[str]  # the file each query came from, relative to its source root


def query_source(path: Path, stdlib: Path) -> bool:
    """Queries come from the standard library only (no site-packages, no test suites): the
    reranker's training pairs (``retrieval.reranker_training``) are mined from installed
    distributions, so the known-item queries and answers are never among them."""
    try:
        parts = path.relative_to(stdlib).parts
    except ValueError:
        return False
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test"}
    return not skip.intersection(parts)


def _prose(text: str, share: float = 0.6) -> bool:
    words = text.split(" ")
    return sum(bool(PROSE_WORD.match(w)) for w in words) >= share * len(words)


def known_item(doc: str) -> tuple[str, str] | None:
    """(query, answer) from one docstring: its first sentence, and the first paragraph of
    what follows that sentence (so the query's words are not copied into its answer). None
    for a docstring without both, or whose query or answer is mostly code."""
    text = doc.strip()
    match = SENTENCE_END.search(text)
    if match is None:
        return None
    words = WHITESPACE.sub(" ", text[: match.start()]).strip().split(" ")
    if len(words) < 5:
        return None
    query = " ".join(words[:QUERY_MAX_WORDS])
    answer = next(paragraphs(text[match.end() :]), None)
    if answer is None or not _prose(query) or not _prose(answer, 0.5):
        return None
    return query, answer


DocEntry = tuple[list[str], tuple[str, str] | None, str]  # paragraphs, known item, origin


@functools.cache
def _read_docstrings() -> tuple[list[DocEntry], Counter[str], Counter[str]]:
    """Every docstring once per process (minutes): its paragraphs, its known item (standard
    library only) and where it came from; how many docstrings each lead sentence starts and
    each paragraph appears in."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    docs: list[DocEntry] = []
    lead_count: Counter[str] = Counter()
    for path, doc in sourced_docstrings():
        item = known_item(doc) if query_source(path, stdlib) else None
        origin = str(path.relative_to(stdlib)) if item else ""
        docs.append((list(dict.fromkeys(paragraphs(doc))), item, origin))
        if lead := first_sentence(doc):
            lead_count[lead.lower()] += 1
    para_count: Counter[str] = Counter(p for paras, _, _ in docs for p in paras)
    return docs, lead_count, para_count


def build_known_items(n_chunks: int, n_queries: int, seed: int) -> KnownItems:
    """``n_chunks`` distinct docstring paragraphs, ``n_queries`` of them the answers of
    known-item queries (seeded choice of standard-library docstrings, see ``known_item``;
    the rest of each such docstring is left out of the corpus); the others as in
    ``build_texts``, from any docstring. A query whose sentence leads another docstring too,
    or whose answer is a paragraph of another docstring, is not used (two right answers)."""
    if not 0 < n_queries < n_chunks:
        raise ValueError("need 0 < queries < chunks")
    docs, lead_count, para_count = _read_docstrings()
    rng = np.random.default_rng(seed)
    items: list[tuple[str, str, str]] = []
    chunks: list[str] = []
    seen: set[str] = set()
    for i in rng.permutation(len(docs)):
        paras, item, origin = docs[i]
        if len(items) < n_queries and item is not None:
            query, answer = item
            own = answer in paras
            if (
                lead_count[query.lower()] <= 1
                and para_count[answer] <= int(own)
                and answer not in seen
            ):
                items.append((query, answer, origin))
                seen.add(answer)
                continue  # the rest of this docstring is held out
        if len(chunks) < n_chunks - n_queries:
            fresh = [p for p in paras if p not in seen]
            seen.update(fresh)
            chunks.extend(fresh[: n_chunks - n_queries - len(chunks)])
        if len(chunks) >= n_chunks - n_queries and len(items) >= n_queries:
            break
    if len(items) < n_queries or len(chunks) < n_chunks - n_queries:
        raise SystemExit(
            f"only {len(items)} known-item docstrings and {len(chunks)} other paragraphs are "
            "installed here; ask for fewer"
        )
    texts = [answer for _, answer, _ in items] + chunks
    order = rng.permutation(len(texts))  # answers spread over the corpus, not at its head
    position = {int(old): new for new, old in enumerate(order)}
    return KnownItems(
        texts=[texts[int(j)] for j in order],
        queries=[query for query, _, _ in items],
        answers=[position[j] for j in range(len(items))],
        origins=[origin for _, _, origin in items],
    )


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
