"""The composition root: every core object built from ``Settings``, in one place.

The single-process app, the Serve deployments, the CLI, the evals and the benchmarks all
build their parts here, so each part is wired one way. The libraries below (``agent``,
``retrieval``) take small typed configs and ports; only this module reads ``Settings`` for
them."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Literal

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
from conversations.store import ConversationStore
from foundation.database import migrate, resolve_database_url
from foundation.observability.setup import configure_observability
from foundation.settings import Settings, SettingsError, load_settings
from retrieval.embedders import Embedder, build_embedder
from retrieval.rerankers import Reranker, build_reranker
from retrieval.search import HybridRetriever, RetrievalConfig
from retrieval.store import DocumentStore, PgDocumentStore
from serve_app.authz import CedarAuthorizer, load_authorizer
from serve_app.knowledge import LazyStore, connect_store
from serve_app.limits import RequestLimits, build_request_limits
from serve_app.local_backend import Closable, LocalBackend
from serve_app.threads import LazyConversationStore

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


def build_llm_client(settings: Settings, *, model: str | None = None) -> OpenAICompatibleClient:
    """The configured client (``model`` overrides ANSWER_MODEL as the default model).

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


def llm_client_or_placeholder(settings: Settings) -> OpenAICompatibleClient:
    """``build_llm_client``, or, without a key, a client that the provider will refuse: the
    service starts anyway and ``/readyz`` says why the provider is not configured."""
    try:
        return build_llm_client(settings)
    except SettingsError as exc:
        log.error("%s; /readyz will report the provider as not configured", exc)
        return _client(settings, MISSING_KEY_PLACEHOLDER, None)


# --- tools and the agent ----------------------------------------------------------------------


def tool_registry(settings: Settings) -> ToolRegistry:
    """The eight tools. A tool may make up to four sequential downstream calls, so its
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
) -> LocalToolExecutor:
    return LocalToolExecutor(
        tool_registry(settings),
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
    return await connect_store(settings, url)


def build_retriever(
    settings: Settings,
    store: DocumentStore,
    *,
    embedder: Embedder | None = None,
    reranker: Reranker | None = None,
) -> HybridRetriever:
    return HybridRetriever(
        store,
        embedder or build_embedder(settings),
        reranker or build_reranker(settings),
        retrieval_config(settings),
    )


@asynccontextmanager
async def opened_retriever(settings: Settings) -> AsyncIterator[HybridRetriever]:
    """The configured retriever over the opened store, closed on exit."""
    store = await open_store(settings)
    try:
        yield build_retriever(settings, store)
    finally:
        await store.close()


# --- conversations ----------------------------------------------------------------------------


def build_conversation_store(settings: Settings) -> LazyConversationStore:
    """The callers' conversations in DATABASE_URL (or the embedded server), opened on first
    use: building it touches no database."""
    return LazyConversationStore(settings)


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
) -> LocalBackend:
    """Every core object in this process (each part injectable for tests). Nothing here
    touches the network or the database: the store opens on first use (or in ``start``)."""
    closables: list[Closable] = []  # what this function built, the backend closes
    client: LLMClient
    if llm is None:
        built_client = llm_client_or_placeholder(settings)
        closables.append(built_client)
        client = built_client
    else:
        client = llm
    embedder = embedder or build_embedder(settings)
    if downstream is None:
        downstream = build_downstream(settings)
        closables.append(downstream)
    store = LazyStore(settings)
    tools = local_tool_executor(
        settings,
        downstream=downstream,
        authorizer=authorizer or load_authorizer(),
        retriever=build_retriever(settings, store, embedder=embedder),
    )
    return LocalBackend(
        settings=settings,
        agent=build_agent(settings, llm=client, tools=tools),
        store=store,
        embedder=embedder,
        conversations=conversations
        if conversations is not None
        else build_conversation_store(settings),
        closables=closables,
        limits=limits if limits is not None else build_request_limits(settings),
    )
