"""Follow-ups that retrieve well (issue 17, item 3): retrieval recall@5 of the raw follow-up,
the rewritten one and the hand-written standalone question, and end-to-end pass rates of the
follow-up turns with a scripted model, or over HTTP with a running service's model.

    python -m bench.followups [--split dev|test|all] [--world NAME] [--dataset FILE ...]
        [--out-dir bench/out/followups] [--database retrieval_quality] [--no-e2e]
    python -m bench.followups --service http://127.0.0.1:8000 [--split test] [--model M]
        [--budget-minutes N]

The conversations are ``evals/datasets/followups.yaml`` (dev: rewriter rules may be fitted on
them; how they were written: its header) and ``evals/datasets/test-followups.yaml`` (test:
frozen, the run of record); ``--split`` picks the side, ``dev`` by default (evals/README.md,
"dev and test"), and the report says which ran.
The sample documentation is ingested as ``bench.retrieval_quality`` does it, into the same
benchmark database on the configured server (a second run embeds nothing); the live data is
``local_world``'s estate, in process, at a pinned time.

Retrieval: every documentation follow-up is searched as its caller with the service's
retriever as configured (hybrid, ``RERANKER``), top 5, three times: as typed (raw), as the
``DeterministicRewriter`` rewrites it from the dataset's earlier turns (their questions,
stored answers and tool ids; ``known`` = the caller's buildings), and as the hand-written
standalone question. recall@5 counts the labelled answering sections among the five. Every
follow-up (documentation and live) also gets "resolved": the query names every building
and room the follow-up is about (by name from the caller's buildings, or by id), as the
planner's grounding reads a question.

End to end: every conversation runs turn by turn through the real ``Agent`` (json_schema
mode, plan first, composed live answers: the local models' path), the eight tools over the
in-process simulators as the caller and the same retriever, with a scripted model that is
faithful by construction: it cites every chunk the service showed it, and says nothing
else. Each later turn gets the thread's history and the earlier turns as they really ran
(answers and tool calls). Conditions: ``raw`` (no rewriter: ``PassThroughRewriter``),
``rewritten`` (the default ``DeterministicRewriter``), ``standalone`` (the hand-written
standalone questions asked instead). A follow-up passes when its run is ``answered`` and
cites a labelled answering section (documentation), and calls every expected tool with the
expected arguments (live data). A scripted model cannot show what a real model makes of the
history: this measures what the service searches and grounds for it.

With ``--service URL`` the end-to-end part runs over real HTTP against a running service
instead (its configured model: the local one by default), and the retrieval part is not
run. Every conversation is asked as its caller (an eval token signed with
``EVAL_JWT_SECRET``, as ``evals.runner`` signs them): turn 1 ``POST /ask`` without a
``conversation_id``, later turns with the one it returned (``threaded``: the follow-up as
typed, what the service ships), then each follow-up's standalone question as a new
conversation (``standalone``). The same ``passed`` rule scores the answer, and each ask's
latency is kept. ``--budget-minutes`` stops before the next conversation once spent (the
report then says how many ran; the conversations run with documentation and live data
interleaved, so a partial run holds both).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, Protocol

import httpx
from pydantic import ValidationError

from agent.answer import AgentAnswer
from agent.llm.base import ChatRequest, ChatResult
from agent.loop import Agent
from agent.small_model.entities import NamedEntity, ids_in_text, match_names
from agent.small_model.followups import (
    DeterministicRewriter,
    PassThroughRewriter,
    QueryRewriter,
)
from agent.small_model.intents import sensor_types
from agent.small_model.strategy import SmallModelStrategy
from agent.testing import FunctionModel, text_reply
from agent.tools import build_default_registry
from agent.tools.base import Retriever
from agent.tools.downstream import Downstream
from agent.tools.executor import LocalToolExecutor
from agent.turns import PriorTurn, prior_turn
from evals.dataset import DEFAULT_SPLIT, SPLIT_CHOICES, DatasetError, SplitChoice
from evals.followups import (
    DEFAULT_FOLLOWUPS_DATASETS,
    Conversation,
    FollowupDataset,
    Turn,
    load_followup_sets,
    tools_match,
)
from evals.retrieval_labels import Caller, SectionKey
from foundation.eval_tokens import mint_eval_token
from foundation.identity import AuthUser
from local_world.claims import claims_from_payload, encode_flat_claims
from local_world.clock import FixedClock
from local_world.sensor_service import create_sensor_app
from local_world.twin_service import create_twin_app
from local_world.world import World, build_world

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT_DIR = ROOT / "bench" / "out" / "followups"
PINNED = "2025-03-04T10:30:00Z"  # a Tuesday, mid-morning (UTC): the tests' instant
K = 5
CONDITIONS = ("raw", "rewritten", "standalone")
TWIN_URL = "http://twin.in-process"
SENSOR_URL = "http://sensor.in-process"


class Hit(Protocol):
    @property
    def source(self) -> str: ...
    @property
    def section(self) -> str: ...


class Searcher(Protocol):
    async def search(
        self, query: str, *, acl: Sequence[str], top_k: int | None = None
    ) -> Sequence[Hit]: ...


# --- retrieval ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetrievalRow:
    conversation: str
    turn: int  # 1-based
    queries: dict[str, str]  # condition -> the query
    rule: str  # the rewriter's rule
    recall: dict[str, float | None]  # condition -> recall@K (None: a live-data follow-up)
    resolved: dict[str, bool | None]  # condition -> names every expected entity


def known_buildings(world: World, caller: Caller) -> list[NamedEntity]:
    """The buildings the caller's ``list_buildings`` returns (the simulator's own rule)."""
    claims = claims_from_payload(
        {"sub": caller.name, "roles": list(caller.roles), "domains": list(caller.domains)}
    )
    return [NamedEntity("building", b.id, b.name) for b in world.visible_buildings(claims)]


def expected_entities(turn: Turn) -> set[str]:
    """The building and room ids a live follow-up's expected tool calls name."""
    ids: set[str] = set()
    for arguments in turn.tools.values():
        for key in ("building_id", "room_id"):
            value = arguments.get(key)
            if isinstance(value, str):
                ids.add(value)
    return ids


