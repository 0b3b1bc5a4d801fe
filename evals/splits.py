"""The training and held-out sides of the retrieval benchmarks (issue 16, item 4), and the
rule that split the golden rows into dev and test (issue 42, below).

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
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from evals.dataset import Split as GoldenSplit

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


# --- dev and test: the golden rows' split (issue 42, build item 1) ---------------------------
#
# Not the retrieval benchmarks' train/held-out above: every golden row carries its side as an
# explicit `split:` key (evals/datasets/golden.yaml), and every row of test.yaml is `test`
# (evals.dataset: no key means test). The keys of golden.yaml were written once, on 2026-12-08,
# by ``golden_sides`` below, and are data from then on: a row never moves because a test
# elsewhere changed. ``tests/evals/test_dev_test_split.py`` checks that they still equal what
# the rule gives.

GOLDEN_SALT = "issue-42-golden"
# A golden row's kind, for stratifying: the first of these tags it carries, else "doc".
GOLDEN_KINDS = (
    "off-topic",
    "greeting",
    "tempt-fabrication",
    "unknown-building",
    "multi-hop",
    "permission",
    "idk",
    "paraphrase",
    "exact-token",
    "live-data",
)
OTHER_KIND = "doc"

# The golden rows whose question was quoted verbatim (case-insensitive, whitespace-normalised)
# in a file under tests/, bench/ or docs/ when the split was made (2026-12-08): the agent's
# tests and notes already used them, so they cannot measure what no one fitted to, and are
# dev. Where they were quoted: evals/README.md, "dev and test".
GOLDEN_QUOTED_AT_SPLIT: frozenset[str] = frozenset(
    {
        "live-get-building-acme-tower",
        "live-get-room-conf-12a",
        "live-latest-co2-conf-12a",
        "live-history-server-room-temperature",
        "live-list-sensors-server-room",
        "multihop-busiest-room-acme-tower",
        "multihop-quiet-room-has-no-sensors",
        "multihop-harbor-occupancy-northwind",
        "multihop-dock-b-temperature-offline",
        "unknown-building-id",
        "unknown-building-name",
        "unknown-foreign-room-id",
        "unknown-trick-domain-admin-sees-nothing",
        "doc-cfg-stale-exact",
        "doc-cfg-cooldown-exact",
        "doc-err-e1013-exact",
        "doc-err-e1014-exact",
        "doc-err-e1022-exact",
        "doc-err-e1033-exact",
        "doc-cfg-drift-reset-paraphrase",
        "perm-std-stale-from-user-page",
        "perm-runbook-admin-exact",
        "perm-runbook-badmin-hidden",
        "offtopic-general-knowledge",
        "offtopic-translation",
        "offtopic-other-product",
        "greeting-hello",
        "greeting-what-can-you-do",
        "idk-dark-mode",
        "idk-sensor-firmware",
        "tempt-co2-no-sensor-server-room",
        "tempt-offline-temperature-dock-b",
        "tempt-occupancy-no-sensor-quiet-room",
        "tempt-occupancy-no-sensor-cold-store",
    }
)


def question_key(text: str) -> str:
    """A question as the split and the leak scan compare it: case-folded, whitespace
    collapsed."""
    return " ".join(text.casefold().split())


def golden_kind(tags: Iterable[str]) -> str:
    present = set(tags)
    return next((kind for kind in GOLDEN_KINDS if kind in present), OTHER_KIND)


def _rank(key: str) -> str:
    return hashlib.sha256(f"{GOLDEN_SALT}\0{key}".encode()).hexdigest()


@dataclass(frozen=True)
class GoldenRow:
    id: str
    question: str
    tags: tuple[str, ...]


def golden_sides(rows: Sequence[GoldenRow], quoted: Iterable[str]) -> dict[str, GoldenSplit]:
    """The side of every row (by id), by the rule the golden set was split with:

    1. Rows that ask the same question (case-insensitive, whitespace-normalised) are one
       unit: a question is on one side, whoever asks it (the permission pairs).
    2. A question asked by a ``quoted`` row is dev (the code was already tested on it).
    3. Within each kind (``golden_kind`` of the unit's first row), the other questions, ranked
       by SHA-256 of ``GOLDEN_SALT`` and the question, are dev until half the kind's
       questions (rounded down) are dev; the rest are test.
    """
    quoted = set(quoted)
    units: dict[str, list[GoldenRow]] = {}
    for row in rows:
        units.setdefault(question_key(row.question), []).append(row)
    kinds: dict[str, list[str]] = {}
    for key, members in units.items():
        kinds.setdefault(golden_kind(members[0].tags), []).append(key)
    side: dict[str, GoldenSplit] = {}
    for keys in kinds.values():
        fixed = [k for k in keys if any(r.id in quoted for r in units[k])]
        rest = sorted((k for k in keys if k not in fixed), key=_rank)
        more = max(0, len(keys) // 2 - len(fixed))
        side.update(dict.fromkeys(fixed, "dev"))
        side.update({k: ("dev" if n < more else "test") for n, k in enumerate(rest)})
    return {row.id: side[question_key(row.question)] for row in rows}


# --- the leak scan: no test question in a file of tests/, bench/ or docs/ ----------------------

# A Python string literal continued on the next line ("... a much "\n    "longer ...") is
# joined before matching, so a question split across two literals is still found.
_CONTINUED_LITERAL = re.compile(r"""(["'])\s*\n\s*[bfrBFR]*\1""")


def searchable(text: str) -> tuple[str, str]:
    """A file's text as the scan matches questions in it: as written and with continued string
    literals joined, both case-folded with whitespace collapsed."""
    return question_key(text), question_key(_CONTINUED_LITERAL.sub("", text))


def quotes(views: tuple[str, str], question: str) -> bool:
    """The question appears in the text (``searchable``) as a whole phrase: not inside a
    longer word on either side."""
    pattern = re.compile(r"(?<!\w)" + re.escape(question_key(question)) + r"(?!\w)")
    return any(pattern.search(view) for view in views)
