"""The follow-up benchmark's conversations (``evals/datasets/followups.yaml``, issue 17 item
3): two- and three-turn threads over the sample documentation and the local world, each
follow-up with its hand-written standalone form and what it must find (documentation
sections, live-data tool calls). Read and checked here; run by ``bench.followups``.

A documentation label is checked against the pages as ``evals.retrieval_labels`` checks the
retrieval benchmark's (the page exists, the heading names one section, the caller may read
it), so a renamed heading fails loudly instead of scoring zero.

Split and world (issue 42; evals/README.md, "dev and test"): a file's ``split:`` key puts its
conversations on dev or test (no key: test, as for golden rows): ``followups.yaml`` is dev,
``test-followups.yaml`` test. Its ``world:`` key names the world they are asked in (default
``sample``). ``load_followup_sets`` loads several files as one run and selects by both.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, StringConstraints, ValidationError

from agent.turns import PriorTurn
from evals.dataset import (
    DEFAULT_WORLD,
    ROW_ID_PATTERN,
    SPLITS,
    UNASSIGNED_SPLIT,
    WORLD_PATTERN,
    DatasetError,
    NonEmpty,
    Split,
    SplitChoice,
    StrictModel,
    load_each,
    read_yaml,
)
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
TEST_FOLLOWUPS_DATASET = Path("evals/datasets/test-followups.yaml")
DEFAULT_FOLLOWUPS_DATASETS: tuple[Path, ...] = (DEFAULT_FOLLOWUPS_DATASET, TEST_FOLLOWUPS_DATASET)


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
    split: Split | None = None  # the side of every conversation of the file (none: test)
    world: Annotated[str, StringConstraints(pattern=WORLD_PATTERN.pattern)] = DEFAULT_WORLD
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
    split: Split = UNASSIGNED_SPLIT
    world: str = DEFAULT_WORLD
    file: Path | None = None

    @property
    def kind(self) -> str:
        follow_ups = self.turns[1:]
        docs = any(t.documentation for t in follow_ups)
        live = any(t.tools for t in follow_ups)
        return "mixed" if docs and live else "documentation" if docs else "live data"


@dataclass(frozen=True)
class FollowupDataset:
    path: Path  # the first file
    corpus: DocCorpus
    conversations: tuple[Conversation, ...]
    paths: tuple[Path, ...] = ()  # every file of the run (empty: ``path`` alone)
    split: SplitChoice = "all"  # the side selected
    worlds: tuple[str, ...] = ()  # the worlds selected (none: every world)
    loaded: int | None = None  # conversations in the files before any selection

    @property
    def files(self) -> tuple[Path, ...]:
        return self.paths or (self.path,)

    def follow_ups(self) -> list[tuple[Conversation, int]]:
        """Every follow-up as (conversation, index of the turn)."""
        return [(c, i) for c in self.conversations for i in range(1, len(c.turns))]

    def select(self, split: SplitChoice = "all", worlds: Iterable[str] = ()) -> FollowupDataset:
        """The conversations on ``split``'s side (all: both) in any of ``worlds`` (when
        given); an unknown world, or nothing left, is an error."""
        places = tuple(dict.fromkeys(worlds))
        known = sorted({c.world for c in self.conversations})
        unknown = [w for w in places if w not in known]
        if unknown:
            raise DatasetError(
                [
                    f"--world: no conversation in world {w!r} (worlds: {', '.join(known)})"
                    for w in unknown
                ]
            )
        chosen = tuple(
            c
            for c in self.conversations
            if (split == "all" or c.split == split) and (not places or c.world in places)
        )
        if not chosen:
            sides = Counter(c.split for c in self.conversations)
            held = ", ".join(f"{side} {sides[side]}" for side in SPLITS)
            names = ", ".join(str(p) for p in self.files)
            raise DatasetError([f"{names}: no conversation on --split {split} ({held})"])
        loaded = self.loaded if self.loaded is not None else len(self.conversations)
        return FollowupDataset(
            self.path,
            self.corpus,
            chosen,
            self.files,
            split if split != "all" else self.split,
            places or self.worlds,
            loaded,
        )

    def split_line(self) -> str:
        """``split dev: 41 conversations, 46 follow-ups (followups.yaml 41, ...) of 69``."""
        per_file = Counter(c.file.name for c in self.conversations if c.file is not None)
        files = ", ".join(f"{p.name} {per_file.get(p.name, 0)}" for p in self.files)
        loaded = self.loaded if self.loaded is not None else len(self.conversations)
        worlds = Counter(c.world for c in self.conversations)
        return (
            f"split {self.split}: {len(self.conversations)} conversations, "
            f"{len(self.follow_ups())} follow-ups ({files}) of {loaded} in the files; worlds "
            + ", ".join(f"{w} {n}" for w, n in sorted(worlds.items()))
        )


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
        conversations.append(
            Conversation(
                conversation.id,
                caller,
                tuple(turns),
                model.split or UNASSIGNED_SPLIT,
                model.world,
                path,
            )
        )
    if problems:
        raise DatasetError(problems)
    return FollowupDataset(path, corpus, tuple(conversations), loaded=len(conversations))


def load_followup_sets(
    paths: Sequence[Path | str],
    *,
    split: SplitChoice = "all",
    worlds: Iterable[str] = (),
    repo_root: Path | None = None,
) -> FollowupDataset:
    """Several files as one run (the same ``docs`` folder; conversation ids unique across
    them), then the conversations of ``split`` and ``worlds``; raises ``DatasetError``."""
    loaded = load_each(
        paths, lambda path: load_followups(path, repo_root=repo_root), "follow-up dataset"
    )
    problems: list[str] = []
    first = loaded[0]
    owner: dict[str, Path] = {}
    for dataset in loaded:
        if dataset.corpus.docs.resolve() != first.corpus.docs.resolve():
            problems.append(
                f"{dataset.path}: docs {dataset.corpus.docs} is not {first.path}'s "
                f"{first.corpus.docs}: run files over other documentation apart"
            )
        for conversation in dataset.conversations:
            seen = owner.setdefault(conversation.id, dataset.path)
            if seen != dataset.path:
                problems.append(
                    f"{dataset.path}: conversation {conversation.id!r}: id already used by {seen}"
                )
    if problems:
        raise DatasetError(problems)
    merged = FollowupDataset(
        first.path,
        first.corpus,
        tuple(c for d in loaded for c in d.conversations),
        tuple(d.path for d in loaded),
        loaded=sum(len(d.conversations) for d in loaded),
    )
    return merged.select(split, worlds)


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
