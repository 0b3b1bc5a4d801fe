"""The golden dataset: YAML rows of questions, each paired with the behaviour we expect.

``load_dataset`` validates a file against a strict schema (pydantic, unknown keys refused)
and turns every problem into one line naming the file, the row and the field, e.g.
``evals/datasets/golden.yaml: row 7 (id 'x'): xfail: a reason is required``. Rows are
numbered from 1, as a person reading the file counts them.

Every row is on one side of the dev/test split (issue 42; evals/README.md, "dev and test"):
its own ``split:`` key, else its file's, else ``test`` (a row nobody put on dev is frozen).
Its world is its ``world:<name>`` tag, else ``sample`` (the estate and documentation this
repository serves by default). ``Dataset.select`` picks rows by split and world as well as by
id and tag.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

T = TypeVar("T")

DEFAULT_DATASET = Path("evals/datasets/golden.yaml")
TEST_DATASET = Path("evals/datasets/test.yaml")
# What `agent-service eval` loads when no file is named: the golden set and the frozen rows.
DEFAULT_DATASETS: tuple[Path, ...] = (DEFAULT_DATASET, TEST_DATASET)
ROW_ID_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"

Split = Literal["dev", "test"]
SplitChoice = Literal["dev", "test", "all"]
SPLITS: tuple[Split, ...] = ("dev", "test")
SPLIT_CHOICES: tuple[SplitChoice, ...] = ("dev", "test", "all")
# `agent-service eval` runs dev unless told otherwise: a run of the frozen side is asked for
# by name (--split test), never had by default while someone is changing the agent.
DEFAULT_SPLIT: SplitChoice = "dev"
# The side of a row whose row and file say nothing: frozen until someone puts it on dev.
UNASSIGNED_SPLIT: Split = "test"
WORLD_TAG = "world:"
DEFAULT_WORLD = "sample"
WORLD_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]*$")

Decision = Literal[
    "answered", "idk", "declined_out_of_scope", "tool_loop_exhausted", "provider_error"
]
NonEmpty = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
NonEmptyList = Annotated[list[NonEmpty], Field(min_length=1)]

# The fields that are expectations (a row needs at least one), in report order.
EXPECTATIONS = (
    "tools_called",
    "tool_args",
    "cited_sources",
    "keywords",
    "forbidden",
    "idk",
    "decision",
    "declined",
    "rubric",
)
JUDGED = ("declined", "rubric")


class DatasetError(ValueError):
    """The dataset cannot be used; ``str()`` holds one line per problem."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)


class Identity(StrictModel):
    """Who asks: the claims of the eval token minted for the row."""

    sub: NonEmpty = "eval"
    roles: list[NonEmpty] = Field(default_factory=list)
    domains: list[NonEmpty] = Field(default_factory=list)


FALLBACK_IDENTITY = Identity(sub="eval", roles=[], domains=[])


class ToolsCalled(StrictModel):
    all: NonEmptyList | None = None
    any: NonEmptyList | None = None
    none: bool | NonEmptyList | None = None

    @field_validator("none")
    @classmethod
    def _none_flag(cls, value: bool | list[str] | None) -> bool | list[str] | None:
        if value is False:
            raise ValueError("use true (no tool call at all) or a list of tool names")
        return value

    @model_validator(mode="after")
    def _something(self) -> ToolsCalled:
        if self.all is None and self.any is None and self.none is None:
            raise ValueError("give at least one of all, any, none")
        return self


class Keywords(StrictModel):
    all: NonEmptyList | None = None
    any: NonEmptyList | None = None

    @model_validator(mode="after")
    def _something(self) -> Keywords:
        if self.all is None and self.any is None:
            raise ValueError("give at least one of all, any")
        return self


class XFail(StrictModel):
    """A known gap of some models: the row is expected to fail only when the model under
    eval matches one of ``models`` (an exact id or an ``fnmatch`` glob, case-insensitive).
    Scoped so that a gap of a small local model never hides the same row for another."""

    models: NonEmptyList
    reason: NonEmpty

    def applies_to(self, model: str | None) -> bool:
        if not model:
            return False
        name = model.strip().casefold()
        return any(fnmatchcase(name, pattern.casefold()) for pattern in self.models)


