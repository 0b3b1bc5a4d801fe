"""Stored turns re-checked against the reader's permissions now (issue 17, item 4).

A turn keeps the citations its answer was given, by chunk id. Between that turn and a later
read, the cited page's ACL may have been narrowed, or the document deleted or re-ingested
with other text (its chunks then have other ids). History must not become a side door to
such a page, so whenever a thread is read (``GET /conversations/{id}``) or continued (its
turns become the model's history), the turns' chunk ids are checked again, with the
knowledge base's own ACL rule (``DocumentStore.visible_chunk_ids``, the search's predicate),
and ``recheck`` applies one rule:

* a citation whose chunk the reader cannot see now (hidden, or gone) is dropped, with its
  snippet;
* the answer of a turn that cited such a chunk is withheld: replaced by ``WITHHELD_ANSWER``
  (written by the service: ``answered_by`` says so) and marked ``answer_withheld``, since the
  answer itself may quote the page. What the reader wrote (the question) and the tool trace
  stay.

A hidden chunk and a deleted one are treated alike: telling them apart would say which pages
exist that the reader may not see. Nothing is changed in the store: a reader whose access
comes back sees the turn whole again.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import replace

from conversations.store import Turn

WITHHELD_ANSWER = (
    "(This answer is withheld: it cited documentation you can no longer see, or that no "
    "longer exists. Ask again to get an answer from what you can see now.)"
)


def cited_chunk_ids(turns: Iterable[Turn]) -> set[str]:
    """Every chunk id the turns' answers cited."""
    return {c.chunk_id for turn in turns for c in turn.record.citations}


def recheck(turns: Iterable[Turn], visible: Collection[str]) -> list[Turn]:
    """``turns`` as a reader who may see exactly the chunks ``visible`` (of those the turns
    cite) is shown them: see the module docstring."""
    out: list[Turn] = []
    for turn in turns:
        record = turn.record
        kept = tuple(c for c in record.citations if c.chunk_id in visible)
        if len(kept) == len(record.citations):
            out.append(turn)
            continue
        out.append(
            replace(
                turn,
                record=replace(
                    record, answer=WITHHELD_ANSWER, citations=kept, answered_by="service"
                ),
                answer_withheld=True,
            )
        )
    return out
