"""Run a dataset against the running service over HTTP and score every row.

Each row is one ``POST {base_url}/ask`` with an eval token minted for the row's ``as``
(HS256, ``EVAL_JWT_SECRET``), at most ``concurrency`` at a time; once every row is answered,
the judge (if any) grades the judged ones, so its calls never queue with the service's and
the latencies are the service's alone. Row status:

* ``PASS``    every expectation the row declares was checked and held;
* ``PARTIAL`` every checked expectation held, but some could not be checked (a judge-graded
  ``rubric`` without a judge): not a pass, not a failure, counted apart;
* ``FAIL``    a checked expectation did not hold;
* ``XFAIL``   one did not, on a row whose ``xfail`` marker names the model under eval;
* ``XPASS``   such a row passed, fully checked: its marker is stale (fails only with --strict);
* ``ERROR``   nothing to score: transport failure, timeout, an error envelope, or an answer
  that came with an error status (a 504). Never hidden by an ``xfail`` marker: a timeout
  says nothing about the model's behaviour.

Exit codes (``exit_code``): 0 every non-xfail row passed, 1 otherwise; usage, config and
dataset problems raise ``EvalConfigError``/``DatasetError`` (the CLI's exit 2).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from agent.answer import AgentAnswer
from evals.assertions import AssertionResult, score_row
from evals.dataset import Case, Dataset, Identity, Row, XFail
from evals.judge import Judge, JudgeOutcome, JudgeStats, Verdict, same_family
from foundation.eval_tokens import mint_eval_token

READY_TIMEOUT_SECONDS = 10.0
TOKEN_TTL_SECONDS = 6 * 3600
MAX_EVIDENCE_BODY = 300


class EvalConfigError(RuntimeError):
    """The run cannot start or cannot mean anything (no secret, service unreachable, token
    refused). The CLI prints it and exits 2."""


@dataclass(frozen=True)
class EvalConfig:
    """What an eval run takes of the service's settings (``serve_app.wiring.eval_config``).
    Picklable: a sweep's Ray tasks get it."""

    # The running service (http://SERVE_HOST:SERVE_PORT/API_PREFIX); --base-url overrides it.
    base_url: str = "http://127.0.0.1:8000"
    eval_secret: str | None = field(default=None, repr=False)  # EVAL_JWT_SECRET: signs tokens
    answer_model: str = "openai/gpt-4o-mini"  # ANSWER_MODEL: the model rows are asked of
    ask_timeout_seconds: float = 170.0  # ASK_TIMEOUT_SECONDS: a request may take 15 s more
    ray_address: str | None = None  # RAY_ADDRESS: the Ray a sweep runs on (unset: a private one)


class Status(StrEnum):
    PASS = "PASS"
    PARTIAL = "PARTIAL"
    FAIL = "FAIL"
    XFAIL = "XFAIL"
    XPASS = "XPASS"
    ERROR = "ERROR"


@dataclass
class RowResult:
    id: str
    file: str
    question: str
    status: Status
    assertions: list[AssertionResult] = field(default_factory=list)
    xfail: str | None = None  # the reason, only when the marker applies to this row's model
    xfail_models: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    latency_ms: float | None = None
    http_status: int | None = None
    answer: str | None = None
    decision: str | None = None
    model: str | None = None
    # Who wrote the answer: "model" or "service" (``AgentAnswer.answered_by``); None: no answer.
    answered_by: str | None = None
    trace_id: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None  # the provider's figure when reported, else the estimate
    error: str | None = None  # ERROR rows: what went wrong
    response: dict[str, Any] | None = None  # the /ask body as received (responses.jsonl)
    verdicts: dict[str, dict[str, Any]] | None = None  # judge verdicts by assertion name
    split: str | None = None  # dev or test (None: a saved row not matched to the dataset)
    world: str | None = None  # the world the row is asked in (its world:<name> tag)

    @property
    def failed_assertions(self) -> list[AssertionResult]:
        return [a for a in self.assertions if a.failed]

    @property
    def skipped_assertions(self) -> list[AssertionResult]:
        return [a for a in self.assertions if a.skipped]


