"""The composition root: every core object built from ``Settings``, in one place.

The single-process app, the Serve deployments, the CLI, the evals and the benchmarks all
build their parts here, so each part is wired one way. The libraries below (``agent``,
``retrieval``, ``ingest_jobs``, ``conversations``, ``usage_limits``, ``evals``) take small
typed configs and ports, never ``Settings`` (tests/test_layering.py); the functions named
``*_config`` (and ``limit_policy``) here build those configs from the settings' sections."""

from __future__ import annotations

import importlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Literal, cast

from agent.access import DomainAuthorizer
from agent.llm.base import LLMClient
from agent.llm.openai_client import API_KEY_VARIABLES, LOCAL_PLACEHOLDER_KEY, OpenAICompatibleClient
from agent.loop import Agent, AgentConfig
from agent.small_model.strategy import SmallModelStrategy
from agent.strategy import AgenticStrategy, RunStrategy
from agent.tools import build_default_registry
from agent.tools.base import Retriever
from agent.tools.downstream import Downstream
from agent.tools.executor import LocalToolExecutor, ToolExecutor
from agent.tools.registry import ToolRegistry
from conversations.store import ConversationsConfig, ConversationStore
from foundation.database import migrate, resolve_database_url
from foundation.observability.setup import configure_observability
from foundation.settings import Settings, SettingsError, load_settings
from ingest_jobs.config import IngestConfig
from retrieval.embedders import Embedder, EmbedderConfig, build_embedder
from retrieval.rerankers import Reranker, RerankerConfig, build_reranker
from retrieval.search import HybridRetriever, RetrievalConfig
from retrieval.store import DocumentStore, PgDocumentStore, StoreConfig
from serve_app.authz import CedarAuthorizer, load_authorizer
from serve_app.knowledge import LazyStore, connect_store
from serve_app.limits import RequestLimits, build_request_limits
from serve_app.local_backend import Closable, LocalBackend
from serve_app.threads import LazyConversationStore
from usage_limits.core import LimitPolicy

if TYPE_CHECKING:
    from evals.judge import JudgeConfig
    from evals.runner import EvalConfig

log = logging.getLogger(__name__)

MISSING_KEY_PLACEHOLDER = "missing-api-key"


def replica_settings(component: str) -> Settings:
    """A Serve replica's start: the settings from its environment, and telemetry named after
    its deployment (``component``)."""
    settings = load_settings()
    configure_observability(settings, component)
    return settings


# --- the model --------------------------------------------------------------------------------


def _client(settings: Settings, api_key: str, model: str | None) -> OpenAICompatibleClient:
    llm = settings.llm
    return OpenAICompatibleClient(
        base_url=llm.base_url,
        api_key=api_key,
        default_model=model or llm.answer_model,
        tool_calling_mode=llm.tool_calling_mode,
        timeout_seconds=llm.timeout_seconds,
        max_retries=llm.max_retries,
        max_output_tokens=llm.max_output_tokens,
        temperature=llm.temperature,
    )


def plugin(spec: str, variable: str) -> Callable[..., object]:
    """The factory ``module:function`` names (``LLM_PROVIDER``, ``RETRIEVER``); a
    ``SettingsError`` naming ``variable`` when it does not load."""
    module_name, _, attribute = spec.partition(":")
    try:
        factory: object = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise SettingsError(f"{variable}={spec}: cannot load it ({exc})") from None
    if not callable(factory):
        raise SettingsError(f"{variable}={spec}: not a function")
    return factory


def build_llm_client(settings: Settings, *, model: str | None = None) -> LLMClient:
    """The configured client (``model`` overrides ANSWER_MODEL as the default model): the
    factory LLM_PROVIDER names, or the OpenAI-compatible client (``openai_client``)."""
    provider = settings.llm.provider
    if provider == "openai":
        return openai_client(settings, model=model)
    client = plugin(provider, "LLM_PROVIDER")(settings, model)
    if not isinstance(client, LLMClient):
        raise SettingsError(
            f"LLM_PROVIDER={provider}: returned {type(client).__name__}, not an LLMClient"
        )
    return client


