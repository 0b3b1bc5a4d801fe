"""``retrieval.reranker_training``: pairs mined from fixture text (junk dropped, deduplicated,
capped per package, seeded), hard negatives from the real ``HybridRetriever`` over a tiny
in-memory store, and a few-step training run of a tiny cross-encoder that is deterministic,
resumes from its checkpoint, and loads through ``CrossEncoderReranker``."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from retrieval import reranker_training as rt
from retrieval.rerankers import (
    CrossEncoderReranker,
    NoopReranker,
    resolve_reranker_model,
    trained_model_dir,
)
from retrieval.search import HybridRetriever, RetrievalConfig
from retrieval.store import Candidate, DocumentRecord, StoredDocument, WriteOutcome

PROSE = (
    "The scheduler keeps a queue of pending jobs and starts each one when a worker becomes "
    "free, retrying a failed job twice with a growing delay before it gives up and reports "
    "the failure to whoever submitted it."
)

DESCRIPTION = f"""# quickqueue

A tiny job queue.

## How retries work

{PROSE}

## Installation

```bash
pip install quickqueue
```

## Licence

Permission is hereby granted, free of charge, to any person obtaining a copy of this
software and associated documentation files, to deal in the Software without restriction,
including without limitation the rights to use, copy, modify, merge, publish, distribute.

## Short

Too short to be a passage.

Configuring workers
-------------------

