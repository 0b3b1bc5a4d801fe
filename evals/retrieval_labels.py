"""The labelled retrieval benchmark: questions over the sample documentation, each labelled
with the sections that answer it, for ``bench.retrieval_quality``.

A label names a section as ``"<page> > <section>"``: the page's path under the documentation
folder (``user/occupancy-alerts.md``) and its heading path as the chunker writes it
(``Setting up occupancy alerts > Cooldown: how often you will be notified``), or any tail of
that path that names one section of the page (``Cooldown: how often you will be notified``).
Headings, not chunks, so the labels survive a change of chunk size.

The loader checks every label against the pages themselves, read and parsed the way
ingestion reads them (``retrieval.chunking``, the folder default ACLs of ``DOC_ROOTS``):
a page that does not exist, a heading the page does not have (or names twice), or a label
the row's caller could not read is an error naming the file, the row and the label, so a
renamed heading fails loudly instead of silently scoring zero.

Grades: ``answers`` (2) states what the question asks, or one part of it; ``related`` (1) is
on the topic without the answer, or with part of it. ``unanswerable`` rows have no label:
nothing in the documentation answers them. ``acl-hidden`` rows list under ``hidden`` the
sections that would answer them, all on pages the row's caller may not read: for that caller
the right result is nothing relevant, like an unanswerable row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, StringConstraints, ValidationError

from evals.dataset import ROW_ID_PATTERN, DatasetError, NonEmpty, StrictModel, read_yaml
from foundation.acl import DEFAULT_DOC_ROOTS, caller_entries, is_visible, parse_acl
from retrieval.chunking import (
    FrontMatterError,
    SourceDecodeError,
    chunk_markdown,
    decode_source,
    parse_source,
)

DEFAULT_QUALITY_DATASET = Path("evals/datasets/retrieval_sample.yaml")

Category = Literal[
    "exact-token", "lexical", "paraphrase", "multi-section", "unanswerable", "acl-hidden"
]
CATEGORIES: tuple[Category, ...] = get_args(Category)
ANSWERABLE: tuple[Category, ...] = ("exact-token", "lexical", "paraphrase", "multi-section")
NO_ANSWER: tuple[Category, ...] = ("unanswerable", "acl-hidden")
ANSWERS, RELATED = 2, 1  # the grades
SEPARATOR = " > "  # between the page and the section, and between headings


# --- the pages ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    """One documentation page as retrieval sees it."""

    key: str  # path under the documentation folder, e.g. "user/faq.md"
    acl: tuple[str, ...]  # front matter permissions, else its folder's default
    sections: tuple[str, ...]  # heading paths of the sections that hold text, in page order

    def resolve(self, heading: str) -> list[str]:
        """The sections ``heading`` names: the one whose whole path it is, else those whose
        path ends with it (on a heading boundary)."""
        if heading in self.sections:
            return [heading]
        return [s for s in self.sections if s.endswith(SEPARATOR + heading)]


def sample_doc_roots(
    repo_root: Path, entries: Sequence[str] = DEFAULT_DOC_ROOTS
) -> list[tuple[Path, list[str]]]:
    """``DOC_ROOTS`` entries (``DIR=ACL``, default: the default ``DOC_ROOTS``, the folders and
    default ACLs that ``agent-service ingest`` loads by default) under ``repo_root``."""
    roots: list[tuple[Path, list[str]]] = []
    for entry in entries:
        folder, _, acl = entry.partition("=")
        roots.append((repo_root / folder, parse_acl(acl.split())))
    return roots


def _sections(body: str) -> tuple[str, ...]:
    """Heading paths of the sections that yield chunks. Sections never depend on the chunk
    budget (a chunk never spans two), so any token count and budget give the same paths."""
    chunks = chunk_markdown(body, lambda text: len(text.split()), 1 << 20)
    return tuple(dict.fromkeys(chunk.section for chunk in chunks))


@dataclass
class DocCorpus:
    """The pages under ``docs`` (the folder label page keys are relative to), read on first
    use; ``roots`` are the ingested folders with their default ACLs."""

    docs: Path
    roots: Sequence[tuple[Path, Sequence[str]]]
    _pages: dict[str, Page | None] = field(default_factory=dict)

    def page(self, key: str) -> Page | None:
        """The page ``key`` names, or None when no ingested folder holds such a file."""
        if key not in self._pages:
            self._pages[key] = self._read(key)
        return self._pages[key]

    def _read(self, key: str) -> Page | None:
        path = (self.docs / key).resolve()
        root = next((r for r, _ in self.roots if path.is_relative_to(r.resolve())), None)
        if root is None or not path.is_file():
            return None
        default = next(acl for r, acl in self.roots if r == root)
        try:
            parsed = parse_source(decode_source(path.read_bytes(), key), key)
        except (SourceDecodeError, FrontMatterError):
            return None  # ingestion skips it too
        permissions = default if parsed.permissions is None else parse_acl(parsed.permissions)
        return Page(key, tuple(permissions), _sections(parsed.body))

    def key_of(self, source: str) -> str | None:
        """The page key of a stored chunk's ``source`` (the path as ingestion discovered it,
        absolute, or relative to the working directory): its path under ``docs``, or None."""
        try:
            return Path(source).resolve().relative_to(self.docs.resolve()).as_posix()
        except ValueError:
            return None


# --- the file -----------------------------------------------------------------------------------


class CallerModel(StrictModel):
    roles: list[NonEmpty] = Field(default_factory=list)
    domains: list[NonEmpty] = Field(default_factory=list)


class _RowModel(StrictModel):
    id: Annotated[str, StringConstraints(pattern=ROW_ID_PATTERN)]
    category: Category
    as_: NonEmpty = Field(alias="as")
    q: NonEmpty
    answers: list[NonEmpty] = Field(default_factory=list)
    related: list[NonEmpty] = Field(default_factory=list)
    hidden: list[NonEmpty] = Field(default_factory=list)


class _FileModel(StrictModel):
    version: Literal[1]
    docs: NonEmpty  # the documentation folder, relative to the file's repository
    callers: Annotated[dict[NonEmpty, CallerModel], Field(min_length=1)]
    rows: Annotated[list[_RowModel], Field(min_length=1)]


# --- what the loader returns --------------------------------------------------------------------


@dataclass(frozen=True)
class Caller:
    name: str
    roles: tuple[str, ...]
    domains: tuple[str, ...]

    @cached_property
    def acl(self) -> list[str]:
        """The ACL entries a search runs with for this caller (as ``search_docs`` does)."""
        return caller_entries(self.roles, self.domains)


SectionKey = tuple[str, str]  # (page key, section path)


@dataclass(frozen=True)
class Label:
    page: str
    section: str
    grade: int

    @property
    def key(self) -> SectionKey:
        return (self.page, self.section)


@dataclass(frozen=True)
class QualityRow:
    id: str
    category: Category
    caller: Caller
    question: str
    labels: tuple[Label, ...]  # answers (2) and related (1)
    hidden: tuple[Label, ...]  # acl-hidden rows: what would answer, out of the caller's reach

    @property
    def answerable(self) -> bool:
        return self.category in ANSWERABLE

    @cached_property
    def grades(self) -> dict[SectionKey, int]:
        return {label.key: label.grade for label in self.labels}

    @cached_property
    def answer_keys(self) -> frozenset[SectionKey]:
        return frozenset(label.key for label in self.labels if label.grade == ANSWERS)


@dataclass(frozen=True)
class QualityDataset:
    path: Path
    corpus: DocCorpus
    rows: tuple[QualityRow, ...]

    def categories(self) -> list[Category]:
        """The categories present, in the canonical order."""
        present = {row.category for row in self.rows}
        return [c for c in CATEGORIES if c in present]


# --- loading ------------------------------------------------------------------------------------


def load_quality_dataset(path: Path | str, *, repo_root: Path | None = None) -> QualityDataset:
    """Read, validate and resolve a labelled retrieval dataset; raises ``DatasetError`` with
    one line per problem. ``repo_root`` (default: the folder above ``evals/datasets``) is
    where the file's ``docs`` folder and the default ``DOC_ROOTS`` are."""
    path = Path(path)
    raw = read_yaml(path)
    try:
        model = _FileModel.model_validate(raw)
    except ValidationError as exc:
        raise DatasetError([_pydantic_problem(path, raw, e) for e in exc.errors()]) from None
    root = repo_root or path.resolve().parent.parent.parent
    corpus = DocCorpus(root / model.docs, sample_doc_roots(root))
    callers = {
        name: Caller(name, tuple(c.roles), tuple(c.domains)) for name, c in model.callers.items()
    }
    problems: list[str] = []
    rows: list[QualityRow] = []
    seen: dict[str, int] = {}
    for index, row in enumerate(model.rows, 1):
        where = f"{path}: row {index} (id {row.id!r})"
        if row.id in seen:
            problems.append(f"{where}: id: duplicate of row {seen[row.id]}")
        seen.setdefault(row.id, index)
        resolved = _resolve_row(row, callers, corpus, where, problems)
        if resolved is not None:
            rows.append(resolved)
    if problems:
        raise DatasetError(problems)
    return QualityDataset(path=path, corpus=corpus, rows=tuple(rows))