def resolves(query: str, expected: set[str], known: Sequence[NamedEntity]) -> bool:
    """The query names every expected entity, as the planner reads it: a building of the
    caller's list by name, or an id as typed (the room of a named building counts once its
    building is named and the query names no other room)."""
    found = {e.entity_id for e in match_names(query, known)} | set(ids_in_text(query))
    return expected <= found


def _recall(hits: Sequence[Hit], answers: frozenset[SectionKey], dataset: FollowupDataset) -> float:
    keys = {(dataset.corpus.key_of(h.source), h.section) for h in hits[:K]}
    return len(answers & keys) / len(answers)


async def score_retrieval(
    dataset: FollowupDataset, searcher: Searcher, world: World
) -> list[RetrievalRow]:
    rewriter = DeterministicRewriter()
    measures = sensor_types(build_default_registry().specs())  # what the tools list
    rows: list[RetrievalRow] = []
    for conversation, index in dataset.follow_ups():
        turn = conversation.turns[index]
        known = known_buildings(world, conversation.caller)
        earlier = [t.prior for t in conversation.turns[:index]]
        rewrite = rewriter.rewrite_now(turn.question, earlier, known=known, measures=measures)
        queries = {
            "raw": turn.question,
            "rewritten": rewrite.query,
            "standalone": turn.standalone or turn.question,
        }
        recall: dict[str, float | None] = dict.fromkeys(CONDITIONS)
        if turn.documentation:
            for condition, query in queries.items():
                hits = await searcher.search(query, acl=conversation.caller.acl, top_k=K)
                recall[condition] = _recall(hits, turn.answer_keys, dataset)
        expected = expected_entities(turn)
        resolved: dict[str, bool | None] = {
            c: (resolves(q, expected, known) if expected else None) for c, q in queries.items()
        }
        rows.append(
            RetrievalRow(conversation.id, index + 1, queries, rewrite.rule, recall, resolved)
        )
    return rows


# --- end to end ---------------------------------------------------------------------------------


def faithful_model() -> FunctionModel:
    """A scripted model that cites every chunk it was shown and says nothing else (no
    figures, so nothing to ground): what passes is what the service put in front of it."""

    def reply(request: ChatRequest) -> ChatResult:
        shown = list(dict.fromkeys(request.source_labels.values()))
        if shown:
            return text_reply("See the documentation. " + " ".join(f"[^{c}]" for c in shown))
        return text_reply("Here is what the tools returned.")

    return FunctionModel(reply, model="scripted/faithful", tool_calling_mode="json_schema")


