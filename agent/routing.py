"""Route a question before the model sees it, from signals that cost milliseconds.

Routes: ``greeting`` (no tools), ``live_data`` (the question names a building or room the
caller can see, or types an id), ``documentation`` (the documentation search matches it
well), ``both``, and ``open`` (no signal: the model may decline, say it does not know, or
use the live-data tools; the service's search already matched poorly, so it is not offered
again). A route decides what the model is offered: which tools, whether it may decline, and
which context the service fetched up front.

The rules, and why:

* A question that names a documented token (an error code such as ``CV-E1033``, a setting
  such as ``SENSOR_STALE_AFTER_SECONDS``) that the retrieved text contains is documentation
  and is never declined as off-topic: small models decline such questions as "not about
  buildings".
* A question that names such a token the caller's search does not find is documentation
  too, answered "I don't know" (the page does not exist or the caller may not see it; the
  two read the same), never declined.
* A question whose embedding is close to a chunk's (``similarity >= DOC_SIMILARITY``) is
  documentation and is never declined: paraphrases share few words with the page that
  answers them, but their meaning is close. Measured on the golden set (2026-12-02,
  all-MiniLM-L6-v2 over the sample docs): off-topic questions reach at most 0.48, the
  documentation paraphrases at least 0.58.
* A question whose content words the best retrieved chunk mostly covers
  (``coverage >= DOC_COVERAGE``) is documentation, but may still be declined: paraphrased
  off-topic requests ("translate 'the meeting room is full'") cover a few words by chance.
* Named or typed entities make it live data; with a documented token (found or not: the
  documentation's silence is an answer too), both.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DOC_COVERAGE",
    "DOC_SIMILARITY",
    "Route",
    "RouteDecision",
    "RouteSignals",
    "coverage",
    "doc_tokens",
    "is_greeting",
    "route",
]

Route = Literal["greeting", "live_data", "documentation", "both", "open"]

DOC_COVERAGE = 0.75  # share of the question's content words found in the best chunk
DOC_SIMILARITY = 0.55  # cosine of the question and its closest chunk (see the rules above)

_GREETING = re.compile(
    r"^\s*(hi|hello|hey|hiya|good (morning|afternoon|evening)|greetings|thanks|thank you)\b"
    r"|\bwho are you\b|\bwhat can you (help|do)\b",
    re.IGNORECASE,
)
# Error codes and rule/plan names (CV-E1033, NW-HARBOR-CAP-3, SP-25) and setting names.
_DOC_TOKEN = re.compile(r"\b(?:[A-Z][A-Z0-9]*(?:-[A-Z0-9]+)+|[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)\b")
_WORD = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset(
    re.findall(
        r"\w+",
        "a an the and or but if of to in on at by for with from into about as is are was were "
        "be been being do does did doing have has had having i me my we our you your it its "
        "this that these those there here what which who whom whose when where why how can "
        "could would should will shall may might must not no yes so than then too very just "
        "also any all some each get got set up out over under again once more most much many "
        "such only own same both few other s t ",
    )
)


def is_greeting(question: str) -> bool:
    """A short hello, thanks or "what can you do" (no tool needed)."""
    return len(question.split()) <= 12 and bool(_GREETING.search(question))


def doc_tokens(question: str) -> list[str]:
    return list(dict.fromkeys(_DOC_TOKEN.findall(question)))


def _stem(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") else word


def content_words(text: str) -> set[str]:
    return {_stem(w) for w in _WORD.findall(text.lower()) if w not in _STOPWORDS}


def coverage(question: str, text: str) -> float:
    """The share of the question's content words that ``text`` contains (0 for none)."""
    wanted = content_words(question)
    if not wanted:
        return 0.0
    return len(wanted & content_words(text)) / len(wanted)


@dataclass(frozen=True)
class RouteSignals:
    """What the router looks at: all cheap, all computed as the asking user."""

    greeting: bool = False
    entities: int = 0  # buildings/rooms named, plus ids typed
    building_list: bool = False  # the question asks which buildings the caller has
    doc_tokens_found: bool = False  # a documented token of the question is in retrieved text
    doc_tokens: bool = False  # the question names a documented-looking token at all
    doc_coverage: float = 0.0  # best chunk's coverage of the question's content words
    doc_similarity: float = 0.0  # cosine of the question and the closest retrieved chunk


@dataclass(frozen=True)
class RouteDecision:
    route: Route
    allow_refusal: bool
    why: str

    @property
    def wants_docs(self) -> bool:
        return self.route in ("documentation", "both")

    @property
    def wants_live(self) -> bool:
        return self.route in ("live_data", "both")


def route(signals: RouteSignals) -> RouteDecision:
    """The route for these signals (see the module docstring for the rules)."""
    strong_docs = signals.doc_tokens_found
    docs = strong_docs or signals.doc_coverage >= DOC_COVERAGE
    if signals.entities:
        if strong_docs or signals.doc_tokens:
            # Even a token the caller's search does not find: the question asks about a
            # document ("rule set NW-HARBOR-CAP-3"), and an empty result says so.
            return RouteDecision("both", False, "entities and a documented token")
        return RouteDecision("live_data", False, "the question names a building, room or id")
    if signals.building_list:
        return RouteDecision("live_data", False, "the question asks for the caller's buildings")
    if strong_docs:
        return RouteDecision("documentation", False, "a documented token the search found")
    if signals.doc_tokens:
        why = "a documented token the caller's search does not find"
        return RouteDecision("documentation", False, why)
    if signals.greeting:
        return RouteDecision("greeting", True, "a greeting")
    if signals.doc_similarity >= DOC_SIMILARITY:
        why = f"a chunk is close to the question (cosine {signals.doc_similarity:.2f})"
        return RouteDecision("documentation", False, why)
    if docs:
        why = f"documentation covers {signals.doc_coverage:.0%} of the question"
        return RouteDecision("documentation", True, why)
    why = (
        f"no routing signal: cosine {signals.doc_similarity:.2f}, "
        f"coverage {signals.doc_coverage:.0%}"
    )
    return RouteDecision("open", True, why)


def best_coverage(question: str, texts: Sequence[str]) -> float:
    return max((coverage(question, text) for text in texts), default=0.0)