Workers read their settings from the environment when they start, so a change of the pool
size or of the retry delay needs a restart of every worker process that the queue runs now.
"""

MODULE = f'''
"""Job queue internals."""

def submit(job):
    """Put a job on the queue and return its ticket.

    {PROSE}

    Args:
        job: the job.
    """


def tiny():
    """Too short. Really."""
'''


def test_heading_pairs_keep_prose_sections_and_drop_junk() -> None:
    pairs = list(rt.heading_pairs("quickqueue", DESCRIPTION))
    by_query = {p.query: p for p in pairs}
    assert set(by_query) == {"How retries work", "Configuring workers"}  # RST heading too
    retries = by_query["How retries work"]
    assert retries.passage == PROSE
    assert retries.section == "quickqueue > quickqueue"  # the parent path, not the heading
    assert retries.kind == "heading"


def test_docstring_pairs_split_the_first_sentence_from_the_description() -> None:
    pairs = list(rt.docstring_pairs("quickqueue", "quickqueue.core", MODULE))
    assert [(p.query, p.passage, p.section) for p in pairs] == [
        (
            "Put a job on the queue and return its ticket.",
            PROSE,
            "quickqueue > quickqueue.core.submit",
        )
    ]


def _package(name: str, sections: int) -> rt.PackageText:
    body = "\n\n".join(
        f"## Topic {name} number {i}\n\n{PROSE} This is about {name} topic {i}."
        for i in range(sections)
    )
    shared = f"\n\n## Getting started quickly\n\n{PROSE} Start {name} like this, one step each."
    return rt.PackageText(name, body + shared)


def test_mine_pairs_caps_each_package_drops_shared_headings_and_is_seeded() -> None:
    texts = [_package("alpha", 30), _package("beta", 3), _package("gamma", 2)]
    pairs = rt.mine_pairs(texts, per_package=5, seed=7)
    counts = {name: sum(p.package == name for p in pairs) for name in ("alpha", "beta", "gamma")}
    assert counts == {"alpha": 5, "beta": 3, "gamma": 2}  # the cap; "Getting started" in 3
    assert all(p.query != "Getting started quickly" for p in pairs)
    assert len({p.passage for p in pairs}) == len(pairs)
    assert pairs == rt.mine_pairs(texts, per_package=5, seed=7)
    assert pairs != rt.mine_pairs(texts, per_package=5, seed=8)


def test_mine_pairs_drops_a_passage_seen_twice() -> None:
    twice = rt.PackageText("dup", f"## First name\n\n{PROSE}\n\n## Second name\n\n{PROSE}\n")
    assert len(rt.mine_pairs([twice])) == 1


# --- hard negatives over a tiny store ---


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


class BagEmbedder:
    """Hashed bag of words: similar words, similar vectors (deterministic, no model)."""

    name = "bag"
    dim = 64
    max_tokens = 512

    def count_tokens(self, text: str) -> int:
        return len(_tokens(text))

    def encode(self, texts: Sequence[str]) -> np.ndarray[Any, np.dtype[np.float32]]:
        rows = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in _tokens(text):
                rows[i, int(hashlib.sha1(word.encode()).hexdigest(), 16) % self.dim] += 1.0
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        return np.asarray(rows / norms, dtype=np.float32)

    async def aencode(self, texts: Sequence[str]) -> np.ndarray[Any, np.dtype[np.float32]]:
        return self.encode(texts)


@dataclass
class MemoryStore:
    """The DocumentStore port in memory: cosine for the vector side, word overlap for the
    keyword side."""

    docs: dict[str, DocumentRecord] = field(default_factory=dict)

    async def documents(self) -> dict[str, StoredDocument]:
        return {
            s: StoredDocument(s, d.fingerprint, d.permissions, len(d.chunks))
            for s, d in self.docs.items()
        }

    async def write_document(self, doc: DocumentRecord) -> WriteOutcome:
        return (await self.write_documents([doc]))[0]

    async def write_documents(self, docs: Sequence[DocumentRecord]) -> list[WriteOutcome]:
        out: list[WriteOutcome] = []
        for doc in docs:
            out.append("replaced" if doc.source in self.docs else "new")
            self.docs[doc.source] = doc
        return out

    async def delete_sources(self, sources: Iterable[str]) -> int:
        return sum(self.docs.pop(s, None) is not None for s in sources)

    async def hybrid_candidates(
        self,
        query_text: str,
        query_vector: np.ndarray[Any, np.dtype[np.float32]],
        acl: Sequence[str],
        *,
        k_vector: int,
        k_keyword: int,
    ) -> list[Candidate]:
        chunks = [(d, c) for d in self.docs.values() for c in d.chunks]
        words = set(_tokens(query_text))
        by_vector = sorted(
            chunks, key=lambda dc: (-float(dc[1].embedding @ query_vector), dc[1].id)
        )
        by_words = sorted(
            (dc for dc in chunks if words & set(_tokens(dc[1].text))),
            key=lambda dc: (-len(words & set(_tokens(dc[1].text))), dc[1].id),
        )
        vrank = {c.id: i + 1 for i, (_, c) in enumerate(by_vector[:k_vector])}
        krank = {c.id: i + 1 for i, (_, c) in enumerate(by_words[:k_keyword])}
        return [
            Candidate(
                c.id,
                d.source,
                d.title,
                c.section,
                c.kind,
                c.text,
                vrank.get(c.id),
                krank.get(c.id),
                None,
            )
            for d, c in chunks
            if c.id in vrank or c.id in krank
        ]

    async def counts(self) -> tuple[int, int]:
        return len(self.docs), sum(len(d.chunks) for d in self.docs.values())

    async def close(self) -> None:
        return None


TOPICS = {
    "retry": "retry failed jobs with a growing delay before giving up on them",
    "queue": "queue jobs in order and start them when a worker is free",
    "delay": "delay a job until a given time before it may be started by a worker",
    "cache": "cache the result of a function call on disk between runs of a program",
    "colour": "colour the terminal output of a command line program with escape codes",
    "parse": "parse a date written in many human formats into a datetime value",
}


def _pairs() -> list[rt.Pair]:
    return [
        rt.Pair(
            f"how to {name}", f"{text}. " + PROSE, f"pkg{i % 2} > {name}", f"pkg{i % 2}", "heading"
        )
        for i, (name, text) in enumerate(TOPICS.items())
    ]


def test_negatives_are_the_hybrid_searchs_top_non_positives_plus_random_ones() -> None:
    pairs = _pairs()
    embedder = BagEmbedder()

    async def run() -> tuple[list[rt.Example], list[str]]:
        store = MemoryStore()
        assert await rt.index_passages(store, embedder, pairs) == len(pairs)
        assert await rt.index_passages(store, embedder, pairs) == 0  # unchanged: skipped
        retriever = HybridRetriever(store, embedder, NoopReranker(), RetrievalConfig())
        hits = await retriever.search("how to retry", acl=[], top_k=6)
        mined = await rt.mine_negatives(retriever, pairs, hard=2, random_negatives=1, seed=3)
        return mined, [f"{h.section}\n\n{h.text}" for h in hits]

    examples, ranked = asyncio.run(run())
    assert len(examples) == len(pairs)
    shown = {p.query: f"{p.section}\n\n{p.passage}" for p in pairs}
    for example in examples:
        assert example.positive == shown[example.query]
        assert example.hard == 2 and len(example.negatives) == 3
        assert example.positive not in example.negatives
        assert len(set(example.negatives)) == 3
    retry = next(e for e in examples if e.query == "how to retry")
    assert retry.negatives[:2] == [r for r in ranked if r != retry.positive][:2]
    assert examples == asyncio.run(run())[0]  # seeded


# --- training ---


TINY = rt.TrainConfig(
    steps=4, batch_size=4, layers=1, max_length=48, seed=5, save_steps=2, warmup_ratio=0.0
)


def _examples() -> list[rt.Example]:
    pairs = _pairs()
    shown = [f"{p.section}\n\n{p.passage}" for p in pairs]
    return [
        rt.Example(p.query, shown[i], [shown[(i + 1) % len(shown)], shown[(i + 3) % len(shown)]], 1)
        for i, p in enumerate(pairs)
    ]


def _weights(folder: Path) -> dict[str, Any]:
    from safetensors.numpy import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.mark.slow
def test_a_few_steps_are_deterministic_resume_and_load_as_a_reranker(tmp_path: Path) -> None:
    from transformers import TrainerCallback

    class Stop(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if state.global_step >= 2:
                control.should_training_stop = True
            return control

    examples = _examples()
    straight = rt.train_reranker(
        examples, tmp_path / "a-work", tmp_path / "a", TINY, progress=False
    )
    assert straight.steps == 4 and straight.resumed_from is None
    again = rt.train_reranker(examples, tmp_path / "b-work", tmp_path / "b", TINY, progress=False)
    first, second = _weights(straight.model_dir), _weights(again.model_dir)
    assert all(np.array_equal(first[k], second[k]) for k in first)  # seeded: bit for bit

    stopped = rt.train_reranker(
        examples, tmp_path / "c-work", tmp_path / "c", TINY, progress=False, callbacks=[Stop()]
    )
    assert stopped.steps == 2 and not (tmp_path / "c").exists()
    resumed = rt.train_reranker(examples, tmp_path / "c-work", tmp_path / "c", TINY, progress=False)
    assert resumed.resumed_from == 2 and resumed.steps == 4
    third = _weights(resumed.model_dir)
    assert all(np.allclose(first[k], third[k], atol=1e-6) for k in first)

    card = (resumed.model_dir / "training.json").read_text()
    assert '"layers": 1' in card and '"seed": 5' in card
    assert (resumed.model_dir / "train_examples.jsonl").exists()

    home = tmp_path / "home"
    trained_model_dir(home).parent.mkdir(parents=True)
    resumed.model_dir.rename(trained_model_dir(home))
    reranker = CrossEncoderReranker(resolve_reranker_model("trained", home))
    scores = reranker.score("how to retry", [e.positive for e in examples])
    assert len(scores) == len(examples) and len(set(scores)) > 1


def test_trained_alias_needs_the_folder(tmp_path: Path) -> None:
    assert resolve_reranker_model("some/folder", tmp_path) == "some/folder"
    with pytest.raises(RuntimeError, match="train-reranker"):
        resolve_reranker_model("trained", tmp_path)