@dataclass(frozen=True)
class E2ERow:
    conversation: str
    turn: int
    condition: str
    question: str
    passed: bool
    decision: str
    cited: tuple[str, ...]
    tools: tuple[str, ...]
    notes: tuple[str, ...]
    latency_ms: float | None = None  # over HTTP (--service): the ask's wall time


def user_of(caller: Caller) -> AuthUser:
    return AuthUser.from_claims_header(
        encode_flat_claims(f"bench-{caller.name}", caller.roles, caller.domains)
    )


def passed(turn: Turn, answer: AgentAnswer, dataset: FollowupDataset) -> bool:
    if answer.decision != "answered":
        return False
    if turn.documentation:
        cited = {(dataset.corpus.key_of(c.source), c.section) for c in answer.citations}
        if not cited & turn.answer_keys:
            return False
    return not turn.tools or tools_match(turn.tools, answer.tool_calls)


def e2e_row(
    conversation: Conversation,
    index: int,
    condition: str,
    question: str,
    answer: AgentAnswer,
    dataset: FollowupDataset,
    latency_ms: float | None = None,
) -> E2ERow:
    return E2ERow(
        conversation.id,
        index + 1,
        condition,
        question,
        passed(conversation.turns[index], answer, dataset),
        answer.decision,
        tuple(f"{c.source} > {c.section}" for c in answer.citations),
        tuple(f"{t.name}{json.dumps(t.arguments)}" for t in answer.tool_calls),
        tuple(answer.notes),
        latency_ms,
    )


async def run_conversation(
    agent: Agent, conversation: Conversation, condition: str, dataset: FollowupDataset
) -> list[E2ERow]:
    user = user_of(conversation.caller)
    earlier: list[PriorTurn] = []
    rows: list[E2ERow] = []
    for index, turn in enumerate(conversation.turns):
        question = turn.question
        if condition == "standalone" and index > 0 and turn.standalone:
            question = turn.standalone
        answer = await agent.answer(question, user, earlier=earlier)
        if index > 0:
            rows.append(e2e_row(conversation, index, condition, question, answer, dataset))
        earlier.append(prior_turn(question, answer.answer, answer.tool_calls))
    return rows


AgentFactory = Callable[[QueryRewriter], Agent]


async def run_e2e(
    dataset: FollowupDataset, make_agent: AgentFactory, conditions: Sequence[str] = CONDITIONS
) -> list[E2ERow]:
    rows: list[E2ERow] = []
    for condition in conditions:
        rewriter = PassThroughRewriter() if condition == "raw" else DeterministicRewriter()
        agent = make_agent(rewriter)
        for conversation in dataset.conversations:
            rows.extend(await run_conversation(agent, conversation, condition, dataset))
    return rows


def in_process_tools(
    world: World, retriever: Retriever | None, clock: FixedClock
) -> tuple[Callable[[QueryRewriter], Agent], httpx.AsyncClient]:
    """An agent factory over the simulators in process (ASGI) and ``retriever``; the client
    to close when done."""
    from serve_app.authz import load_authorizer

    client = httpx.AsyncClient(
        mounts={
            TWIN_URL: httpx.ASGITransport(app=create_twin_app(world, clock=clock)),
            SENSOR_URL: httpx.ASGITransport(app=create_sensor_app(world, clock=clock)),
        },
        follow_redirects=False,
    )
    downstream = Downstream(twin_url=TWIN_URL, sensor_url=SENSOR_URL, client=client)
    tools = LocalToolExecutor(
        build_default_registry(timeout_seconds=30.0),
        downstream=downstream,
        authorizer=load_authorizer(),
        retriever=retriever,
        clock=clock,
    )

    def make(rewriter: QueryRewriter) -> Agent:
        strategy = SmallModelStrategy(compose=True, rewriter=rewriter)
        return Agent(llm=faithful_model(), tools=tools, strategy=strategy)

    return make, client


# --- end to end over HTTP, against a running service (--service) ------------------------------

SERVICE_CONDITIONS = ("threaded", "standalone")
HTTP_TIMEOUT_SECONDS = 200.0  # above the service's own /ask deadline (ASK_TIMEOUT_SECONDS, 170)
TOKEN_TTL_SECONDS = 6 * 3600
WARM_UP_QUESTION = "What is CrowdVision?"  # not in the set; its answer is not scored


@dataclass(frozen=True)
class Asked:
    answer: AgentAnswer | None  # None: no answer (``error`` says why)
    conversation_id: str | None
    latency_ms: float
    error: str | None = None


