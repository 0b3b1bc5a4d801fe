"""Route a question before the model sees it, from signals that cost milliseconds.

Routes: ``greeting`` (no tools), ``live_data`` (the question names a building or room the
caller can see, or types an id), ``documentation`` (the documentation search matches it
well), ``both``, and ``open`` (no signal: the model may decline, say it does not know, or
use the live-data tools; the service's search already matched poorly, so it is not offered
again). A route decides what the model is offered: which tools, whether it may decline, and
which context the service fetched up front.

The rules, and why:

* A question that names a documented token (an error code such as ``AB-E2044``, a setting
  such as ``READING_TIMEOUT_SECONDS``) that the retrieved text contains is documentation
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
  documentation's silence is an answer too), both; with a close chunk that names the
  building and covers what the question asks besides the name (a page about it, such as a
  site's rules: ``agent.small_model.planning``), both.
* A question in the product's own vocabulary (``product_words``: accounts, seats, gateways,
  webhooks, the app...) that asks for no live reading (``live_words``) but that nothing the
  caller may read matches is documentation the caller cannot see: the search is shown and
  the answer is "I don't know", never a decline (the page may exist and be restricted; the
  two must read the same) and never the small model's guess from weak chunks (it answered
  "switch to dark mode under Settings > Appearance" from a page on themes of alerts).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from agent.words import content_words, doc_tokens

__all__ = [
    "DOC_COVERAGE",
    "DOC_SIMILARITY",
    "Route",
    "RouteDecision",
    "RouteSignals",
    "beyond_reading",
    "coverage",
    "doc_tokens",
    "is_greeting",
    "live_words",
    "product_words",
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
# The product's own nouns, for questions about CrowdVision that need no live reading. Not
# "building" or "room": "Who designed the Empire State Building?" and "Translate 'the
# meeting room is full'" are off-topic rows of the golden set.
_PRODUCT_VOCABULARY = (
    "crowdvision dashboard app gateway webhook alert notification export api token key "
    "account user seat billing invoice subscription role admin viewer permission domain "
    "tenant setting configuration login password sso firmware integration"
)
# Words that ask for a live reading or a measurement: such a question goes to the live-data
# tools ("Which sensors are offline?"), not to the documentation.
_LIVE_VOCABULARY = (
    "people person busy busier busiest crowded occupancy occupied full fullest empty "
    "emptiest quiet quietest reading level current currently now today "
    "offline online reporting history trend level warm cold hot right"
)
_QUOTED = re.compile(r"(?<!\w)(?:'[^']*'|\"[^\"]*\"|‘[^’]*’|“[^”]*”)(?!\w)")


def is_greeting(question: str) -> bool:
    """A short hello, thanks or "what can you do" (no tool needed)."""
    return len(question.split()) <= 12 and bool(_GREETING.search(question))


def _unquoted(question: str) -> str:
    """The question without quoted text: "translate 'the meeting room is full'" is about
    translating, not about a room."""
    return _QUOTED.sub(" ", question)


def product_words(question: str) -> bool:
    """The question names something of the product (an account, a gateway, the app...)."""
    return bool(content_words(_unquoted(question)) & _PRODUCT_WORDS)


def live_words(question: str) -> bool:
    """The question asks for a live reading or measurement (people, now, offline...; the
    sensor types the tools list are read in ``agent.small_model.reading``)."""
    return bool(content_words(_unquoted(question)) & _LIVE_WORDS)


def beyond_reading(question: str) -> set[str]:
    """The question's content words that ask for no live reading ("busy", "now", "people"
    out): what it asks of a page, if anything."""
    return content_words(_unquoted(question)) - _LIVE_WORDS


def coverage(question: str, text: str) -> float:
    """The share of the question's content words that ``text`` contains (0 for none)."""
    wanted = content_words(question)
    if not wanted:
        return 0.0
    return len(wanted & content_words(text)) / len(wanted)


_PRODUCT_WORDS = content_words(_PRODUCT_VOCABULARY)
_LIVE_WORDS = content_words(_LIVE_VOCABULARY)


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
    # A chunk close to the question (``DOC_SIMILARITY``) names one of its buildings: a page
    # about them (site rules), not only a reading.
    doc_names_entity: bool = False
    product_words: bool = False  # the question names something of the product
    live_words: bool = False  # the question asks for a live reading


@dataclass(frozen=True)
class RouteDecision:
    route: Route
    allow_refusal: bool
    why: str
    # The documentation the caller may read does not hold what the question asks: the
    # search is shown and the answer is "I don't know" (no model call where answers are
    # composed).
    idk: bool = False

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
            # document ("rule set RS-DEPOT-7"), and an empty result says so.
            return RouteDecision("both", False, "entities and a documented token")
        if signals.doc_names_entity:
            return RouteDecision("both", False, "entities, and a close chunk that names them")
        return RouteDecision("live_data", False, "the question names a building, room or id")
    if signals.building_list:
        return RouteDecision("live_data", False, "the question asks for the caller's buildings")
    if strong_docs:
        return RouteDecision("documentation", False, "a documented token the search found")
    if signals.doc_tokens:
        why = "a documented token the caller's search does not find"
        return RouteDecision("documentation", False, why, idk=True)
    if signals.greeting:
        return RouteDecision("greeting", True, "a greeting")
    if signals.doc_similarity >= DOC_SIMILARITY:
        why = f"a chunk is close to the question (cosine {signals.doc_similarity:.2f})"
        return RouteDecision("documentation", False, why)
    if docs:
        why = f"documentation covers {signals.doc_coverage:.0%} of the question"
        return RouteDecision("documentation", True, why)
    scores = f"cosine {signals.doc_similarity:.2f}, coverage {signals.doc_coverage:.0%}"
    if signals.product_words and not signals.live_words:
        why = f"about the product, but the caller's documentation matches weakly: {scores}"
        return RouteDecision("documentation", False, why, idk=True)
    return RouteDecision("open", True, f"no routing signal: {scores}")