def openai_client(settings: Settings, *, model: str | None = None) -> OpenAICompatibleClient:
    """The OpenAI-compatible client of the LLM_* settings (``model`` overrides ANSWER_MODEL).

    Raises ``SettingsError`` naming OPENROUTER_API_KEY (and its aliases) when no key is set,
    unless LLM_BASE_URL is a loopback address (a local model server needs none)."""
    key = settings.llm.api_key.get_secret_value() if settings.llm.api_key else ""
    if not key.strip():
        if not settings.llm.is_local:
            raise SettingsError(
                f"{API_KEY_VARIABLES[0]} is not set (also accepted: "
                f"{', '.join(API_KEY_VARIABLES[1:])}): the model provider at "
                f"LLM_BASE_URL={settings.llm.base_url} needs an API key"
            )
        key = LOCAL_PLACEHOLDER_KEY
    return _client(settings, key.strip(), model)


def llm_client_or_placeholder(settings: Settings) -> LLMClient:
    """``build_llm_client``, or, without a key for the OpenAI-compatible client, one that the
    provider will refuse: the service starts anyway and ``/readyz`` says why the provider is
    not configured. A plug-in that does not load fails the start (it names LLM_PROVIDER)."""
    if settings.llm.provider != "openai":
        return build_llm_client(settings)
    try:
        return openai_client(settings)
    except SettingsError as exc:
        log.error("%s; /readyz will report the provider as not configured", exc)
        return _client(settings, MISSING_KEY_PLACEHOLDER, None)


# --- tools and the agent ----------------------------------------------------------------------


def tool_registry(settings: Settings) -> ToolRegistry:
    """The default tools (``build_default_registry``). A tool may make up to four sequential
    downstream calls, so its
    timeout follows ``TWIN_TIMEOUT_SECONDS`` (never under 30 s, which also covers
    ``search_docs``)."""
    return build_default_registry(timeout_seconds=settings.tools.resolved_tool_timeout_seconds)


def build_downstream(settings: Settings) -> Downstream:
    return Downstream(
        twin_url=settings.tools.twin_service_url,
        sensor_url=settings.tools.sensor_service_url,
        timeout_seconds=settings.tools.twin_timeout_seconds,
    )


def local_tool_executor(
    settings: Settings,
    *,
    downstream: Downstream,
    authorizer: DomainAuthorizer,
    retriever: Retriever | None,
    registry: ToolRegistry | None = None,
) -> LocalToolExecutor:
    return LocalToolExecutor(
        registry or tool_registry(settings),
        downstream=downstream,
        authorizer=authorizer,
        retriever=retriever,
        observe_payloads=settings.observability.observe_payloads,
    )


def _auto_or_on(value: Literal["auto", "on", "off"]) -> bool | None:
    """An auto/on/off setting as the agent's config takes it: None leaves it to the agent."""
    return None if value == "auto" else value == "on"


def agent_config(settings: Settings) -> AgentConfig:
    agent, llm = settings.agent, settings.llm
    return AgentConfig(
        max_tool_hops=agent.max_tool_hops,
        max_tool_calls=agent.max_tool_calls_per_ask or None,
        max_total_tokens=agent.max_tokens_per_ask or None,
        observe_payloads=settings.observability.observe_payloads,
        temperature=llm.temperature,
        max_output_tokens=llm.max_output_tokens,
        provider_url=llm.base_url,
        repair_ungrounded=_auto_or_on(agent.grounding_repair),
        heartbeat_seconds=settings.http.stream_heartbeat_seconds,
        history_max_tokens=settings.resolved_history_max_tokens,
    )


def run_strategy(settings: Settings) -> RunStrategy:
    """The strategy the agent's runs take: plan first (``PLAN_FIRST``; auto: where the model
    speaks the ``json_schema`` mode of the small local models), else the plain agentic loop."""
    plan_first = _auto_or_on(settings.agent.plan_first)
    if plan_first is None:
        plan_first = settings.llm.tool_calling_mode == "json_schema"
    if plan_first:
        return SmallModelStrategy(compose=settings.agent.compose_answers)
    return AgenticStrategy()


def build_agent(settings: Settings, *, llm: LLMClient, tools: ToolExecutor) -> Agent:
    config = agent_config(settings)
    return Agent(llm=llm, tools=tools, config=config, strategy=run_strategy(settings))


# --- the knowledge base -----------------------------------------------------------------------