@dataclass
class Service:
    """``POST /ask`` on a running service as the dataset's callers."""

    client: httpx.AsyncClient
    base_url: str
    secret: str  # the service's EVAL_JWT_SECRET
    model: str | None = None  # the per-request override (None: the service's ANSWER_MODEL)
    tokens: dict[str, str] = field(default_factory=dict)
    models: dict[str, int] = field(default_factory=dict)  # who answered, how often
    calls: int = 0

    def token(self, caller: Caller) -> str:
        if caller.name not in self.tokens:
            self.tokens[caller.name] = mint_eval_token(
                self.secret,
                f"bench-{caller.name}",
                caller.roles,
                caller.domains,
                ttl=TOKEN_TTL_SECONDS,
            )
        return self.tokens[caller.name]

    async def ask(self, caller: Caller, question: str, conversation_id: str | None = None) -> Asked:
        body: dict[str, Any] = {"question": question}
        if conversation_id is not None:
            body["conversation_id"] = conversation_id
        if self.model:
            body["model"] = self.model
        headers = {"authorization": f"Bearer {self.token(caller)}"}
        self.calls += 1
        started = time.perf_counter()
        try:
            resp = await self.client.post(f"{self.base_url}/ask", json=body, headers=headers)
        except httpx.HTTPError as exc:
            elapsed = (time.perf_counter() - started) * 1000
            return Asked(None, None, elapsed, f"request failed: {type(exc).__name__}")
        elapsed = (time.perf_counter() - started) * 1000
        text = " ".join(resp.text.split())[:300]
        if resp.status_code >= 400:
            return Asked(None, None, elapsed, f"HTTP {resp.status_code}: {text}")
        try:
            data = resp.json()
            answer = AgentAnswer.model_validate(data)
        except (ValueError, ValidationError):
            return Asked(None, None, elapsed, f"HTTP {resp.status_code}, not an answer: {text}")
        self.models[answer.model] = self.models.get(answer.model, 0) + 1
        thread = data.get("conversation_id")
        return Asked(answer, thread if isinstance(thread, str) else None, elapsed)


def asked_row(
    conversation: Conversation,
    index: int,
    condition: str,
    question: str,
    asked: Asked,
    dataset: FollowupDataset,
) -> E2ERow:
    if asked.answer is None:
        notes = (asked.error or "no answer",)
        return E2ERow(
            conversation.id,
            index + 1,
            condition,
            question,
            False,
            "error",
            (),
            (),
            notes,
            asked.latency_ms,
        )
    return e2e_row(
        conversation, index, condition, question, asked.answer, dataset, asked.latency_ms
    )


def _log(row: E2ERow) -> None:
    seconds = f"{row.latency_ms / 1000:.1f} s" if row.latency_ms is not None else "-"
    verdict = "PASS" if row.passed else "fail"
    print(
        f"  {row.conversation} turn {row.turn} {row.condition}: {verdict} ({row.decision}) "
        f"{seconds}",
        file=sys.stderr,
        flush=True,
    )


async def run_service_conversation(
    service: Service, conversation: Conversation, dataset: FollowupDataset, first: list[float]
) -> list[E2ERow]:
    """``threaded`` then ``standalone``; ``first``: the latency of turn 1 is appended."""
    rows: list[E2ERow] = []
    thread: str | None = None
    caller = conversation.caller
    for index, turn in enumerate(conversation.turns):
        if index > 0 and thread is None:
            note = "not asked: turn 1 started no conversation (no conversation_id)"
            rows.append(
                E2ERow(
                    conversation.id,
                    index + 1,
                    "threaded",
                    turn.question,
                    False,
                    "error",
                    (),
                    (),
                    (note,),
                )
            )
            continue
        asked = await service.ask(caller, turn.question, thread)
        if index == 0:
            thread = asked.conversation_id
            first.append(asked.latency_ms)
            continue
        rows.append(asked_row(conversation, index, "threaded", turn.question, asked, dataset))
    for index in range(1, len(conversation.turns)):
        question = conversation.turns[index].standalone or conversation.turns[index].question
        asked = await service.ask(caller, question)
        rows.append(asked_row(conversation, index, "standalone", question, asked, dataset))
    for row in rows:
        _log(row)
    return rows