def _percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class EvalRun:
    base_url: str
    dataset: str
    model: str | None  # the requested override (None: the service's ANSWER_MODEL)
    judge_model: str | None
    started_at: datetime
    finished_at: datetime
    results: list[RowResult]
    judge: JudgeStats | None = None
    warnings: list[str] = field(default_factory=list)
    strict: bool = False
    rescored_from: str | None = None  # saved answers scored again: not a fresh run
    split: str | None = None  # the split selected: dev, test or all (None: not recorded)
    files: tuple[str, ...] = ()  # the dataset files the rows were selected from
    rows_in_files: int | None = None  # rows those files hold before any selection
    worlds: tuple[str, ...] = ()  # the worlds selected (none: every world of the files)

    @property
    def fully_passed(self) -> int:
        """Rows whose every declared expectation was checked and held (PASS and XPASS)."""
        counts = self.counts
        return counts[Status.PASS] + counts[Status.XPASS]

    @property
    def counts(self) -> dict[Status, int]:
        counted = Counter(r.status for r in self.results)
        return {status: counted.get(status, 0) for status in Status}

    @property
    def total(self) -> int:
        return len(self.results)

    @property
    def pass_rate(self) -> float:
        """Fully passed rows over all rows: ERROR, XFAIL and PARTIAL rows are in the
        denominator, never in the numerator."""
        return self.fully_passed / self.total if self.total else 0.0

    @property
    def answer_models(self) -> list[str]:
        return sorted({r.model for r in self.results if r.model})

    @property
    def label(self) -> str:
        """The model this run measured."""
        return self.model or ", ".join(self.answer_models) or "(service default)"

    @property
    def latencies_ms(self) -> list[float]:
        return [r.latency_ms for r in self.results if r.latency_ms is not None]

    @property
    def p50_ms(self) -> float | None:
        return _percentile(self.latencies_ms, 50)

    @property
    def p95_ms(self) -> float | None:
        return _percentile(self.latencies_ms, 95)

    @property
    def input_tokens(self) -> int:
        return sum(r.input_tokens for r in self.results)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.results)

    @property
    def cost_usd(self) -> float | None:
        """Answer cost of the whole run; None when no row reported one."""
        costs = [r.cost_usd for r in self.results if r.cost_usd is not None]
        return round(sum(costs), 10) if costs else None

    @property
    def cost_complete(self) -> bool:
        """Every answered row had a cost (else ``cost_usd`` understates)."""
        return all(r.cost_usd is not None for r in self.results if r.answer is not None)

    @property
    def duration_s(self) -> float:
        return (self.finished_at - self.started_at).total_seconds()


def exit_code(run: EvalRun, *, strict: bool = False) -> int:
    """0 when every non-xfail row passed (XPASS fails only under ``strict``), else 1."""
    counts = run.counts
    if counts[Status.FAIL] or counts[Status.ERROR]:
        return 1
    if strict and counts[Status.XPASS]:
        return 1
    return 0


# --- running --------------------------------------------------------------------------------