def embedder_config(settings: Settings) -> EmbedderConfig:
    """The embedder (EMBEDDING_*); the ``openai`` backend calls the provider (LLM_BASE_URL
    unless EMBEDDING_BASE_URL, with its key, timeout and retries). Building it refuses an
    unknown dimension (EMBEDDING_DIM unset for a model other than the default)."""
    embedding, llm = settings.embedding, settings.llm
    return EmbedderConfig(
        backend=embedding.backend,
        model=embedding.model,
        dim=embedding.known_dim,
        batch_size=embedding.batch_size,
        dtype=embedding.dtype,
        streams=embedding.streams,
        base_url=embedding.base_url or llm.base_url,
        api_key=llm.api_key.get_secret_value() if llm.api_key else None,
        timeout_seconds=llm.timeout_seconds,
        max_retries=llm.max_retries,
    )


def reranker_config(settings: Settings) -> RerankerConfig:
    return RerankerConfig(
        kind=settings.retrieval.reranker,
        model=settings.retrieval.reranker_model,
        home=settings.home,
    )


def store_config(settings: Settings) -> StoreConfig:
    """The knowledge base's pool and search parameters, checked against EMBEDDING_DIM."""
    retrieval = settings.retrieval
    return StoreConfig(
        embedding_dim=settings.embedding.resolved_dim,
        min_size=settings.database.pool_min_size,
        max_size=settings.database.pool_max_size,
        ef_search=retrieval.hnsw_ef_search,
        keyword_common_rows=retrieval.keyword_common_rows,
        keyword_ranking=retrieval.keyword_ranking,
    )


def ingest_config(settings: Settings) -> IngestConfig:
    ingestion = settings.ingestion
    return IngestConfig(
        embedder=embedder_config(settings),
        chunk_max_tokens=ingestion.chunk_max_tokens,
        ray_min_chunks=ingestion.ray_min_chunks,
        defer_vector_index=ingestion.defer_vector_index,
        cpus=ingestion.cpus,
        object_store_mb=ingestion.object_store_mb,
        ray_address=settings.ray.address,
    )


def retrieval_config(settings: Settings) -> RetrievalConfig:
    retrieval = settings.retrieval
    return RetrievalConfig(
        top_k_vector=retrieval.top_k_vector,
        top_k_keyword=retrieval.top_k_keyword,
        top_k_rerank=retrieval.top_k_rerank,
        top_k_final=retrieval.top_k_final,
        rrf_k=retrieval.rrf_k,
        keyword_weight=retrieval.rrf_keyword_weight,
        observe_payloads=settings.observability.observe_payloads,
    )


async def open_store(settings: Settings, *, migrate_first: bool = False) -> PgDocumentStore:
    """Connect to DATABASE_URL (or the embedded server, started on demand).

    Raises ``DatabaseError`` with an actionable message when the schema is missing or its
    dimension differs from EMBEDDING_DIM."""
    url = await resolve_database_url(settings)
    if migrate_first:
        migrate(url, settings.embedding.resolved_dim)
    return await connect_store(store_config(settings), url)


def build_retriever(
    settings: Settings,
    store: DocumentStore,
    *,
    embedder: Embedder | None = None,
    reranker: Reranker | None = None,
) -> Retriever:
    """The service's hybrid search over ``store``, or the strategy RETRIEVER names built
    over it."""
    hybrid = HybridRetriever(
        store,
        embedder or build_embedder(embedder_config(settings)),
        reranker or build_reranker(reranker_config(settings)),
        retrieval_config(settings),
    )
    strategy = settings.retrieval.strategy
    if strategy == "hybrid":
        return hybrid
    retriever = plugin(strategy, "RETRIEVER")(settings, hybrid)
    if not callable(getattr(retriever, "search", None)):
        raise SettingsError(f"RETRIEVER={strategy}: returned {type(retriever).__name__}, no search")
    return cast(Retriever, retriever)


@asynccontextmanager
async def opened_retriever(settings: Settings) -> AsyncIterator[Retriever]:
    """The configured retriever over the opened store, closed on exit."""
    store = await open_store(settings)
    try:
        yield build_retriever(settings, store)
    finally:
        await store.close()


# --- conversations ----------------------------------------------------------------------------


def conversations_config(settings: Settings) -> ConversationsConfig:
    return ConversationsConfig(
        ttl_days=settings.conversations.ttl_days,
        min_size=settings.database.pool_min_size,
        max_size=settings.database.pool_max_size,
    )


