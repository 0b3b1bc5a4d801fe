"""Hops per ``/ask``, counted without Ray: the Serve graph's composition (Ingress -> AgentLoop
-> ToolProxy -> Retriever -> Reranker) with each deployment handle replaced by a counting one.

Each ``Hop`` stands in for a ``DeploymentHandle``: ``hop.method.remote(*args)`` pickles the
arguments, runs the real deployment method (the class ``@serve.deployment`` wrapped, with the
state its ``__init__`` would set) and pickles the result back, as Serve does between replicas;
it records each call and the bytes that crossed. The adapters on either side of every hop are
the production ones (``ServeBackend``, ``HandleToolExecutor``, ``_HandleRetriever``,
``_HandleReranker``), the model is the scripted server over real HTTP, retrieval is the real
``HybridRetriever`` over the sample documentation in the embedded PostgreSQL.

Counts, not timings: a regression (a second hop per tool call, a reranker call per passage,
an extra model call, the candidate pool shipped back to the loop) changes a number here."""

from __future__ import annotations

import inspect
import pickle
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from agent_helpers import ADMIN, MODES, Call, Calls, Mode, Say, script_steps

from agent.answer import AgentAnswer, DoneEvent
from agent.llm.openai_client import OpenAICompatibleClient
from agent.request import AgentRequest
from agent.tools import Downstream, LocalToolExecutor, build_default_registry
from agent.tools.registry import ToolOutcome
from deployments.agent_loop import AgentLoopDeployment, HandleToolExecutor
from deployments.ingress import ServeBackend
from deployments.reranker import RerankerDeployment
from deployments.retriever import RetrieverDeployment, _HandleReranker
from deployments.tool_proxy import ToolProxyDeployment, _HandleRetriever
from foundation.settings import Settings
from local_world.clock import FixedClock
from local_world.scripted_llm import ScriptedLLM
from retrieval.embedders import SentenceTransformerEmbedder
from retrieval.rerankers import NoopReranker, Reranker
from retrieval.search import HybridRetriever, SearchHit
from retrieval.store import PgDocumentStore
from serve_app.authz import CedarAuthorizer
from serve_app.metrics import InMemoryMetrics
from serve_app.wiring import build_agent, retrieval_config
from tests.pg_wire import SEARCH as ONE_SEARCH
from tests.pg_wire import WireLog, log_pool

# the scripted model over real HTTP and PostgreSQL: on the wire by design
pytestmark = [pytest.mark.integration, pytest.mark.allow_sockets]

QUESTION = "How does the occupancy alert cooldown work?"
SEARCH = {"query": "occupancy alert cooldown"}
TOP_K = 5  # TOP_K_FINAL: the chunks one search hands to the model
TOP_K_RERANK = 20  # the fused candidates one search sends to the reranker

# A pickled ToolOutcome for one search carries the top-k chunks twice (the model-facing JSON
# and the hits, for citation checks) and nothing else: ~6.5 KB for 5 chunks of the sample
# documentation (~3.3 KB for the hits alone). The fused candidate pool behind that search (up
# to TOP_K_VECTOR + TOP_K_KEYWORD chunks, ~30 KB) must never cross (asserted below).
MAX_SEARCH_OUTCOME_BYTES = 16 * 1024


# --- a counting DeploymentHandle --------------------------------------------------------------


@dataclass
class HopCall:
    method: str
    args: tuple[Any, ...]  # as the callee received them
    result: Any  # as the caller received it (a generator: the list of items)
    request_bytes: int
    response_bytes: int


class _Remote:
    def __init__(self, hop: Hop, method: str) -> None:
        self._hop = hop
        self._method = method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        target = getattr(self._hop.replica, self._method)
        if inspect.isasyncgenfunction(target):
            return _Stream(self._hop._stream(self._method, args, kwargs))
        return self._hop._call(self._method, args, kwargs)


class _Stream:
    """What a streaming handle call returns: an async iterator that can be cancelled."""

    def __init__(self, gen: AsyncIterator[Any]) -> None:
        self._gen = gen

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._gen

    def cancel(self) -> None:
        return None


