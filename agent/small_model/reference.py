"""Answers quoted from a reference entry: a question about one documented key or code.

"What is the default of READING_TIMEOUT_SECONDS?", "How do I fix AB-E2030?": the
configuration reference and the error-code list give each key and code an entry of its own,
headed by its name, and that entry is the whole answer. The local 1.5B model spent ~10 s on
2 cores paraphrasing it (~340 prompt tokens of results, ~60 generated), and sometimes cut it
mid-sentence ("... which is ") or dropped the fix. Where the caller's own search put such an
entry first, the service quotes it, cited, in milliseconds.

Only when nothing in the question goes beyond the entry: every word besides the name and
the ways of asking about it ("what", "default", "fix", "mean"...) must appear in the entry or
its headings, so "Which cvctl command locks out ...?" or "... on the MQTT error topic" still
go to the model. The hits are the caller's (permission-filtered) search, so a caller who may
not see the entry never gets it here either.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from agent.citations import snippet
from agent.words import content_words, doc_tokens
from retrieval.search import SearchHit

__all__ = ["ENTRY_CHARS", "compose_reference"]

ENTRY_CHARS = 700  # the quoted entry, at most (the reference's entries are 100-400)

# Ways of asking about a key or code itself: the entry answers all of them.
_ABOUT_ITSELF = content_words(
    "what which whats does do mean means meaning stand control controls controlled default "
    "defaults value values set setting settings get gets got fix fixes fixed solve resolve "
    "when why happen happens exceed exceeds exceeded error errors code codes variable key "
    "config configuration option parameter return returns returned cause causes explain "
    "tell describe documentation docs reference"
)
_SECTION_SEPARATOR = " > "


def _names_entry(heading: str, token: str) -> bool:
    """Whether ``heading`` names ``token`` as a whole word ("AB-E2012 – No data yet")."""
    return re.search(rf"(?<![\w-]){re.escape(token)}(?![\w-])", heading) is not None


def compose_reference(question: str, hits: Sequence[SearchHit]) -> str | None:
    """The first hit quoted with its citation marker, when the question names exactly one
    documented token, that hit is the token's own entry (its last heading names it) and the
    entry covers every other content word of the question; else None (the model answers)."""
    tokens = doc_tokens(question)
    if len(tokens) != 1 or not hits:
        return None
    token, entry = tokens[0], hits[0]
    *path, heading = entry.section.split(_SECTION_SEPARATOR)
    if not _names_entry(heading, token):
        return None
    asked = content_words(question.replace(token, " ")) - _ABOUT_ITSELF
    if asked - content_words(f"{entry.section} {entry.title or ''} {entry.text}"):
        return None
    page = f" ({path[0]})" if path else ""  # the page's title, not every heading on the way
    return f"{heading}{page}: {snippet(entry.text, ENTRY_CHARS)} [^{entry.chunk_id}]"