def interleaved(conversations: Sequence[Conversation]) -> list[Conversation]:
    """The conversations with their kinds spread evenly (the n-th of a kind of size m at
    (n + 0.5) / m), so that a partial run holds documentation and live data in proportion."""
    groups: dict[str, list[Conversation]] = {}
    for conversation in conversations:
        groups.setdefault(conversation.kind, []).append(conversation)
    placed = [((n + 0.5) / len(g), c) for g in groups.values() for n, c in enumerate(g)]
    return [c for _, c in sorted(placed, key=lambda pair: pair[0])]


async def run_service(
    dataset: FollowupDataset,
    base_url: str,
    secret: str,
    *,
    model: str | None = None,
    budget_seconds: float | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Report:
    """Every conversation over HTTP (see the module docstring); ``transport``: tests."""
    from evals.runner import check_service

    base_url = base_url.rstrip("/")
    report = Report(dataset, [], e2e_model="over HTTP against the service")
    timeout = httpx.Timeout(HTTP_TIMEOUT_SECONDS, connect=10.0)
    async with httpx.AsyncClient(timeout=timeout, transport=transport) as client:
        await check_service(client, base_url)
        service = Service(client, base_url, secret, model)
        begun = time.perf_counter()  # the budget counts the warm-up ask too
        warm = await service.ask(dataset.conversations[0].caller, WARM_UP_QUESTION)
        print(f"warm-up ask: {warm.latency_ms / 1000:.1f} s", file=sys.stderr, flush=True)
        service.models.clear()
        service.calls = 0
        started = time.perf_counter()
        ran = 0
        for conversation in interleaved(dataset.conversations):
            if budget_seconds is not None and time.perf_counter() - begun > budget_seconds:
                break
            report.e2e += await run_service_conversation(
                service, conversation, dataset, report.first_turn_ms
            )
            ran += 1
        elapsed = time.perf_counter() - started
    total = len(dataset.conversations)
    report.e2e_model = "over HTTP, " + (
        ", ".join(f"{m} ({n} asks)" for m, n in service.models.items()) or "no answers"
    )
    report.context.update(
        {
            "service": base_url,
            "model": report.e2e_model,
            "conversations run": f"{ran} of {total}"
            + ("" if ran == total else " (PARTIAL: the budget ran out)"),
            "asks": f"{service.calls} in {elapsed:.0f} s "
            f"(a warm-up ask first, {warm.latency_ms / 1000:.1f} s, not counted)",
            "first turns": f"p50 {_seconds(report.first_turn_ms, 50)}, "
            f"p95 {_seconds(report.first_turn_ms, 95)}",
        }
    )
    return report


# --- the report ---------------------------------------------------------------------------------


@dataclass
class Report:
    dataset: FollowupDataset
    retrieval: list[RetrievalRow]
    e2e: list[E2ERow] = field(default_factory=list)
    context: dict[str, str] = field(default_factory=dict)
    e2e_model: str = "scripted (faithful) model"
    first_turn_ms: list[float] = field(default_factory=list)  # over HTTP: turn 1's latency


def _mean(values: Sequence[float]) -> str:
    return f"{statistics.fmean(values):.3f}" if values else "-"


def _rate(values: Sequence[bool]) -> str:
    return f"{sum(values)}/{len(values)} ({sum(values) / len(values):.0%})" if values else "-"


def _percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest rank (``q`` in 0..100)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def _seconds(values_ms: Sequence[float], q: float) -> str:
    value = _percentile(values_ms, q)
    return f"{value / 1000:.1f} s" if value is not None else "-"


def summary_markdown(report: Report) -> str:
    docs = [r for r in report.retrieval if r.recall["raw"] is not None]
    live = [r for r in report.retrieval if r.resolved["raw"] is not None]
    lines = [report.dataset.split_line(), "", f"{len(report.dataset.conversations)} conversations"]
    if report.retrieval:
        lines[2] += (
            f", {len(report.retrieval)} follow-ups ({len(docs)} documentation, "
            f"{len(live)} with live-data entities)"
        )
        lines += [
            "",
            f"| query | recall@{K} (documentation) | hit@{K} | entities resolved (live data) |",
            "|---|---|---|---|",
        ]
    for condition in CONDITIONS if report.retrieval else ():
        recalls = [r.recall[condition] for r in docs]
        values = [v for v in recalls if v is not None]
        hits = [v > 0 for v in values]
        resolved = [bool(r.resolved[condition]) for r in live]
        lines.append(f"| {condition} | {_mean(values)} | {_rate(hits)} | {_rate(resolved)} |")
    if report.e2e:
        timed = any(r.latency_ms is not None for r in report.e2e)
        lines += [
            "",
            f"End to end, {report.e2e_model}: follow-up turns passed",
            "",
            "| condition | all | documentation | live data |" + (" p50 | p95 |" if timed else ""),
            "|---|---|---|---|" + ("---|---|" if timed else ""),
        ]
        kinds = {
            (c.id, i + 1): ("documentation" if t.documentation else "live data")
            for c in report.dataset.conversations
            for i, t in enumerate(c.turns)
        }
        for condition in dict.fromkeys(r.condition for r in report.e2e):
            rows = [r for r in report.e2e if r.condition == condition]
            by_kind = {
                kind: [r.passed for r in rows if kinds[(r.conversation, r.turn)] == kind]
                for kind in ("documentation", "live data")
            }
            line = (
                f"| {condition} | {_rate([r.passed for r in rows])} | "
                f"{_rate(by_kind['documentation'])} | {_rate(by_kind['live data'])} |"
            )
            if timed:
                ms = [r.latency_ms for r in rows if r.latency_ms is not None]
                line += f" {_seconds(ms, 50)} | {_seconds(ms, 95)} |"
            lines.append(line)
    return "\n".join(lines)


def report_markdown(report: Report) -> str:
    lines = ["# Follow-up benchmark", ""]
    lines += [f"- {key}: {value}" for key, value in report.context.items()]
    lines += ["", summary_markdown(report), "", "## Every follow-up", ""]
    e2e = {(r.conversation, r.turn, r.condition): r for r in report.e2e}
    for row in report.retrieval:
        lines.append(f"### {row.conversation}, turn {row.turn} ({row.rule})")
        for condition in CONDITIONS:
            recall = row.recall[condition]
            resolved = row.resolved[condition]
            figures = [f"recall@{K} {recall:.2f}" if recall is not None else ""]
            figures.append(f"resolved {resolved}" if resolved is not None else "")
            run = e2e.get((row.conversation, row.turn, condition))
            if run is not None:
                figures.append(f"e2e {'PASS' if run.passed else 'fail'} ({run.decision})")
            shown = ", ".join(f for f in figures if f)
            lines.append(f"- {condition}: `{row.queries[condition]}` {shown}")
        lines.append("")
    if not report.retrieval:  # over HTTP: the runs alone
        for run in report.e2e:
            seconds = f", {run.latency_ms / 1000:.1f} s" if run.latency_ms is not None else ""
            lines.append(
                f"- {run.conversation}, turn {run.turn}, {run.condition}: `{run.question}` "
                f"{'PASS' if run.passed else 'fail'} ({run.decision}{seconds}); cited "
                f"{list(run.cited)}; tools {list(run.tools)}; notes {list(run.notes)}"
            )
    return "\n".join(lines)


def report_jsonl(report: Report) -> str:
    out = [json.dumps({"kind": "retrieval", **row.__dict__}) for row in report.retrieval]
    out += [json.dumps({"kind": "e2e", **row.__dict__}) for row in report.e2e]
    out += [json.dumps({"kind": "first_turn", "latency_ms": ms}) for ms in report.first_turn_ms]
    return "\n".join(out) + "\n"


# --- running ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    datasets: tuple[Path, ...] = tuple(ROOT / path for path in DEFAULT_FOLLOWUPS_DATASETS)
    out_dir: Path = DEFAULT_OUT_DIR
    database: str = "retrieval_quality"
    e2e: bool = True
    service: str | None = None  # a running service's base URL: end to end over HTTP only
    model: str | None = None  # with ``service``: the per-request model override
    budget_minutes: float | None = None  # with ``service``
    split: SplitChoice = DEFAULT_SPLIT  # dev (the default), test (the run of record) or all
    worlds: tuple[str, ...] = ()  # only these worlds' conversations (none: every world)

    def load(self) -> FollowupDataset:
        return load_followup_sets(
            self.datasets, split=self.split, worlds=self.worlds, repo_root=ROOT
        )


async def run_benchmark(options: Options) -> Report:
    from bench.retrieval_quality import open_sample_store
    from foundation.settings import load_settings
    from retrieval.embedders import build_embedder
    from retrieval.rerankers import build_reranker
    from serve_app.wiring import build_retriever, embedder_config, reranker_config

    settings = load_settings()
    dataset = options.load()
    world = build_world()
    embedder = build_embedder(embedder_config(settings))
    reranker = build_reranker(reranker_config(settings))
    store, ingest = await open_sample_store(settings, options.database, embedder)
    client: httpx.AsyncClient | None = None
    try:
        retriever = build_retriever(settings, store, embedder=embedder, reranker=reranker)
        started = time.perf_counter()
        report = Report(dataset, await score_retrieval(dataset, retriever, world))
        print(f"retrieval: {time.perf_counter() - started:.1f} s", file=sys.stderr)
        if options.e2e:
            make, client = in_process_tools(world, retriever, FixedClock(PINNED))
            started = time.perf_counter()
            report.e2e = await run_e2e(dataset, make)
            print(f"end to end: {time.perf_counter() - started:.1f} s", file=sys.stderr)
        pages, chunks = await store.counts()
        report.context.update(
            {
                "date": date.today().isoformat(),
                "command": "python -m bench.followups " + " ".join(sys.argv[1:]),
                "conversations": dataset.split_line(),
                "corpus": f"{pages} pages, {chunks} chunks (ingest: {ingest.new} new, "
                f"{ingest.unchanged} unchanged)",
                "retriever": f"hybrid, RERANKER={settings.retrieval.reranker}, top {K}, "
                f"embedder {settings.embedding.model}",
                "model (end to end)": "scripted: cites every chunk it is shown "
                "(json_schema mode, plan first, composed live answers)",
            }
        )
    finally:
        if client is not None:
            await client.aclose()
        await store.close()
    return report


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.followups",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--dataset",
        type=Path,
        action="append",
        help="a conversations file (repeatable; default followups.yaml and test-followups.yaml)",
    )
    parser.add_argument(
        "--split",
        choices=SPLIT_CHOICES,
        default=DEFAULT_SPLIT,
        help="dev (default: may be fitted on), test (frozen: the run of record) or all",
    )
    parser.add_argument(
        "--world",
        action="append",
        default=[],
        help="only this world's conversations (repeatable; default every world)",
    )
    parser.add_argument("--out-dir", type=Path, default=Options.out_dir)
    parser.add_argument("--database", default=Options.database)
    parser.add_argument("--no-e2e", action="store_true", help="retrieval only")
    parser.add_argument(
        "--service",
        metavar="URL",
        help="end to end over HTTP against this running service (needs its EVAL_JWT_SECRET); "
        "no retrieval part",
    )
    parser.add_argument("--model", help="with --service: the per-request model override")
    parser.add_argument(
        "--budget-minutes",
        type=float,
        help="with --service: start no new conversation after this long (a partial report)",
    )
    args = parser.parse_args(argv)
    return Options(
        tuple(args.dataset) if args.dataset else Options.datasets,
        args.out_dir,
        args.database,
        not args.no_e2e,
        args.service,
        args.model,
        args.budget_minutes,
        args.split,
        tuple(w.strip() for item in args.world for w in item.split(",") if w.strip()),
    )


