"""The training and held-out sides of the retrieval benchmarks (issue 16, item 4).

Settings are swept and chosen on the training side; the held-out side only checks the choice.
A row's side is a pure function of a stable key (a labelled question's id, a known-item
query's text): the first 8 bytes of SHA-256 over ``SPLIT_SALT`` and the key, read as a
fraction of 2**64, train below ``TRAIN_SHARE``. So the split is the same on every machine
and run, the two sides are disjoint and cover every row, and adding rows to a dataset never
moves an existing row from one side to the other (a held-out question stays held out).
The shares per category are close to 60/40, not exact (the split is per row, not sorted
within a category); ``split_counts`` says what they are.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Literal, TypeVar

Split = Literal["train", "heldout"]
SPLITS: tuple[Split, ...] = ("train", "heldout")
SPLIT_SALT = "issue-16-item-4"
TRAIN_SHARE = 0.6

T = TypeVar("T")


def split_of(key: str, *, train_share: float = TRAIN_SHARE) -> Split:
    """The side of the row whose stable key is ``key``."""
    digest = hashlib.sha256(f"{SPLIT_SALT}\0{key}".encode()).digest()
    fraction = int.from_bytes(digest[:8], "big") / 2**64
    return "train" if fraction < train_share else "heldout"


def select_split(rows: Iterable[T], key: Callable[[T], str], split: Split | None) -> list[T]:
    """The rows on ``split``'s side, in their order (all of them for None)."""
    return [row for row in rows if split is None or split_of(key(row)) == split]


def split_counts(
    rows: Sequence[T], key: Callable[[T], str], stratum: Callable[[T], str]
) -> dict[str, dict[Split, int]]:
    """Rows per stratum (e.g. category) and side, for the report."""
    counts: Counter[tuple[str, Split]] = Counter((stratum(r), split_of(key(r))) for r in rows)
    strata = sorted({s for s, _ in counts})
    return {s: {side: counts[(s, side)] for side in SPLITS} for s in strata}