def build_conversation_store(settings: Settings) -> LazyConversationStore:
    """The callers' conversations in DATABASE_URL (or the embedded server), opened on first
    use: building it touches no database."""
    return LazyConversationStore(settings, conversations_config(settings))


# --- usage limits -----------------------------------------------------------------------------


def limit_policy(settings: Settings) -> LimitPolicy:
    """The rate limits and budgets of ``POST /ask`` (RATE_LIMIT_*, BUDGET_*, LIMITS_*)."""
    limits = settings.limits
    return LimitPolicy(
        user_requests_per_minute=limits.rate_limit_user_per_minute,
        domain_requests_per_minute=limits.rate_limit_domain_per_minute,
        user_tokens=limits.budget_user_tokens,
        domain_tokens=limits.budget_domain_tokens,
        user_cost_usd=limits.budget_user_cost_usd,
        domain_cost_usd=limits.budget_domain_cost_usd,
        period=limits.budget_period,
        elevated_factor=limits.elevated_factor,
    )


# --- evals ------------------------------------------------------------------------------------


def eval_config(settings: Settings) -> EvalConfig:
    """What ``agent-service eval`` takes: the running service's URL, the eval secret, the
    answer model and the /ask deadline, and the Ray a sweep runs on."""
    from evals.runner import EvalConfig

    secret = settings.auth.eval_jwt_secret
    return EvalConfig(
        base_url=f"http://{settings.serve.host}:{settings.serve.port}{settings.http.api_prefix}",
        eval_secret=secret.get_secret_value() if secret else None,
        answer_model=settings.llm.answer_model,
        ask_timeout_seconds=settings.http.ask_timeout_seconds,
        ray_address=settings.ray.address,
    )


def judge_config(settings: Settings, *, model: str | None = None) -> JudgeConfig:
    """JUDGE_MODEL at JUDGE_BASE_URL (default LLM_BASE_URL) with the provider API key.

    Raises ``SettingsError`` when a remote judge has no key."""
    from evals.judge import JudgeConfig, is_loopback

    base_url = settings.evals.judge_base_url or settings.llm.base_url
    key = settings.llm.api_key.get_secret_value().strip() if settings.llm.api_key else ""
    if not key:
        if not is_loopback(base_url):
            raise SettingsError(
                f"{API_KEY_VARIABLES[0]} is not set (also accepted: "
                f"{', '.join(API_KEY_VARIABLES[1:])}): the judge at {base_url} needs an API "
                "key (or run with --no-judge)"
            )
        key = LOCAL_PLACEHOLDER_KEY
    return JudgeConfig(
        model=model or settings.evals.judge_model,
        base_url=base_url,
        api_key=key,
        timeout_seconds=settings.llm.timeout_seconds,
        max_retries=settings.llm.max_retries,
    )


# --- the in-process backend -------------------------------------------------------------------


def build_local_backend(
    settings: Settings,
    *,
    authorizer: CedarAuthorizer | None = None,
    llm: LLMClient | None = None,
    embedder: Embedder | None = None,
    downstream: Downstream | None = None,
    conversations: ConversationStore | None = None,
    limits: RequestLimits | None = None,
    registry: ToolRegistry | None = None,
) -> LocalBackend:
    """Every core object in this process (each part injectable for tests). Nothing here
    touches the network or the database: the store opens on first use (or in ``start``)."""
    closables: list[Closable] = []  # what this function built, the backend closes
    client: LLMClient
    if llm is None:
        client = llm_client_or_placeholder(settings)
        if isinstance(client, Closable):
            closables.append(client)
    else:
        client = llm
    embedder = embedder or build_embedder(embedder_config(settings))
    if downstream is None:
        downstream = build_downstream(settings)
        closables.append(downstream)
    store = LazyStore(settings, store_config(settings))
    tools = local_tool_executor(
        settings,
        downstream=downstream,
        authorizer=authorizer or load_authorizer(),
        retriever=build_retriever(settings, store, embedder=embedder),
        registry=registry,
    )
    return LocalBackend(
        settings=settings,
        agent=build_agent(settings, llm=client, tools=tools),
        store=store,
        embedder=embedder,
        conversations=conversations
        if conversations is not None
        else build_conversation_store(settings),
        ingest=ingest_config(settings),
        closables=closables,
        limits=limits
        if limits is not None
        else build_request_limits(settings, limit_policy(settings)),
    )