async def run_service_benchmark(options: Options) -> Report:
    from evals.runner import eval_secret
    from foundation.settings import load_settings
    from serve_app.wiring import eval_config

    assert options.service is not None
    dataset = options.load()
    secret = eval_secret(eval_config(load_settings()))
    budget = options.budget_minutes * 60 if options.budget_minutes is not None else None
    report = await run_service(
        dataset, options.service, secret, model=options.model, budget_seconds=budget
    )
    git = ["git", "rev-parse", "--short", "HEAD"]
    done = await asyncio.to_thread(subprocess.run, git, cwd=ROOT, capture_output=True, text=True)
    commit = done.stdout.strip()
    report.context = {
        "date": date.today().isoformat(),
        "commit": commit or "-",
        "command": "python -m bench.followups " + " ".join(sys.argv[1:]),
        "conversations": dataset.split_line(),
        **report.context,
    }
    return report


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    options = parse_args(argv)
    from evals.runner import EvalConfigError

    try:
        run = run_service_benchmark if options.service else run_benchmark
        report = asyncio.run(run(options))
    except DatasetError as exc:
        print("invalid dataset:\n  " + "\n  ".join(exc.problems), file=sys.stderr)
        return 2
    except EvalConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    print(summary_markdown(report))
    options.out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (
        ("report.md", report_markdown(report)),
        ("report.jsonl", report_jsonl(report)),
    ):
        (options.out_dir / name).write_text(text, encoding="utf-8")
        print(f"wrote {options.out_dir / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
