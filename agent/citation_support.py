"""Citations that support what they mark: each group of ``[^id]`` markers is checked against
the words of the claim it ends (the text since the previous group), and a marker whose chunk
holds few of them gives way to the retrieved chunk that holds the most.

``agent.citations`` proves a marker points at a chunk this run retrieved; this module checks
that the chunk is the one that says it. Small models cite by position ("the first result")
or cite every result shown; an error-code answer quoting the error-code page then cites the
API page listed before it. The measure is lexical and deliberately conservative:

* a claim's words are its content words the question does not already contain (what the
  answer adds: "AB-E2011 means ..." is judged on what follows "means", not on "AB-E2011");
* a chunk's support is the share of those words its heading and text contain;
* a marker stays when its chunk's support is at least ``KEEP_RATIO`` of the best chunk's;
* the best chunk is cited first when it holds at least ``MARGIN`` more of the words than
  every marker that stays (a group none of whose markers stays becomes the best alone);
* when no retrieved chunk holds ``MIN_SUPPORT`` of the claim's words (a paraphrase, a
  summary), or the claim adds fewer than ``MIN_CLAIM_WORDS`` words to the question ("the
  default is 900 seconds": the settings table and an API page both hold "900"), the
  markers are left as the model wrote them: no evidence either way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.citations import MARKER, ChunkInfo
from agent.words import content_words

__all__ = [
    "KEEP_RATIO",
    "MARGIN",
    "MIN_CLAIM_WORDS",
    "MIN_SUPPORT",
    "SupportCheck",
    "check_support",
    "support",
]

KEEP_RATIO = 0.6
MARGIN = 0.15
MIN_SUPPORT = 0.4
MIN_CLAIM_WORDS = 4
_GROUP = re.compile(rf"(?:[ \t]*{MARKER.pattern})+")  # a run of markers, spaces between


@dataclass
class SupportCheck:
    answer: str  # with unsupported markers replaced
    dropped: list[str] = field(default_factory=list)  # chunk ids no longer cited there
    added: list[str] = field(default_factory=list)  # chunk ids cited instead

    @property
    def changed(self) -> bool:
        return bool(self.dropped or self.added)


def _claim_words(claim: str, question_words: set[str]) -> set[str]:
    words = content_words(claim)
    return (words - question_words) or words


def _chunk_words(chunk: ChunkInfo) -> set[str]:
    return content_words(f"{chunk.section or ''} {chunk.text}")


def support(words: set[str], chunk: ChunkInfo) -> float:
    """The share of ``words`` that ``chunk``'s heading and text contain (0 for no words)."""
    return _share(words, _chunk_words(chunk))


def _share(words: set[str], chunk_words: set[str]) -> float:
    return len(words & chunk_words) / len(words) if words else 0.0


def _regroup(
    words: set[str], group: str, chunk_words: Mapping[str, set[str]], check: SupportCheck
) -> str:
    """``group`` (the markers ending a claim of ``words``) as the check keeps it."""
    cited = [m.group(1) for m in MARKER.finditer(group)]
    if len(words) < MIN_CLAIM_WORDS:
        return group  # "is 900 seconds": too few words to tell one chunk from another
    scores = {chunk_id: _share(words, held) for chunk_id, held in chunk_words.items()}
    if not scores or not any(chunk_id in scores for chunk_id in cited):
        return group  # markers this check cannot judge (invented ones are stripped elsewhere)
    best = max(scores, key=lambda chunk_id: scores[chunk_id])
    if scores[best] < MIN_SUPPORT:
        return group
    kept = [c for c in cited if scores.get(c, 0.0) >= KEEP_RATIO * scores[best]]
    if best not in kept and scores[best] - max((scores[c] for c in kept), default=0.0) >= MARGIN:
        kept.insert(0, best)
    if kept == cited:
        return group
    check.dropped += [c for c in cited if c not in kept and c not in check.dropped]
    check.added += [c for c in kept if c not in cited and c not in check.added]
    lead = group[: len(group) - len(group.lstrip(" \t"))] or " "
    return lead + " ".join(f"[^{chunk_id}]" for chunk_id in dict.fromkeys(kept))


def check_support(answer: str, question: str, retrieved: Mapping[str, ChunkInfo]) -> SupportCheck:
    """``answer`` with every marker group checked against the claim it ends."""
    check = SupportCheck(answer)
    if not _GROUP.search(answer):
        return check
    question_words = content_words(question)
    chunk_words = {chunk_id: _chunk_words(chunk) for chunk_id, chunk in retrieved.items()}
    out: list[str] = []
    start = 0
    for match in _GROUP.finditer(answer):
        claim = answer[start : match.start()]
        words = _claim_words(claim, question_words)
        out += [claim, _regroup(words, match.group(0), chunk_words, check)]
        start = match.end()
    out.append(answer[start:])
    check.answer = "".join(out)
    return check