XFAIL_FORM = 'xfail: {models: [MODEL_ID_OR_GLOB], reason: "why it fails for them"}'


class Row(StrictModel):
    """One golden row (see evals/README.md for what each expectation checks)."""

    id: Annotated[str, StringConstraints(pattern=ROW_ID_PATTERN)]
    question: NonEmpty
    as_: Identity | None = Field(default=None, alias="as")
    tools_called: ToolsCalled | None = None
    tool_args: Annotated[dict[NonEmpty, dict[str, JsonValue]], Field(min_length=1)] | None = None
    cited_sources: NonEmptyList | None = None
    keywords: Keywords | None = None
    forbidden: NonEmptyList | None = None
    idk: bool | None = None
    decision: Decision | None = None
    declined: bool | None = None
    rubric: NonEmpty | None = None
    xfail: XFail | None = None
    tags: list[NonEmpty] = Field(default_factory=list)
    split: Split | None = None  # else the file's `split`, else test

    @field_validator("tags")
    @classmethod
    def _one_world(cls, tags: list[str]) -> list[str]:
        worlds = [t.removeprefix(WORLD_TAG) for t in tags if t.startswith(WORLD_TAG)]
        if len(worlds) > 1:
            raise ValueError(f"a row is in one world, not {len(worlds)} ({', '.join(worlds)})")
        if worlds and not WORLD_PATTERN.match(worlds[0]):
            raise ValueError(f"world:{worlds[0]}: a world name is like {WORLD_PATTERN.pattern}")
        return tags

    @property
    def world(self) -> str:
        """The world the row is asked in: its ``world:<name>`` tag, else the sample world."""
        for tag in self.tags:
            if tag.startswith(WORLD_TAG):
                return tag.removeprefix(WORLD_TAG)
        return DEFAULT_WORLD

    @field_validator("xfail", mode="before")
    @classmethod
    def _scoped(cls, value: object) -> object:
        # The old bare-string form hid the row for every model: refuse it, saying the form.
        if not isinstance(value, Mapping):
            raise ValueError(f"give the models it is about and a reason ({XFAIL_FORM})")
        return value

    def xfail_for(self, model: str | None) -> XFail | None:
        """The row's xfail marker when it applies to ``model``, else None."""
        return self.xfail if self.xfail is not None and self.xfail.applies_to(model) else None

    @model_validator(mode="after")
    def _has_expectation(self) -> Row:
        if all(getattr(self, name) is None for name in EXPECTATIONS):
            raise ValueError(f"a row needs at least one expectation ({', '.join(EXPECTATIONS)})")
        return self

    @property
    def judged(self) -> list[str]:
        """The expectations a judge grades when one is configured (``declined`` is also
        checked without one, from the decision and the tool calls)."""
        return [name for name in JUDGED if getattr(self, name) is not None]


class Defaults(StrictModel):
    as_: Identity | None = Field(default=None, alias="as")


class DatasetFile(StrictModel):
    version: Literal[1]
    description: str | None = None
    split: Split | None = None  # the side of the rows that name none
    defaults: Defaults | None = None
    rows: Annotated[list[Row], Field(min_length=1)]


@dataclass(frozen=True)
class Case:
    """A row ready to run: its asking identity resolved, and where it came from."""

    row: Row
    user: Identity
    file: Path
    index: int  # 1-based position in its file
    split: Split = UNASSIGNED_SPLIT  # the row's, else its file's, else test

    @property
    def id(self) -> str:
        return self.row.id

    @property
    def world(self) -> str:
        return self.row.world


