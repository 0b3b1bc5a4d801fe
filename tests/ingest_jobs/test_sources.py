"""How the driver and the executors count a chunk's tokens (``token_counter``)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from transformers import AutoTokenizer

from ingest_jobs.sources import token_counter
from retrieval.embedders import resolve_local_model

TEXTS = [
    "",
    "Occupancy sensors report every 30 seconds.",
    "héllo wörld, 日本語のテキスト 🙂 " * 40,  # past the 128 tokens the model's file truncates at
    "word " * 600,  # past the model's 512 positions: counted whole, never cut
    "a" * 5000,  # one word over WordPiece's 100 characters: one unknown token
]


def test_the_counter_counts_as_the_transformers_tokenizer_does_without_truncating() -> None:
    path = resolve_local_model("all-MiniLM-L6-v2")
    reference = AutoTokenizer.from_pretrained(path)
    count = token_counter(path)

    expected = [
        len(reference(t, add_special_tokens=False, truncation=False)["input_ids"]) for t in TEXTS
    ]

    assert [count(t) for t in TEXTS] == expected
    assert expected[3] == 600 and expected[2] > 128


def test_threads_may_count_at_once() -> None:
    count = token_counter(resolve_local_model("all-MiniLM-L6-v2"))
    alone = [count(t) for t in TEXTS * 20]

    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(count, TEXTS * 20))

    assert together == alone