class _TokenRefused(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def eval_secret(config: EvalConfig) -> str:
    """EVAL_JWT_SECRET, or ``EvalConfigError`` saying it is needed."""
    secret = (config.eval_secret or "").strip()
    if not secret:
        raise EvalConfigError(
            "EVAL_JWT_SECRET is not set: the eval runner signs its own HS256 tokens with it "
            "(set it to the running service's EVAL_JWT_SECRET)"
        )
    return secret


async def check_service(client: httpx.AsyncClient, base_url: str) -> None:
    """Fail fast (``EvalConfigError``) when nothing answers at ``base_url`` or it reports
    not ready; a server without ``/readyz`` is given the benefit of the doubt."""
    url = f"{base_url}/readyz"
    try:
        resp = await client.get(url, timeout=READY_TIMEOUT_SECONDS)
    except httpx.HTTPError as exc:
        raise EvalConfigError(
            f"could not reach the service at {base_url} ({type(exc).__name__}); is it running? "
            "(start it with `agent-service serve`, or pass --base-url)"
        ) from None
    if resp.status_code == 503:
        failing = _failing_checks(resp)
        raise EvalConfigError(f"the service at {base_url} is not ready: {failing}")


def _failing_checks(resp: httpx.Response) -> str:
    try:
        checks = resp.json().get("checks", [])
        bad = [f"{c.get('name')}: {c.get('detail') or 'failing'}" for c in checks if not c["ok"]]
    except (ValueError, AttributeError, KeyError, TypeError):
        bad = []
    return "; ".join(bad) or _clip(resp.text)


def _clip(text: str, limit: int = MAX_EVIDENCE_BODY) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _row_cost(answer: AgentAnswer) -> float | None:
    if answer.cost.provider_usd is not None:
        return answer.cost.provider_usd
    return answer.cost.estimated_usd


# The notes the service writes when its own text is the answer (``agent.finishing``): how a
# body without ``answered_by`` says who wrote it.
_SERVICE_NOTES = (
    "answer composed by the service",
    "answer replaced by IDK",
    "the model returned an empty answer",
)


def legacy_answered_by(response: Mapping[str, Any]) -> str:
    """Who wrote an ``/ask`` body that does not say (``answered_by``), from what
    the body says of itself: ``service`` for a provider error, an exhausted tool loop, or a
    note the service writes when its text is the answer (composed; the IDK answer in place of
    an ungrounded or empty reply); else ``model``."""
    if response.get("decision") in ("provider_error", "tool_loop_exhausted"):
        return "service"
    notes = response.get("notes") or []
    for note in notes if isinstance(notes, list) else []:
        if str(note).startswith(_SERVICE_NOTES):
            return "service"
    return "model"


def parse_answer(response: Any) -> AgentAnswer:
    """An ``/ask`` body (received, or saved in responses.jsonl) as an ``AgentAnswer``; a body
    without ``answered_by`` (saved before it existed, or from an older service) gets it from
    ``legacy_answered_by``."""
    if isinstance(response, Mapping) and "answered_by" not in response:
        response = {**response, "answered_by": legacy_answered_by(response)}
    return AgentAnswer.model_validate(response)


def row_status(assertions: Sequence[AssertionResult], xfail: XFail | None) -> Status:
    """A failure is proven by one failed check; a pass needs every check to have run."""
    if any(a.failed for a in assertions):
        return Status.XFAIL if xfail is not None else Status.FAIL
    if any(a.skipped for a in assertions):
        return Status.PARTIAL
    return Status.XPASS if xfail is not None else Status.PASS


def answer_error(row: Row, http_status: int, answer: AgentAnswer) -> str | None:
    """Why a full answer is not scored: it came with an error status (the service's 504
    timeout, a provider's 502/503) on a row that does not expect ``provider_error``."""
    if http_status < 400 or row.decision == "provider_error":
        return None
    detail = f"{answer.error.code}: {answer.error.message}" if answer.error else answer.decision
    return f"HTTP {http_status}: {_clip(detail)}"


def score_answer(
    result: RowResult,
    case: Case,
    answer: AgentAnswer,
    verdicts: Mapping[str, JudgeOutcome] | None,
    eval_model: str | None,
) -> RowResult:
    """Score ``answer`` into ``result``: its status, assertions and applicable xfail. The
    xfail is matched against the model that answered (else the one asked for)."""
    row = case.row
    error = answer_error(row, result.http_status or 200, answer)
    if error is not None:
        result.error, result.status = error, Status.ERROR
        return result
    xfail = row.xfail_for(answer.model or eval_model)
    if xfail is not None:
        result.xfail, result.xfail_models = xfail.reason, list(xfail.models)
    result.assertions = score_row(row, answer, verdicts)
    result.status = row_status(result.assertions, xfail)
    return result


@dataclass
class _Runner:
    base_url: str
    client: httpx.AsyncClient
    secret: str
    model: str | None
    judge: Judge | None
    eval_model: str | None  # the override, else the configured ANSWER_MODEL
    tokens: dict[tuple[str, tuple[str, ...], tuple[str, ...]], str] = field(default_factory=dict)

    def token(self, user: Identity) -> str:
        key = (user.sub, tuple(user.roles), tuple(user.domains))
        if key not in self.tokens:
            self.tokens[key] = mint_eval_token(
                self.secret, user.sub, user.roles, user.domains, ttl=TOKEN_TTL_SECONDS
            )
        return self.tokens[key]

    async def run(self, case: Case) -> RowResult | Asked:
        row = case.row
        result = RowResult(
            id=row.id,
            file=str(case.file),
            question=row.question,
            status=Status.ERROR,
            tags=list(row.tags),
            split=case.split,
            world=case.world,
        )
        body: dict[str, Any] = {"question": row.question}
        if self.model:
            body["model"] = self.model
        headers = {"authorization": f"Bearer {self.token(case.user)}"}
        started = time.perf_counter()
        try:
            resp = await self.client.post(f"{self.base_url}/ask", json=body, headers=headers)
        except httpx.HTTPError as exc:
            result.latency_ms = (time.perf_counter() - started) * 1000
            result.error = f"request failed: {type(exc).__name__}: {_clip(str(exc)) or 'no detail'}"
            return result
        result.latency_ms = (time.perf_counter() - started) * 1000
        result.http_status = resp.status_code
        if resp.status_code == 401:
            raise _TokenRefused(_clip(resp.text))
        try:
            answer = parse_answer(resp.json())
        except (ValueError, ValidationError):
            result.error = f"HTTP {resp.status_code}: {_clip(resp.text) or '(empty body)'}"
            return result
        result.response = resp.json()
        result.answer = answer.answer
        result.decision = answer.decision
        result.model = answer.model
        result.answered_by = answer.answered_by
        result.trace_id = answer.trace_id
        result.input_tokens = answer.usage.input_tokens
        result.output_tokens = answer.usage.output_tokens
        result.cost_usd = _row_cost(answer)
        if self.judge is not None and case.row.judged:
            return Asked(result, answer)  # scored once the judge has graded it
        return score_answer(result, case, answer, None, self.eval_model)

    async def grade(self, case: Case, asked: Asked) -> RowResult:
        """The judge's verdicts on an answered row, then its score."""
        assert self.judge is not None
        verdicts = await self.judge.grade_row(case.row, asked.answer.answer)
        if verdicts is not None:
            asked.result.verdicts = {name: outcome_dict(o) for name, o in verdicts.items()}
        return score_answer(asked.result, case, asked.answer, verdicts, self.eval_model)


@dataclass
class Asked:
    """A row the service answered that waits for the judge."""

    result: RowResult
    answer: AgentAnswer


def outcome_dict(outcome: JudgeOutcome) -> dict[str, Any]:
    verdict = outcome.verdict
    return {
        "pass": verdict.passed if verdict else None,
        "score": verdict.score if verdict else None,
        "reason": verdict.reason if verdict else None,
        "error": outcome.error,
    }


def outcome_from_dict(data: Mapping[str, Any]) -> JudgeOutcome:
    if data.get("pass") is None:
        return JudgeOutcome(verdict=None, error=str(data.get("error") or "no verdict"))
    return JudgeOutcome(
        verdict=Verdict.model_validate(
            {"pass": data["pass"], "score": data["score"], "reason": data["reason"]}
        )
    )


def rescore(dataset: Dataset, saved: EvalRun, source: str = "saved answers") -> EvalRun:
    """Score a previous run's saved responses against ``dataset`` (e.g. after adding xfail
    markers or fixing an expectation) without asking the service again. Rows missing from
    the saved run are ERRORs; judge verdicts are reused as they were given."""
    by_id = {r.id: r for r in saved.results}
    results: list[RowResult] = []
    for case in dataset.cases:
        row = case.row
        old = by_id.get(row.id)
        result = RowResult(
            id=row.id,
            file=str(case.file),
            question=row.question,
            status=Status.ERROR,
            tags=list(row.tags),
            split=case.split,
            world=case.world,
        )
        if old is None or old.response is None:
            result.error = old.error if old is not None else "not in the saved run"
            result.latency_ms = old.latency_ms if old is not None else None
            result.http_status = old.http_status if old is not None else None
            results.append(result)
            continue
        answer = parse_answer(old.response)
        verdicts = (
            {name: outcome_from_dict(v) for name, v in old.verdicts.items()}
            if old.verdicts
            else None
        )
        for key in (
            "latency_ms",
            "http_status",
            "response",
            "verdicts",
            "answer",
            "decision",
            "model",
            "trace_id",
            "input_tokens",
            "output_tokens",
            "cost_usd",
        ):
            setattr(result, key, getattr(old, key))
        result.answered_by = answer.answered_by
        results.append(score_answer(result, case, answer, verdicts, saved.model))
    return dataclasses.replace(
        saved, results=results, rescored_from=source, **selection_of(dataset)
    )


def selection_of(dataset: Dataset) -> dict[str, Any]:
    """What a run records of its dataset's selection (``EvalRun`` fields)."""
    return {
        "split": dataset.split,
        "files": tuple(str(path) for path in dataset.files),
        "rows_in_files": dataset.rows_in_files,
        "worlds": dataset.worlds,
    }


def write_responses(run: EvalRun, path: Path) -> Path:
    """The run as JSON lines: a header, then one line per row with the raw /ask body."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {
        "base_url": run.base_url,
        "dataset": run.dataset,
        "model": run.model,
        "judge_model": run.judge_model,
        "started_at": run.started_at.isoformat(),
        "finished_at": run.finished_at.isoformat(),
        "rescored_from": run.rescored_from,
        "split": run.split,
        "files": list(run.files),
        "rows_in_files": run.rows_in_files,
        "worlds": list(run.worlds),
    }
    lines = [json.dumps({"run": header})]
    for r in run.results:
        lines.append(
            json.dumps(
                {
                    "id": r.id,
                    "latency_ms": r.latency_ms,
                    "http_status": r.http_status,
                    "error": r.error,
                    "response": r.response,
                    "verdicts": r.verdicts,
                },
                ensure_ascii=False,
            )
        )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def read_responses(path: Path) -> EvalRun:
    """A run saved by ``write_responses`` (rows carry responses, not statuses)."""
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    if not lines or "run" not in lines[0]:
        raise EvalConfigError(f"{path}: not a responses.jsonl written by agent-service eval")
    head = lines[0]["run"]
    results = []
    for item in lines[1:]:
        response = item.get("response")
        result = RowResult(
            id=item["id"],
            file="",
            question="",
            status=Status.ERROR,
            latency_ms=item.get("latency_ms"),
            http_status=item.get("http_status"),
            error=item.get("error"),
            response=response,
            verdicts=item.get("verdicts"),
        )
        if response is not None:
            answer = parse_answer(response)
            result.answer, result.decision, result.model = (
                answer.answer,
                answer.decision,
                answer.model,
            )
            result.answered_by = answer.answered_by
            result.trace_id = answer.trace_id
            result.input_tokens = answer.usage.input_tokens
            result.output_tokens = answer.usage.output_tokens
            result.cost_usd = _row_cost(answer)
        results.append(result)
    return EvalRun(
        base_url=head["base_url"],
        dataset=head["dataset"],
        model=head["model"],
        judge_model=head["judge_model"],
        started_at=datetime.fromisoformat(head["started_at"]),
        finished_at=datetime.fromisoformat(head["finished_at"]),
        results=results,
        rescored_from=head.get("rescored_from"),
        split=head.get("split"),
        files=tuple(head.get("files") or ()),
        rows_in_files=head.get("rows_in_files"),
        worlds=tuple(head.get("worlds") or ()),
    )


def loud_warning(console: Console, text: str) -> None:
    """A warning no one scrolls past: a biased judge makes every judged grade suspect."""
    console.print(f"[bold red]WARNING: {text}[/bold red]", highlight=False)


def _progress(console: Console, enabled: bool) -> Progress:
    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        "{task.fields[tally]}",
        console=console,
        transient=False,
        disable=not enabled,
    )


async def run_eval(
    dataset: Dataset,
    base_url: str,
    config: EvalConfig,
    concurrency: int = 4,
    model: str | None = None,
    judge: Judge | None = None,
    *,
    strict: bool = False,
    progress: bool = True,
    console: Console | None = None,
    timeout_seconds: float | None = None,
    check_ready: bool = True,
    transport: httpx.AsyncBaseTransport | None = None,
) -> EvalRun:
    """Ask every row of ``dataset`` and score it (see the module docstring).

    ``model`` is the per-request answer-model override (it needs MODEL_OVERRIDE_MIN_ROLE on
    the server). ``judge`` grades ``rubric`` (and ``declined`` on top of its deterministic
    check); without one a ``rubric`` is reported as not checked and its row as PARTIAL.
    Raises ``EvalConfigError`` before or instead of a meaningless run."""
    if concurrency < 1:
        raise EvalConfigError("--concurrency must be at least 1")
    secret = eval_secret(config)
    base_url = base_url.rstrip("/")
    console = console or Console(file=sys.stderr)
    warnings: list[str] = []
    configured = model or config.answer_model
    early = same_family(judge.model, [configured]) if judge is not None else None
    if early:
        loud_warning(console, early)
    timeout = httpx.Timeout(timeout_seconds or config.ask_timeout_seconds + 15, connect=10.0)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    started_at = datetime.now(UTC)
    # ``transport``: tests hand in an ``httpx.MockTransport`` (no sockets)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, transport=transport) as client:
        if check_ready:
            await check_service(client, base_url)
        runner = _Runner(base_url, client, secret, model, judge, configured)
        semaphore = asyncio.Semaphore(concurrency)
        tally: Counter[Status] = Counter()
        with _progress(console, progress) as bar:
            task = bar.add_task(
                f"eval {dataset.name} ({dataset.split})" + (f" [{model}]" if model else ""),
                total=len(dataset.cases),
                tally="",
            )

            def count(result: RowResult | Asked, bar_task: Any) -> None:
                if isinstance(result, RowResult):
                    tally[result.status] += 1
                text = " ".join(f"{s.value} {n}" for s, n in sorted(tally.items()) if n)
                bar.update(bar_task, advance=1, tally=text)

            async def one(case: Case) -> RowResult | Asked:
                async with semaphore:
                    result = await runner.run(case)
                count(result, task)
                return result

            try:
                async with asyncio.TaskGroup() as group:
                    tasks = [group.create_task(one(case)) for case in dataset.cases]
            except* _TokenRefused as refused:
                message = refused.exceptions[0]
                assert isinstance(message, _TokenRefused)
                raise EvalConfigError(
                    f"the service at {base_url} refused the eval token (HTTP 401: "
                    f"{message.message}); is EVAL_JWT_SECRET the same as the server's?"
                ) from None
            asked = [t.result() for t in tasks]
            # The judge grades once every question is answered: its calls never queue with
            # the service's (a local judge shares the service's model slots), so the
            # latencies measured are the service's alone.
            results: list[RowResult | Asked] = list(asked)
            waiting = [i for i, a in enumerate(asked) if isinstance(a, Asked)]
            if waiting:
                grading = bar.add_task(
                    f"judge {judge.model if judge else ''}", total=len(waiting), tally=""
                )

                async def grade(index: int, pending: Asked) -> None:
                    async with semaphore:
                        results[index] = await runner.grade(dataset.cases[index], pending)
                    count(results[index], grading)

                async with asyncio.TaskGroup() as group:
                    for index in waiting:
                        pending = asked[index]
                        assert isinstance(pending, Asked)
                        group.create_task(grade(index, pending))
    scored = [r for r in results if isinstance(r, RowResult)]
    assert len(scored) == len(results)  # every Asked row was graded
    run = EvalRun(
        base_url=base_url,
        dataset=dataset.name,
        model=model,
        judge_model=judge.model if judge is not None else None,
        started_at=started_at,
        finished_at=datetime.now(UTC),
        results=scored,
        judge=judge.stats if judge is not None else None,
        warnings=warnings,
        strict=strict,
        **selection_of(dataset),
    )
    if judge is not None:
        # what actually answered: the service's replies and the judge's own replies
        judges = {judge.model, *judge.stats.answered_by}
        for judge_model in sorted(judges):
            clash = same_family(judge_model, run.answer_models or [configured])
            if clash and clash not in warnings:
                warnings.append(clash)
                if clash != early:
                    loud_warning(console, clash)
    return run
