"""The follow-up benchmark's conversations (``evals/datasets/followups.yaml``, issue 17 item
3): two- and three-turn threads over the sample documentation and the local world, each
follow-up with its hand-written standalone form and what it must find (documentation
sections, live-data tool calls). Read and checked here; run by ``bench.followups``.

A documentation label is checked against the pages as ``evals.retrieval_labels`` checks the
retrieval benchmark's (the page exists, the heading names one section, the caller may read
it), so a renamed heading fails loudly instead of scoring zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, StringConstraints, ValidationError

from agent.turns import PriorTurn
from evals.dataset import ROW_ID_PATTERN, DatasetError, NonEmpty, StrictModel, read_yaml
from evals.retrieval_labels import (
    ANSWERS,
    RELATED,
    SEPARATOR,
    Caller,
    CallerModel,
    DocCorpus,
    Label,
    SectionKey,
    sample_doc_roots,
)
from foundation.acl import AclError, is_visible

DEFAULT_FOLLOWUPS_DATASET = Path("evals/datasets/followups.yaml")


class _TurnModel(StrictModel):
    q: NonEmpty
    a: str = ""
    # kind (as the tools' schemas name it: building, room) -> the ids of that kind
    ids: dict[NonEmpty, list[NonEmpty]] = Field(default_factory=dict)
    standalone: NonEmpty | None = None
    answers: list[NonEmpty] = Field(default_factory=list)
    related: list[NonEmpty] = Field(default_factory=list)
    tools: dict[NonEmpty, dict[str, Any]] = Field(default_factory=dict)


class _ConversationModel(StrictModel):
    id: Annotated[str, StringConstraints(pattern=ROW_ID_PATTERN)]
    as_: NonEmpty = Field(alias="as")
    turns: Annotated[list[_TurnModel], Field(min_length=2, max_length=3)]


class _FileModel(StrictModel):
    version: int
    docs: NonEmpty
    # The ``DOC_ROOTS`` the conversations are served with (``DIR=ACL`` entries relative to the
    # repository), when not the default: the folders a label's page must be under, and the
    # default ACL of its pages (e.g. the second corpus's guides/ and reference/).
    doc_roots: Annotated[list[NonEmpty], Field(min_length=1)] | None = None
    callers: Annotated[dict[NonEmpty, CallerModel], Field(min_length=1)]
    conversations: Annotated[list[_ConversationModel], Field(min_length=1)]


@dataclass(frozen=True)
class Turn:
    """One turn. A follow-up (every turn after the first) has ``standalone`` and what it must
    find: documentation ``labels`` and/or live-data ``tools`` (name -> argument subset)."""

    question: str
    answer: str  # the stored answer the retrieval part's rewriter reads (earlier turns)
    ids: tuple[tuple[str, str], ...]  # (kind, id) of what its tools used (earlier turns)
    standalone: str | None
    labels: tuple[Label, ...]
    tools: Mapping[str, Mapping[str, Any]]

    @property
    def prior(self) -> PriorTurn:
        return PriorTurn(self.question, self.answer, self.ids)

    @cached_property
    def answer_keys(self) -> frozenset[SectionKey]:
        return frozenset(label.key for label in self.labels if label.grade == ANSWERS)

    @property
    def documentation(self) -> bool:
        return bool(self.answer_keys)


@dataclass(frozen=True)
class Conversation:
    id: str
    caller: Caller
    turns: tuple[Turn, ...]

    @property
    def kind(self) -> str:
        follow_ups = self.turns[1:]
        docs = any(t.documentation for t in follow_ups)
        live = any(t.tools for t in follow_ups)
        return "mixed" if docs and live else "documentation" if docs else "live data"


@dataclass(frozen=True)
class FollowupDataset:
    path: Path
    corpus: DocCorpus
    conversations: tuple[Conversation, ...]

    def follow_ups(self) -> list[tuple[Conversation, int]]:
        """Every follow-up as (conversation, index of the turn)."""
        return [(c, i) for c in self.conversations for i in range(1, len(c.turns))]


def load_followups(path: Path | str, *, repo_root: Path | None = None) -> FollowupDataset:
    """Read and check the file; raises ``DatasetError`` with one line per problem."""
    path = Path(path)
    raw = read_yaml(path)
    try:
        model = _FileModel.model_validate(raw)
    except ValidationError as exc:
        raise DatasetError(
            [f"{path}: {'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
        ) from None
    root = repo_root or path.resolve().parent.parent.parent
    try:
        roots = (
            sample_doc_roots(root)
            if model.doc_roots is None
            else sample_doc_roots(root, model.doc_roots)
        )
    except AclError as exc:
        raise DatasetError([f"{path}: doc_roots: {exc}"]) from None
    corpus = DocCorpus(root / model.docs, roots)
    callers = {
        name: Caller(name, tuple(c.roles), tuple(c.domains)) for name, c in model.callers.items()
    }
    problems: list[str] = []
    conversations: list[Conversation] = []
    seen: set[str] = set()
    for conversation in model.conversations:
        where = f"{path}: conversation {conversation.id!r}"
        if conversation.id in seen:
            problems.append(f"{where}: duplicate id")
        seen.add(conversation.id)
        caller = callers.get(conversation.as_)
        if caller is None:
            problems.append(f"{where}: as: unknown caller {conversation.as_!r}")
            continue
        turns = [
            _turn(t, index, caller, corpus, f"{where}: turn {index + 1}", problems)
            for index, t in enumerate(conversation.turns)
        ]
        conversations.append(Conversation(conversation.id, caller, tuple(turns)))
    if problems:
        raise DatasetError(problems)
    return FollowupDataset(path, corpus, tuple(conversations))


def _turn(
    turn: _TurnModel,
    index: int,
    caller: Caller,
    corpus: DocCorpus,
    where: str,
    problems: list[str],
) -> Turn:
    if index == 0 and (turn.standalone or turn.answers or turn.related or turn.tools):
        problems.append(f"{where}: the first turn is no follow-up (no standalone, no checks)")
    if index > 0 and turn.standalone is None:
        problems.append(f"{where}: a follow-up needs its standalone form")
    if index > 0 and not (turn.answers or turn.tools):
        problems.append(f"{where}: a follow-up needs answers (sections) or tools")
    labels: list[Label] = []
    for texts, grade in ((turn.answers, ANSWERS), (turn.related, RELATED)):
        for text in texts:
            label = _label(text, grade, corpus)
            if isinstance(label, str):
                problems.append(f"{where}: {text!r}: {label}")
                continue
            page = corpus.page(label.page)
            if page is None or not is_visible(page.acl, caller.acl):
                problems.append(f"{where}: {text!r} is not visible to {caller.name}")
            labels.append(label)
    return Turn(
        question=turn.q,
        answer=turn.a,
        ids=tuple((kind, i) for kind, ids in turn.ids.items() for i in ids),
        standalone=turn.standalone,
        labels=tuple(labels),
        tools={name: dict(args) for name, args in turn.tools.items()},
    )


def _label(text: str, grade: int, corpus: DocCorpus) -> Label | str:
    page_key, sep, heading = text.partition(SEPARATOR)
    if not sep or not heading.strip():
        return f"expected '<page>{SEPARATOR}<section>'"
    page = corpus.page(page_key.strip())
    if page is None:
        return f"no such page under {corpus.docs}"
    found = page.resolve(heading.strip())
    if len(found) != 1:
        return f"names {len(found)} sections of {page.key}"
    return Label(page.key, found[0], grade)


def arguments_match(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> bool:
    """``expected`` is a subset of ``actual`` (nested mappings too; lists item by item)."""
    for key, value in expected.items():
        if key not in actual:
            return False
        got = actual[key]
        if isinstance(value, Mapping):
            if not isinstance(got, Mapping) or not arguments_match(value, got):
                return False
        elif value != got:
            return False
    return True


def tools_match(expected: Mapping[str, Mapping[str, Any]], calls: Sequence[Any]) -> bool:
    """Every expected tool was called (ok) with arguments matching its subset."""
    return all(
        any(c.name == name and c.ok and arguments_match(args, c.arguments) for c in calls)
        for name, args in expected.items()
    )