def _pydantic_problem(path: Path, raw: object, error: Mapping[str, Any]) -> str:
    loc = list(error["loc"])
    where = str(path)
    if len(loc) >= 2 and loc[0] == "rows" and isinstance(loc[1], int):
        index = loc[1]
        rows = raw.get("rows") if isinstance(raw, Mapping) else None
        item = rows[index] if isinstance(rows, list) and index < len(rows) else None
        ident = item.get("id") if isinstance(item, Mapping) else None
        where += f": row {index + 1}" + (f" (id {ident!r})" if isinstance(ident, str) else "")
        loc = loc[2:]
    field_name = ".".join(str(part) for part in loc) or "(file)"
    message = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
    return f"{where}: {field_name}: {message}"


def _resolve_row(
    row: _RowModel,
    callers: Mapping[str, Caller],
    corpus: DocCorpus,
    where: str,
    problems: list[str],
) -> QualityRow | None:
    caller = callers.get(row.as_)
    if caller is None:
        problems.append(f"{where}: as: unknown caller {row.as_!r} (callers: {sorted(callers)})")
        return None
    before = len(problems)
    _check_shape(row, where, problems)
    labels = [
        *_labels(row.answers, ANSWERS, "answers", corpus, where, problems),
        *_labels(row.related, RELATED, "related", corpus, where, problems),
    ]
    hidden = _labels(row.hidden, ANSWERS, "hidden", corpus, where, problems)
    _check_labels(labels, hidden, caller, corpus, where, problems)
    if len(problems) > before:
        return None
    return QualityRow(row.id, row.category, caller, row.q, tuple(labels), tuple(hidden))


