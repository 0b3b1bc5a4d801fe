"""How the driver and the executors count a chunk's tokens (``ingest_jobs.token_counts``):
the same counts as the embedder's tokenizer, word by word where that is exact."""

from __future__ import annotations

import random
import string
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import AutoTokenizer

from ingest_jobs import token_counts
from ingest_jobs.token_counts import WordCounts, token_counter
from retrieval.chunking import parse_source
from retrieval.embedders import resolve_local_model

DOCUMENTATION = Path(__file__).resolve().parents[2] / "documentation"

TEXTS = [
    "",
    "Occupancy sensors report every 30 seconds.",
    "héllo wörld, 日本語のテキスト 🙂 " * 40,  # past the 128 tokens the model's file truncates at
    "word " * 600,  # past the model's 512 positions: counted whole, never cut
    "a" * 5000,  # one word over WordPiece's 100 characters: one unknown token
    "The [CLS] and [SEP] tokens; [cls] in lower case; [MASK]ed.",  # added tokens, matched whole
    "CamelCase_identifiers, e-mail@example.com, v2.3.1-rc4, 3.5% of B-12's floor.\tTab\r\n",
]


def _whole(tokenizer: Any) -> Any:
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


def _random_ascii(rng: random.Random, length: int) -> str:
    """Every ASCII character, control characters included, among words and punctuation."""
    alphabet = string.printable * 4 + "".join(map(chr, range(128))) + " [CLS] "
    return "".join(rng.choice(alphabet) for _ in range(length))


def _texts() -> list[str]:
    rng = random.Random(15)
    pages = [
        parse_source(path.read_text(encoding="utf-8"), str(path)).body
        for path in sorted(DOCUMENTATION.rglob("*.md"))
    ]
    paragraphs = [p for page in pages for p in page.split("\n\n")]
    return (
        TEXTS + pages + paragraphs + [_random_ascii(rng, rng.randint(1, 400)) for _ in range(3000)]
    )


def test_the_counter_counts_as_the_transformers_tokenizer_does_without_truncating() -> None:
    path = resolve_local_model("all-MiniLM-L6-v2")
    reference = AutoTokenizer.from_pretrained(path)
    count = token_counter(path)

    expected = [
        len(reference(t, add_special_tokens=False, truncation=False)["input_ids"]) for t in TEXTS
    ]

    assert [count(t) for t in TEXTS] == expected
    assert expected[3] == 600 and expected[2] > 128


def test_the_packaged_tokenizer_is_counted_word_by_word_with_the_same_counts() -> None:
    path = resolve_local_model("all-MiniLM-L6-v2")
    count = token_counter(path)
    backend = AutoTokenizer.from_pretrained(path).backend_tokenizer
    backend.no_truncation()  # the model's file truncates and pads to 128
    backend.no_padding()
    whole = _whole(backend)
    texts = _texts()
    assert len(texts) > 3000

    assert isinstance(count, WordCounts)
    assert [count(t) for t in texts] == [whole(t) for t in texts]


def _tiny_wordpiece(*, lowercase: bool, clean_text: bool = True) -> Tokenizer:
    vocab = ["[UNK]", "[CLS]", "the", "The", "occ", "Occ", "##up", "##ancy", "room", "##s"]
    vocab += list(string.ascii_letters + string.digits + string.punctuation)
    vocab += ["##" + c for c in string.ascii_letters + string.digits]
    tokenizer = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase, clean_text=clean_text)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.add_special_tokens(["[CLS]"])
    return tokenizer


@pytest.mark.parametrize("lowercase", [True, False])
def test_a_cased_or_uncased_wordpiece_is_counted_exactly(lowercase: bool) -> None:
    tokenizer = _tiny_wordpiece(lowercase=lowercase)
    whole = _whole(tokenizer)
    count = WordCounts(tokenizer, whole)
    texts = [*_texts(), "The Occupancy of rooms", "THE OCCUPANCY", "the occupancy"]

    assert [count(t) for t in texts] == [whole(t) for t in texts]


def test_other_tokenizers_are_counted_whole() -> None:
    byte_level = Tokenizer(models.BPE())
    byte_level.pre_tokenizer = pre_tokenizers.ByteLevel()
    sentencepiece = Tokenizer(models.Unigram())
    sentencepiece.pre_tokenizer = pre_tokenizers.Metaspace()

    assert WordCounts.applies_to(_tiny_wordpiece(lowercase=True))
    assert not WordCounts.applies_to(_tiny_wordpiece(lowercase=True, clean_text=False))
    assert not WordCounts.applies_to(byte_level)
    assert not WordCounts.applies_to(sentencepiece)


def test_the_word_cache_stays_bounded_and_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(token_counts, "WORD_CACHE_LIMIT", 50)
    tokenizer = _tiny_wordpiece(lowercase=True)
    whole = _whole(tokenizer)
    count = WordCounts(tokenizer, whole)
    texts = _texts()[:500]

    assert [count(t) for t in texts] == [whole(t) for t in texts]
    assert len(count._cache) <= 50 + max(len(t.split()) for t in texts) * 2


def test_threads_may_count_at_once() -> None:
    count = token_counter(resolve_local_model("all-MiniLM-L6-v2"))
    texts = _texts()[:400] * 5
    alone = [count(t) for t in texts]

    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(count, texts))

    assert together == alone