class Hop:
    """Stands in for ``DeploymentHandle``: ``hop.<method>.remote(...)`` runs
    ``replica.<method>(...)`` with pickled arguments and result, and records the call."""

    def __init__(self, name: str, replica: object) -> None:
        self.name = name
        self.replica = replica
        self.calls: list[HopCall] = []

    def options(self, **_: Any) -> Hop:
        return self

    def __getattr__(self, method: str) -> _Remote:
        if method.startswith("_"):
            raise AttributeError(method)
        return _Remote(self, method)

    @property
    def methods(self) -> list[str]:
        return [c.method for c in self.calls]

    async def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        request = pickle.dumps((args, kwargs))
        args, kwargs = pickle.loads(request)
        response = pickle.dumps(await getattr(self.replica, method)(*args, **kwargs))
        result = pickle.loads(response)
        self.calls.append(HopCall(method, args, result, len(request), len(response)))
        return pickle.loads(response)

    async def _stream(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> AsyncIterator[Any]:
        request = pickle.dumps((args, kwargs))
        args, kwargs = pickle.loads(request)
        items: list[Any] = []
        size = 0
        try:
            async for item in getattr(self.replica, method)(*args, **kwargs):
                response = pickle.dumps(item)
                size += len(response)
                items.append(pickle.loads(response))
                yield pickle.loads(response)
        finally:
            self.calls.append(HopCall(method, args, items, len(request), size))


def replica(deployment: Any, **state: Any) -> Any:
    """An instance of the class ``@serve.deployment`` wrapped, holding ``state`` (what its
    ``__init__`` builds from the environment), without running that ``__init__``."""
    cls = deployment.func_or_class
    instance = cls.__new__(cls)
    vars(instance).update(state)
    return instance


class StubCrossEncoder:
    """A reranker with a cross-encoder's contract (one score per passage) and no model:
    scores by shared words with the query. It records the passages of each call."""

    name = "stub/cross-encoder"

    def __init__(self) -> None:
        self.calls: list[int] = []

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        words = set(query.lower().split())
        return [float(len(words & set(p.lower().split()))) for p in passages]

    async def ascore(self, query: str, passages: Sequence[str]) -> list[float]:
        self.calls.append(len(passages))
        return self.score(query, passages)


# --- the graph ---------------------------------------------------------------------------------


@dataclass
class Graph:
    ingress: ServeBackend  # what the Ingress replica runs /ask through
    agent_loop: Hop  # Ingress -> AgentLoop
    tool_proxy: Hop  # AgentLoop -> ToolProxy
    retriever: Hop  # ToolProxy -> Retriever
    reranker: Hop  # Retriever -> Reranker
    cross_encoder: StubCrossEncoder
    hops: list[Hop] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.hops = [self.agent_loop, self.tool_proxy, self.retriever, self.reranker]

    def counts(self) -> dict[str, int]:
        return {hop.name: len(hop.calls) for hop in self.hops}


def build_graph(
    settings: Settings,
    *,
    llm: OpenAICompatibleClient,
    store: PgDocumentStore,
    embedder: SentenceTransformerEmbedder,
    downstream: Downstream,
    authorizer: CedarAuthorizer,
    clock: FixedClock,
) -> Graph:
    """``deployments.graph.build_app`` with each deployment's ``__init__`` done by hand (same
    adapters, same choices) and each handle a ``Hop``."""
    cross_encoder = StubCrossEncoder()
    reranker = Hop("Reranker", replica(RerankerDeployment, reranker=cross_encoder))
    ranker: Reranker = (
        NoopReranker()
        if settings.reranker == "noop"
        else _HandleReranker(cross_encoder.name, reranker)  # type: ignore[arg-type]
    )
    retriever = Hop(
        "Retriever",
        replica(
            RetrieverDeployment,
            settings=settings,
            metrics=InMemoryMetrics(),
            store=store,
            retriever=HybridRetriever(store, embedder, ranker, retrieval_config(settings)),
        ),
    )
    tool_proxy = Hop(
        "ToolProxy",
        replica(
            ToolProxyDeployment,
            _retriever=retriever,
            executor=LocalToolExecutor(
                build_default_registry(timeout_seconds=settings.resolved_tool_timeout_seconds),
                downstream=downstream,
                authorizer=authorizer,
                retriever=_HandleRetriever(retriever),  # type: ignore[arg-type]
                clock=clock,
                observe_payloads=settings.observe_payloads,
            ),
        ),
    )
    agent_loop = Hop(
        "AgentLoop",
        replica(
            AgentLoopDeployment,
            settings=settings,
            metrics=InMemoryMetrics(),
            _tool_proxy=tool_proxy,
            agent=build_agent(
                settings,
                llm=llm,
                tools=HandleToolExecutor(tool_proxy, build_default_registry().specs()),  # type: ignore[arg-type]
            ),
        ),
    )
    ingress = ServeBackend(agent_loop, settings)  # type: ignore[arg-type]
    return Graph(ingress, agent_loop, tool_proxy, retriever, reranker, cross_encoder)


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def docs_store(sample_docs_url: str) -> AsyncIterator[tuple[PgDocumentStore, WireLog]]:
    """The sample documentation, on a one-connection pool whose wire traffic is logged."""
    store = await PgDocumentStore.connect(sample_docs_url, embedding_dim=384, max_size=1)
    yield store, await log_pool(store.pool)
    await store.close()


@pytest.fixture
async def make_graph(
    settings: Settings,
    llm_url: str,
    docs_store: tuple[PgDocumentStore, WireLog],
    minilm: SentenceTransformerEmbedder,
    downstream: Downstream,
    authorizer: CedarAuthorizer,
    clock: FixedClock,
) -> AsyncIterator[Any]:
    clients: list[OpenAICompatibleClient] = []
    store, wire = docs_store

    def make(mode: Mode, reranker: str) -> Graph:
        graph_settings = settings.model_copy(
            update={
                "tool_calling_mode": mode,
                "reranker": reranker,
                "reranker_model": None if reranker == "noop" else StubCrossEncoder.name,
                "top_k_final": TOP_K,
                "top_k_rerank": TOP_K_RERANK,
            }
        )
        client = OpenAICompatibleClient(
            base_url=llm_url,
            api_key="test-key",
            default_model=graph_settings.answer_model,
            tool_calling_mode=mode,
            timeout_seconds=graph_settings.llm_timeout_seconds,
            max_retries=0,
        )
        clients.append(client)
        wire.clear()
        return build_graph(
            graph_settings,
            llm=client,
            store=store,
            embedder=minilm,
            downstream=downstream,
            authorizer=authorizer,
            clock=clock,
        )

    yield make
    for client in clients:
        await client.aclose()


async def ask(graph: Graph, question: str) -> AgentAnswer:
    return await graph.ingress.ask(AgentRequest(question, ADMIN))


def db_round_trips(wire: WireLog) -> list[str]:
    """What the store sent to PostgreSQL (statement-cache misses left out)."""
    return wire.labels(setup=False)


# --- the tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("reranker", ["noop", "cross-encoder"])
@pytest.mark.parametrize("mode", MODES)
async def test_one_search_question_costs_one_hop_per_edge(
    mode: Mode,
    reranker: str,
    make_graph: Any,
    llm: ScriptedLLM,
    docs_store: tuple[PgDocumentStore, WireLog],
) -> None:
    llm.script(
        *script_steps(mode, Call("search_docs", SEARCH), Say("Alerts cool down.")), key=QUESTION
    )
    graph = make_graph(mode, reranker)

    answer = await ask(graph, QUESTION)

    assert answer.decision == "answered", answer
    assert [c.name for c in answer.tool_calls] == ["search_docs"]
    assert answer.tool_calls[0].ok
    assert graph.counts() == {
        "AgentLoop": 1,  # Ingress -> AgentLoop: one per /ask
        "ToolProxy": 1,  # AgentLoop -> ToolProxy: one per tool call
        "Retriever": 1,  # ToolProxy -> Retriever: one per search_docs
        "Reranker": 0 if reranker == "noop" else 1,  # one per search, never per passage
    }
    assert graph.agent_loop.methods == ["answer"]
    assert graph.tool_proxy.methods == ["execute"]
    assert graph.retriever.methods == ["search"]
    if reranker != "noop":
        assert graph.reranker.methods == ["score"]
        query, passages = graph.reranker.calls[0].args
        assert query == SEARCH["query"]
        assert len(passages) == TOP_K_RERANK  # the whole rerank pool in one call
        assert graph.cross_encoder.calls == [TOP_K_RERANK]
    # Model calls = tool hops + 1 (the final answer), each one HTTP request.
    assert len(llm.chat_requests(QUESTION)) == 2
    assert len(answer.usage.hops) == 2
    # One search = one statement on the database (and the pool's reset on release).
    assert db_round_trips(docs_store[1]) == ONE_SEARCH


async def test_search_outcome_crossing_to_the_loop_carries_only_the_top_k_chunks(
    make_graph: Any, llm: ScriptedLLM
) -> None:
    llm.script(
        *script_steps("native", Call("search_docs", SEARCH), Say("Alerts cool down.")),
        key=QUESTION,
    )
    graph = make_graph("native", "cross-encoder")
    await ask(graph, QUESTION)

    # Retriever -> ToolProxy: the top-k hits.
    (search,) = graph.retriever.calls
    hits: list[SearchHit] = search.result
    assert len(hits) == TOP_K
    # ToolProxy -> AgentLoop: a ToolOutcome with those hits and the model-facing JSON.
    (execute,) = graph.tool_proxy.calls
    outcome: ToolOutcome = execute.result
    assert [h.chunk_id for h in outcome.chunks] == [h.chunk_id for h in hits]
    assert execute.response_bytes < MAX_SEARCH_OUTCOME_BYTES, execute.response_bytes
    assert search.response_bytes < MAX_SEARCH_OUTCOME_BYTES, search.response_bytes
    assert execute.response_bytes < 3 * search.response_bytes  # the hits, twice, and no more
    # The bound is meaningful: the candidate pool behind that search would not fit under it.
    config = retrieval_config(graph.retriever.replica.settings)
    retriever = graph.retriever.replica.retriever
    fused = await retriever.candidates(
        SEARCH["query"], await retriever.embed_query(SEARCH["query"]), ADMIN.acl_entries
    )
    assert len(fused) > config.top_k_final
    assert len(pickle.dumps(fused)) > MAX_SEARCH_OUTCOME_BYTES


async def test_parallel_searches_cost_one_hop_each(
    make_graph: Any, llm: ScriptedLLM, docs_store: tuple[PgDocumentStore, WireLog]
) -> None:
    """Two search_docs calls in one model reply: two tool hops, two searches, two reranker
    calls, still two model calls (the tools of one reply run in one hop)."""
    question = "Compare alert cooldowns with the billing seat grace period."
    steps = (
        Calls((Call("search_docs", SEARCH), Call("search_docs", {"query": "seat grace period"}))),
        Say("Both exist."),
    )
    llm.script(*script_steps("native", *steps), key=question)
    graph = make_graph("native", "cross-encoder")

    answer = await ask(graph, question)

    assert [c.name for c in answer.tool_calls] == ["search_docs", "search_docs"]
    assert graph.counts() == {"AgentLoop": 1, "ToolProxy": 2, "Retriever": 2, "Reranker": 2}
    assert graph.cross_encoder.calls == [TOP_K_RERANK, TOP_K_RERANK]
    assert len(llm.chat_requests(question)) == 2
    assert db_round_trips(docs_store[1]) == ONE_SEARCH * 2


async def test_live_data_tool_never_reaches_retrieval(make_graph: Any, llm: ScriptedLLM) -> None:
    question = "Which buildings are there?"
    llm.script(*script_steps("native", Call("list_buildings", {}), Say("Several.")), key=question)
    graph = make_graph("native", "cross-encoder")

    answer = await ask(graph, question)

    assert [c.name for c in answer.tool_calls] == ["list_buildings"]
    assert graph.counts() == {"AgentLoop": 1, "ToolProxy": 1, "Retriever": 0, "Reranker": 0}
    assert len(llm.chat_requests(question)) == 2


async def test_streaming_ask_costs_the_same_hops(make_graph: Any, llm: ScriptedLLM) -> None:
    llm.script(
        *script_steps("native", Call("search_docs", SEARCH), Say("Alerts cool down.")),
        key=QUESTION,
    )
    graph = make_graph("native", "cross-encoder")

    events = [e async for e in graph.ingress.ask_stream(AgentRequest(QUESTION, ADMIN))]

    assert isinstance(events[-1], DoneEvent)
    assert graph.agent_loop.methods == ["stream"]
    assert graph.counts() == {"AgentLoop": 1, "ToolProxy": 1, "Retriever": 1, "Reranker": 1}
    assert len(llm.chat_requests(QUESTION)) == 2