@dataclass(frozen=True)
class Dataset:
    files: tuple[Path, ...]
    description: str | None
    cases: tuple[Case, ...]
    split: SplitChoice = "all"  # the side selected (all: no selection by side)
    worlds: tuple[str, ...] = ()  # the worlds selected (none: every world)
    loaded: int | None = None  # rows in the files before any selection

    @property
    def name(self) -> str:
        return "+".join(path.stem for path in self.files)

    @property
    def rows_in_files(self) -> int:
        return len(self.cases) if self.loaded is None else self.loaded

    def select(
        self,
        only: Iterable[str] = (),
        tags: Iterable[str] = (),
        split: SplitChoice = "all",
        worlds: Iterable[str] = (),
    ) -> Dataset:
        """Rows on ``split``'s side (all: both), in any of ``worlds`` (when given), whose id is
        in ``only`` (when given) and that carry any of ``tags`` (when given). An unknown id or
        world is an error, and so is an id the split or world leaves out: a typo must not
        silently run nothing, and a test row is never run by a dev run."""
        wanted, tagged, places = list(only), set(tags), tuple(dict.fromkeys(worlds))
        problems: list[str] = []
        known_worlds = sorted({case.world for case in self.cases})
        for world in places:
            if world not in known_worlds:
                problems.append(
                    f"{self.name}: --world: no row in world {world!r} "
                    f"(worlds in the files: {', '.join(known_worlds)})"
                )
        by_id = {case.id: case for case in self.cases}
        for item in wanted:
            case = by_id.get(item)
            if case is None:
                problems.append(f"{self.name}: --only: no row with id {item!r}")
            elif split != "all" and case.split != split:
                problems.append(
                    f"{self.name}: --only: row {item!r} is on the {case.split} split, not "
                    f"{split} (pass --split {case.split} or --split all)"
                )
            elif places and case.world not in places:
                problems.append(f"{self.name}: --only: row {item!r} is in world {case.world!r}")
        if problems:
            raise DatasetError(problems)
        cases = tuple(
            case
            for case in self.cases
            if (split == "all" or case.split == split)
            and (not places or case.world in places)
            and (not wanted or case.id in wanted)
            and (not tagged or tagged & set(case.row.tags))
        )
        if not cases:
            sides = Counter(case.split for case in self.cases)
            held = ", ".join(f"{side} {sides[side]}" for side in SPLITS)
            raise DatasetError(
                [f"{self.name}: no row matches the selection (--split {split}; sides: {held})"]
            )
        # a selection of a selection keeps the narrower split and worlds in its record
        recorded = split if split != "all" else self.split
        return Dataset(
            self.files, self.description, cases, recorded, places or self.worlds, self.rows_in_files
        )

    def counts_by_file(self) -> dict[Path, int]:
        """Rows per file, in the files' order (files with no row selected included)."""
        counts = Counter(case.file for case in self.cases)
        return {path: counts[path] for path in self.files}

    def counts_by_split_and_world(self) -> dict[tuple[Split, str], int]:
        """Rows per (split, world), dev before test, worlds by name."""
        counts = Counter((case.split, case.world) for case in self.cases)
        order = sorted(counts, key=lambda key: (SPLITS.index(key[0]), key[1]))
        return {key: counts[key] for key in order}


# --- loading ------------------------------------------------------------------------------


class _UniqueKeyLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses a key repeated in one mapping (YAML keeps the last)."""


def _mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[object] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            line = key_node.start_mark.line + 1
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (line {line})", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def _row_label(raw_rows: object, index: int) -> str:
    label = f"row {index + 1}"
    if isinstance(raw_rows, list) and index < len(raw_rows):
        item = raw_rows[index]
        if isinstance(item, Mapping) and isinstance(item.get("id"), str):
            label += f" (id {item['id']!r})"
    return label


def _message(error: Mapping[str, Any]) -> str:
    kind = str(error.get("type", ""))
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required"
    message = str(error.get("msg", "invalid value"))
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    return message


def _field_path(raw: object, loc: Sequence[int | str], kind: str) -> str:
    """The dotted field a pydantic location points at, walking the raw data so that
    pydantic's own markers (union members such as ``bool``) are left out."""
    parts: list[str] = []
    node = raw
    for position, part in enumerate(loc):
        in_mapping = isinstance(node, Mapping) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if in_mapping or in_list:
            node = node[part]  # type: ignore[index]
        else:
            if kind == "missing" and position == len(loc) - 1:
                parts.append(str(part))
            break
        parts.append(str(part))
    return ".".join(parts)