def _check_shape(row: _RowModel, where: str, problems: list[str]) -> None:
    """Which labels each category needs and allows."""
    if row.category in ANSWERABLE and not row.answers:
        problems.append(f"{where}: answers: a {row.category} row needs at least one section")
    if row.category == "multi-section" and len(row.answers) < 2:
        problems.append(f"{where}: answers: a multi-section row needs at least two sections")
    if row.category in NO_ANSWER and (row.answers or row.related):
        problems.append(f"{where}: answers/related: a {row.category} row has none to label")
    if row.category == "acl-hidden" and not row.hidden:
        problems.append(f"{where}: hidden: an acl-hidden row names the sections it cannot see")
    if row.category != "acl-hidden" and row.hidden:
        problems.append(f"{where}: hidden: only acl-hidden rows have hidden sections")


def _labels(
    texts: Sequence[str],
    grade: int,
    field_name: str,
    corpus: DocCorpus,
    where: str,
    problems: list[str],
) -> list[Label]:
    labels: list[Label] = []
    for text in texts:
        label = _label(text, grade, corpus)
        if isinstance(label, str):
            problems.append(f"{where}: {field_name}: {text!r}: {label}")
        else:
            labels.append(label)
    return labels


def _label(text: str, grade: int, corpus: DocCorpus) -> Label | str:
    """The label ``text`` names, or why it names none."""
    page_key, sep, heading = text.partition(SEPARATOR)
    if not sep or not heading.strip():
        return f"expected '<page>{SEPARATOR}<section>'"
    page = corpus.page(page_key.strip())
    if page is None:
        return f"no such page under {corpus.docs} (an ingested .md/.markdown/.qd file)"
    found = page.resolve(heading.strip())
    if not found:
        return f"page {page.key} has no section {heading.strip()!r}"
    if len(found) > 1:
        return f"names {len(found)} sections of {page.key}, give more of the path: {found}"
    return Label(page.key, found[0], grade)


def _check_labels(
    labels: Sequence[Label],
    hidden: Sequence[Label],
    caller: Caller,
    corpus: DocCorpus,
    where: str,
    problems: list[str],
) -> None:
    """Each section once per row; answers and related readable by the caller, hidden not."""
    keys = [label.key for label in (*labels, *hidden)]
    for key in dict.fromkeys(k for k in keys if keys.count(k) > 1):
        problems.append(f"{where}: {SEPARATOR.join(key)!r} is labelled twice")
    for label in labels:
        if not _visible(label, caller, corpus):
            problems.append(
                f"{where}: {label.page!r} is not visible to {caller.name}: "
                "label with a caller who may read it, or make the row acl-hidden"
            )
    for label in hidden:
        if _visible(label, caller, corpus):
            problems.append(f"{where}: hidden: {label.page!r} is visible to {caller.name}")


def _visible(label: Label, caller: Caller, corpus: DocCorpus) -> bool:
    page = corpus.page(label.page)
    return page is not None and is_visible(page.acl, caller.acl)
