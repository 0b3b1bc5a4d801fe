"""The ``Tool`` port: one class per tool, its pydantic args model is the schema the model sees.

Modelled on pydantic-ai / the OpenAI Agents SDK function tools: a tool is a name, a
description, a typed argument model, a typed result model and an async ``run``. The registry
validates the model's arguments against ``args_model`` before ``run`` is called, so ``run``
receives a typed, validated instance; ``run`` returns a ``result_model`` instance, whose JSON
dump is what the model reads (``agent.tools.registry``). A tool signals a failure the model
can act on by raising ``ToolError``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar, Generic, Protocol, TypeVar, get_args, get_origin

from pydantic import BaseModel

from agent.access import DomainAuthorizer
from agent.llm.base import ToolExample, ToolSpec
from agent.tools.downstream import Downstream
from agent.tools.errors import ToolError
from foundation.identity import AuthUser
from retrieval.search import SearchHit

__all__ = [
    "ArgsT",
    "ChunkSink",
    "EntityRef",
    "ResultT",
    "Retriever",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolExample",
    "utc_now",
]

ArgsT = TypeVar("ArgsT", bound=BaseModel)
ResultT = TypeVar("ResultT", bound=BaseModel)


class Retriever(Protocol):
    """What ``search_docs`` needs from retrieval (``retrieval.search.HybridRetriever``)."""

    async def search(
        self, query: str, *, acl: Sequence[str], top_k: int | None = None
    ) -> list[SearchHit]: ...


class ChunkSink:
    """The chunks ``search_docs`` handed to the model in this request, by chunk id (first
    seen first). Citation markers are validated against exactly this set."""

    def __init__(self) -> None:
        self._chunks: dict[str, SearchHit] = {}

    def add(self, hits: Iterable[SearchHit]) -> None:
        for hit in hits:
            self._chunks.setdefault(hit.chunk_id, hit)

    def get(self, chunk_id: str) -> SearchHit | None:
        return self._chunks.get(chunk_id)

    def __contains__(self, chunk_id: object) -> bool:
        return chunk_id in self._chunks

    def __iter__(self) -> Iterator[SearchHit]:
        return iter(list(self._chunks.values()))

    def __len__(self) -> int:
        return len(self._chunks)

    @property
    def chunks(self) -> dict[str, SearchHit]:
        return dict(self._chunks)


@dataclass(frozen=True)
class EntityRef:
    """Marks an argument type as an entity id of ``kind`` (``Annotated[str, EntityRef("room")]``),
    so the tool's spec lists it in ``entity_arguments`` (the loop constrains such values)."""

    kind: str


def _entity_kind(annotation: Any, metadata: Iterable[Any] = ()) -> str | None:
    """The ``EntityRef`` kind of an argument (looking inside ``list[...]`` and ``X | None``)."""
    for item in metadata:
        if isinstance(item, EntityRef):
            return item.kind
    for item in getattr(annotation, "__metadata__", ()):
        if isinstance(item, EntityRef):
            return item.kind
    for arg in get_args(annotation):
        kind = _entity_kind(arg)
        if kind is not None:
            return kind
    return None


def entity_arguments(model: type[BaseModel]) -> dict[str, str]:
    """``{argument: entity kind}`` for the fields of an args model typed with ``EntityRef``."""
    out: dict[str, str] = {}
    for name, info in model.model_fields.items():
        kind = _entity_kind(info.annotation, info.metadata)
        if kind is not None:
            out[name] = kind
    return out


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class ToolContext:
    """Everything a tool may use for one ``/ask`` request. Tools act as ``user``, always."""

    user: AuthUser
    downstream: Downstream
    authorizer: DomainAuthorizer
    retriever: Retriever | None = None
    top_k: int | None = None  # the request's top_k (None: TOP_K_FINAL)
    seen_chunks: ChunkSink = field(default_factory=ChunkSink)
    clock: Callable[[], datetime] = utc_now
    observe_payloads: bool = False  # OBSERVE_PAYLOADS: tool arguments and results on spans


def _compact_schema(schema: Any) -> Any:
    """The args model's JSON schema without pydantic's ``title`` noise (fewer prompt tokens)."""
    if isinstance(schema, dict):
        out: dict[str, Any] = {}
        for key, value in schema.items():
            if (key == "title" and isinstance(value, str)) or (key == "default" and value is None):
                continue
            if key in {"properties", "$defs", "definitions"} and isinstance(value, dict):
                out[key] = {name: _compact_schema(sub) for name, sub in value.items()}
            else:
                out[key] = _compact_schema(value)
        return out
    if isinstance(schema, list):
        return [_compact_schema(item) for item in schema]
    return schema


class Tool(ABC, Generic[ArgsT, ResultT]):
    """Subclass as ``class GetRoom(Tool[GetRoomArgs, GetRoomResult])``: ``args_model`` and
    ``result_model`` are taken from the type arguments. Set ``name`` and ``description``;
    implement ``run``.

    ``run`` returns a ``result_model`` instance. The registry serialises it with
    ``exclude_unset``: a field without a default is always in the JSON (null or not), a field
    with a default only when ``run`` set it (passed it to the constructor, or assigned it), so
    a key the model should not see when it has nothing to say stays out. Readers get the
    typed result back from an outcome with ``agent.tools.registry.result_of``.

    What the system prompt says about the tool lives here too, so adding a tool needs no
    prompt edit: ``guidance`` (one line in the prompt's Tools section: when to use it),
    ``examples`` (worked examples shown to json_schema-mode models) and ``prompt_order``
    (where both sit among the other tools', lower first; ties keep the registry order).
    ``answers`` says which live-data questions it settles on its own (``"occupancy"``: how
    busy the entities of its id arguments are), so a planner can pick it without its name."""

    name: ClassVar[str]
    description: ClassVar[str]
    args_model: type[ArgsT]
    result_model: type[ResultT]
    timeout_seconds: ClassVar[float | None] = None  # None: the registry's default
    guidance: ClassVar[str | None] = None
    examples: ClassVar[tuple[ToolExample, ...]] = ()
    prompt_order: ClassVar[int] = 100
    answers: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in getattr(cls, "__orig_bases__", ()):
            if get_origin(base) is not Tool:
                continue
            for attribute, arg in zip(("args_model", "result_model"), get_args(base), strict=False):
                if attribute in cls.__dict__:
                    continue
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    setattr(cls, attribute, arg)

    def parameters_schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = _compact_schema(self.args_model.model_json_schema())
        return schema

    def spec(self) -> ToolSpec:
        return ToolSpec(
            self.name,
            self.description,
            self.parameters_schema(),
            guidance=self.guidance,
            examples=self.examples,
            prompt_order=self.prompt_order,
            entity_arguments=entity_arguments(self.args_model),
            answers=self.answers,
        )

    @abstractmethod
    async def run(self, args: ArgsT, ctx: ToolContext) -> ResultT:
        """Do the work as ``ctx.user``; return the compact result the model will read."""
