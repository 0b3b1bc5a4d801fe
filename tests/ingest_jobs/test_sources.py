"""How the driver and the executors count a chunk's tokens (``token_counter``), and how
the driver's survey cuts without counting what surely fits (``cut_counter``)."""

from __future__ import annotations

import random
import string
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import AutoTokenizer

from ingest_jobs.sources import cut_counter, token_counter, tokens_cover_characters
from retrieval.chunking import chunk_markdown, parse_source
from retrieval.embedders import resolve_local_model

DOCUMENTATION = Path(__file__).resolve().parents[2] / "documentation"

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


def _random_ascii(rng: random.Random, length: int) -> str:
    """Every ASCII character, control characters included, with words and punctuation."""
    alphabet = string.printable * 4 + "".join(map(chr, range(128)))
    return "".join(rng.choice(alphabet) for _ in range(length))


def test_an_ascii_text_has_no_more_tokens_than_characters() -> None:
    """What ``cut_counter`` rests on, for the packaged embedder's tokenizer."""
    count = token_counter(resolve_local_model("all-MiniLM-L6-v2"))
    rng = random.Random(15)
    texts = [_random_ascii(rng, rng.randint(1, 300)) for _ in range(2_000)]
    texts += ["[CLS] [SEP] [MASK] [UNK]", "a.b,c;d!e?f", "x" * 150, "I.B.M. v2.3.1-rc4"]

    assert all(count(t) <= len(t) for t in texts)


def _markdown_samples() -> list[str]:
    rng = random.Random(6)
    bodies = [
        parse_source(path.read_text(encoding="utf-8"), str(path)).body
        for path in sorted(DOCUMENTATION.rglob("*.md"))
    ]
    words = ["occupancy", "sensor", "room", "B-12", "floor's", "x", "3.5%", "é", "한국어", "🙂"]
    for _ in range(300):
        paragraphs = [
            " ".join(rng.choice(words) for _ in range(rng.randint(1, 60)))
            for _ in range(rng.randint(1, 6))
        ]
        bodies.append("# Title\n\n" + "\n\n".join(paragraphs))
    bodies += [_random_ascii(rng, rng.randint(1, 900)) for _ in range(300)]
    return bodies


@pytest.mark.parametrize("max_tokens", [16, 64, 200])
def test_the_survey_cuts_where_the_exact_count_cuts(max_tokens: int) -> None:
    path = resolve_local_model("all-MiniLM-L6-v2")
    exact, cut = token_counter(path), cut_counter(path, max_tokens)
    bodies = _markdown_samples()
    assert len(bodies) > 600

    for body in bodies:
        by_exact = chunk_markdown(body, exact, max_tokens)
        by_cut = chunk_markdown(body, cut, max_tokens)
        assert [(c.text, c.section, c.oversized) for c in by_cut] == [
            (c.text, c.section, c.oversized) for c in by_exact
        ]


def test_the_survey_counts_what_may_not_fit_exactly() -> None:
    path = resolve_local_model("all-MiniLM-L6-v2")
    exact, cut = token_counter(path), cut_counter(path, 200)

    # NFD splits a Hangul syllable into three letters: more tokens than characters
    for text in ["한국어 문서", "x" * 201, "word " * 100]:
        assert cut(text) == exact(text)
    assert exact("한국어") > len("한국어")


def test_only_a_tokenizer_whose_tokens_cover_characters_is_bounded_by_length() -> None:
    wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    wordpiece.normalizer = normalizers.BertNormalizer()
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    byte_level = Tokenizer(models.BPE())
    byte_level.pre_tokenizer = pre_tokenizers.ByteLevel()
    sentencepiece = Tokenizer(models.Unigram())
    sentencepiece.pre_tokenizer = pre_tokenizers.Metaspace()

    assert tokens_cover_characters(wordpiece)
    assert not tokens_cover_characters(byte_level)
    assert not tokens_cover_characters(sentencepiece)
    assert cut_counter(None, 200) is token_counter(None)  # a remote embedder's estimate
