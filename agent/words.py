"""The words of a text as the service compares them: lower-case, stop words out, a plural
``s`` stemmed. Shared by the citation check (``agent.citation_support``) and the small-model
strategy's routing and composing (``agent.small_model``)."""

from __future__ import annotations

import re

__all__ = ["content_words", "doc_tokens"]

# Error codes and rule/plan names (AB-E2044, RS-DEPOT-7, PL-10) and setting names.
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


def doc_tokens(question: str) -> list[str]:
    """The documented tokens a text names (error codes, rule names, setting keys), once each."""
    return list(dict.fromkeys(_DOC_TOKEN.findall(question)))


def _stem(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") else word


def content_words(text: str) -> set[str]:
    return {_stem(w) for w in _WORD.findall(text.lower()) if w not in _STOPWORDS}