def _format_errors(path: Path, raw: Mapping[str, Any], exc: ValidationError) -> list[str]:
    grouped: dict[str, list[str]] = {}
    raw_rows = raw.get("rows")
    for error in exc.errors():
        loc = list(error.get("loc", ()))
        kind = str(error.get("type", ""))
        where = [str(path)]
        node: object = raw
        if len(loc) >= 2 and loc[0] == "rows" and isinstance(loc[1], int):
            where.append(_row_label(raw_rows, loc[1]))
            node = raw_rows[loc[1]] if isinstance(raw_rows, list) else None
            loc = loc[2:]
        field = _field_path(node, loc, kind)
        if field:
            where.append(field)
        messages = grouped.setdefault(": ".join(where), [])
        message = _message(error)
        if message not in messages:
            messages.append(message)
    return [f"{where}: {' or '.join(messages)}" for where, messages in grouped.items()]


def _duplicate_ids(path: Path, raw_rows: object) -> list[str]:
    problems: list[str] = []
    first_seen: dict[str, int] = {}
    for index, item in enumerate(raw_rows if isinstance(raw_rows, list) else [], start=1):
        row_id = item.get("id") if isinstance(item, Mapping) else None
        if not isinstance(row_id, str):
            continue
        if row_id in first_seen:
            problems.append(
                f"{path}: row {index} (id {row_id!r}): id: duplicate of row {first_seen[row_id]}"
            )
        first_seen.setdefault(row_id, index)
    return problems


def parse_dataset(path: Path, raw: object) -> Dataset:
    """Validate already-parsed YAML (``raw``) as a dataset file called ``path``."""
    if not isinstance(raw, Mapping):
        raise DatasetError([f"{path}: expected a mapping with 'version' and 'rows'"])
    duplicates = _duplicate_ids(path, raw.get("rows"))
    try:
        parsed = DatasetFile.model_validate(raw)
    except ValidationError as exc:
        raise DatasetError(_format_errors(path, raw, exc) + duplicates) from None
    if duplicates:
        raise DatasetError(duplicates)
    default = parsed.defaults.as_ if parsed.defaults and parsed.defaults.as_ else None
    cases = tuple(
        Case(
            row=row,
            user=row.as_ or default or FALLBACK_IDENTITY,
            file=path,
            index=index,
            split=row.split or parsed.split or UNASSIGNED_SPLIT,
        )
        for index, row in enumerate(parsed.rows, start=1)
    )
    return Dataset(files=(path,), description=parsed.description, cases=cases, loaded=len(cases))


def read_yaml(path: Path) -> object:
    """A YAML file's data (safe loading; a key repeated in one mapping is an error);
    ``DatasetError`` naming the file when it is missing, unreadable or not YAML."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DatasetError([f"{path}: no such file"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError([f"{path}: cannot read ({exc})"]) from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).replace(' in "<unicode string>"', "").split())
        raise DatasetError([f"{path}: not valid YAML: {detail}"]) from None


def load_dataset(path: Path | str) -> Dataset:
    """Read and validate one dataset file; raises ``DatasetError``."""
    path = Path(path)
    return parse_dataset(path, read_yaml(path))


def load_each(paths: Sequence[Path | str], load: Callable[[Path | str], T], what: str) -> list[T]:
    """``load`` of every path, or one ``DatasetError`` with all their problems (or none
    given: "no ``what`` given")."""
    problems: list[str] = []
    loaded: list[T] = []
    for path in paths:
        try:
            loaded.append(load(path))
        except DatasetError as exc:
            problems.extend(exc.problems)
    if problems:
        raise DatasetError(problems)
    if not loaded:
        raise DatasetError([f"no {what} given"])
    return loaded


def load_datasets(paths: Sequence[Path | str]) -> Dataset:
    """Several files as one run; a row id must be unique across all of them."""
    loaded = load_each(paths, load_dataset, "dataset")
    problems: list[str] = []
    owner: dict[str, Case] = {}
    for dataset in loaded:
        for case in dataset.cases:
            first = owner.setdefault(case.id, case)
            if first is not case:
                problems.append(
                    f"{case.file}: row {case.index} (id {case.id!r}): id: already used by "
                    f"{first.file} row {first.index}"
                )
    if problems:
        raise DatasetError(problems)
    descriptions = [d.description for d in loaded if d.description]
    cases = tuple(c for d in loaded for c in d.cases)
    return Dataset(
        files=tuple(f for d in loaded for f in d.files),
        description=" / ".join(descriptions) or None,
        cases=cases,
        loaded=len(cases),
    )
