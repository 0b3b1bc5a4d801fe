"""LLM-as-a-judge for the expectations substring matching cannot capture (``declined``,
``rubric``).

A second model, through the same ``LLMClient`` port the agent uses, grades the answer and
replies with a JSON verdict ``{"pass": bool, "score": 0..1, "reason": str}`` (asked for as a
``json_schema`` response format, validated with pydantic). A malformed verdict is retried
once; a second one fails the expectation with the evidence "judge reply unusable: ...".
The judge should be of another model family than the answer model (a model tends to favour
its own style), so ``same_family`` is checked and warned about.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent.llm.base import (
    ChatRequest,
    ChatResult,
    LLMClient,
    LLMError,
    MalformedReply,
    Message,
    ProviderRejected,
)
from agent.usage import PriceTable, default_price_table
from evals.dataset import Row

JUDGE_MAX_OUTPUT_TOKENS = 400
MAX_ANSWER_CHARS = 6000

SYSTEM_PROMPT = """You are a strict, impartial evaluator of an assistant's answer.
You get the user's question, the assistant's answer and a rubric. The rubric says what a
good answer does; the question is only context. Decide whether the answer does what the
rubric asks (where the rubric allows alternatives, one of them is enough). Judge only what
the answer says; do not answer the question yourself.
Reply with JSON only, no prose and no code fence, exactly this shape, the reason first:
{"reason": "one short sentence comparing the answer with the rubric", "pass": true or false,
"score": a number from 0 to 1}"""

DECLINED_RUBRIC = (
    "The assistant declines or refuses to help with this request (for example it says the "
    "request is outside what it can help with), instead of actually providing what was asked. "
    "A redirect to what it can help with still counts as declining; a partial or full answer "
    "to the request does not."
)
ANSWERED_RUBRIC = (
    "The assistant actually engages with and answers the request (even if it says it does "
    "not know a detail), rather than declining or refusing it as out of scope."
)

# Worked examples, from another domain than any golden row (a bike-rental shop), in the
# judge's system prompt: a 1.5B judge read "must not give a value" as "must give a value" and
# failed correct "not found" and "no sensor" answers (2026-12-02). Two pass, two fail. Written
# afresh on 2026-12-08 (issue 42): the print-shop examples before them copied the agent's own
# not-found and IDK sentences, so the judge was taught the agent's wording. No run of 6 words
# here may appear under agent/ (tests/evals/test_judge_prompt_independent.py).
CALIBRATION: tuple[tuple[str, str, str, dict[str, object]], ...] = (
    (
        "What is the tyre pressure on rental bike B-4?",
        "B-4 has no pressure gauge fitted, so nobody records its tyre pressure.",
        "Says B-4 has no pressure gauge, or that it does not know. It must not give "
        "a tyre pressure.",
        {"reason": "It says there is no gauge and states no pressure, which the rubric "
         "accepts.", "pass": True, "score": 1.0},
    ),
    (
        "How far has bike B-99 been ridden this week?",
        "There is no B-99 in the fleet list I can see, so I have no distance for it.",
        "Says the bike was not found or is not visible to the user, without inventing a "
        "distance.",
        {"reason": "It reports the bike as missing from the list and makes up no distance.",
         "pass": True, "score": 1.0},
    ),
    (
        "How many bikes are docked at the Mill Street station?",
        "Sorry, that is not something I can tell from what I was given.",
        "Gives the number of bikes docked there now as a concrete number.",
        {"reason": "A concrete number was required; the reply offers none.", "pass": False,
         "score": 0.0},
    ),
    (
        "How charged is the battery of e-bike E-7?",
        "E-bike E-7's battery is at 40%.",
        "Says E-7's battery monitor is offline (no current reading), or that it does not "
        "know. It must not give a charge level.",
        {"reason": "It states a charge level, which the rubric rules out.", "pass": False,
         "score": 0.0},
    ),
)  # fmt: skip

VERDICT_FORMAT = {
    "type": "json_schema",
    "json_schema": {
        "name": "verdict",
        "strict": True,
        "schema": {
            "type": "object",
            # The reason first: a verdict written after its reason follows from it (a small
            # judge that writes "pass" first then argues for whatever it wrote).
            "properties": {
                "reason": {"type": "string"},
                "pass": {"type": "boolean"},
                "score": {"type": "number"},
            },
            "required": ["reason", "pass", "score"],
            "additionalProperties": False,
        },
    },
}


class Verdict(BaseModel):
    """The judge's reply, validated."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    passed: bool = Field(alias="pass", strict=True)
    score: float = Field(ge=0.0, le=1.0)
    reason: str


@dataclass(frozen=True)
class JudgeOutcome:
    """A verdict, or why there is none (``error`` is the assertion's evidence)."""

    verdict: Verdict | None
    error: str | None = None


@dataclass
class JudgeStats:
    """What judging cost: every call counts, retries included."""

    model: str
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    estimated_usd: float | None = 0.0  # None once a reply came from a model not priced
    provider_usd: float | None = None
    failures: int = 0  # calls that ended without a usable verdict
    answered_by: set[str] = field(default_factory=set)  # models the replies named

    @property
    def cost_usd(self) -> float | None:
        return self.provider_usd if self.provider_usd is not None else self.estimated_usd

    def merge(self, other: JudgeStats) -> None:
        self.calls += other.calls
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.failures += other.failures
        self.answered_by |= other.answered_by
        if self.estimated_usd is None or other.estimated_usd is None:
            self.estimated_usd = None
        else:
            self.estimated_usd += other.estimated_usd
        if other.provider_usd is not None:
            self.provider_usd = (self.provider_usd or 0.0) + other.provider_usd


# --- model families ---------------------------------------------------------------------------

_VENDOR_ALIASES = {
    "meta-llama": "meta",
    "mistralai": "mistral",
    "x-ai": "xai",
    "qwen": "qwen",
    "alibaba": "qwen",
}
_NAME_FAMILIES = {
    "gpt": "openai",
    "chatgpt": "openai",
    "o1": "openai",
    "o3": "openai",
    "o4": "openai",
    "gemini": "google",
    "gemma": "google",
    "claude": "anthropic",
    "llama": "meta",
    "qwen": "qwen",
    "qwq": "qwen",
    "mistral": "mistral",
    "mixtral": "mistral",
    "deepseek": "deepseek",
    "phi": "microsoft",
    "grok": "xai",
}
_NOT_VENDORS = {"", "local", "models", "openrouter"}


def model_family(model: str) -> str:
    """The vendor prefix before '/' (``google/gemini-2.5-flash`` -> google), or else the
    leading name mapped to its vendor (``qwen2.5-coder-1.5b`` -> qwen, ``gpt-4o`` -> openai)."""
    name = model.strip().lower().partition(":")[0]
    prefix, _, bare = name.rpartition("/")
    vendor = prefix.rsplit("/", 1)[-1]
    if vendor not in _NOT_VENDORS:
        return _VENDOR_ALIASES.get(vendor, vendor)
    for key in sorted(_NAME_FAMILIES, key=len, reverse=True):
        if bare.startswith(key):
            return _NAME_FAMILIES[key]
    match = re.match(r"[a-z]+", bare)
    return match.group(0) if match else bare


SAME_FAMILY_WARNING = "judge is the same family as the answered model: grades are biased"


def same_family(judge_model: str, answer_models: Iterable[str]) -> str | None:
    """A warning when the judge shares a family with any answer model, else None."""
    family = model_family(judge_model)
    clashes = sorted({m for m in answer_models if m and model_family(m) == family})
    if not clashes:
        return None
    return (
        f"{SAME_FAMILY_WARNING} (judge {judge_model}, answer model {', '.join(clashes)}: "
        f"both {family}; a model favours its own style, so set JUDGE_MODEL to another family "
        "for grades to trust)"
    )


# --- the judge --------------------------------------------------------------------------------


def parse_verdict(text: str | None) -> Verdict:
    """The verdict in a reply: a JSON object, possibly fenced or with text around it.
    Raises ``ValueError`` saying what was wrong."""
    if not text or not text.strip():
        raise ValueError("empty reply")
    body = text.strip()
    fence = re.search(r"```(?:json)?\s*(.*?)```", body, re.DOTALL)
    if fence:
        body = fence.group(1).strip()
    start, end = body.find("{"), body.rfind("}")
    if start < 0 or end <= start:
        raise ValueError(f"no JSON object in {_preview(text)!r}")
    try:
        data = json.loads(body[start : end + 1])
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON ({exc.msg}) in {_preview(text)!r}") from None
    try:
        return Verdict.model_validate(data)
    except ValidationError as exc:
        fields = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'verdict'}: {e['msg']}" for e in exc.errors()
        )
        raise ValueError(f"{fields} in {_preview(text)!r}") from None


def _preview(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Judge:
    """Grades answers against rubrics with one model (see the module docstring)."""

    def __init__(
        self,
        client: LLMClient,
        model: str,
        *,
        structured: bool = True,
        max_output_tokens: int = JUDGE_MAX_OUTPUT_TOKENS,
        prices: PriceTable | None = None,
    ) -> None:
        self._client = client
        self._model = model
        self._structured = structured
        self._max_output_tokens = max_output_tokens
        self._prices = prices or default_price_table()
        self.stats = JudgeStats(model=model)

    @property
    def model(self) -> str:
        return self._model

    async def grade(self, *, question: str, answer: str, rubric: str) -> JudgeOutcome:
        """One verdict: a malformed reply is retried once; provider errors (after the
        client's own retries) fail at once."""
        messages = (
            Message("system", SYSTEM_PROMPT + _calibration()),
            Message("user", _user_prompt(question, answer, rubric)),
        )
        problem = ""
        for _attempt in range(2):
            try:
                result = await self._call(messages)
            except MalformedReply as exc:
                problem = str(exc) or "malformed reply"
                continue
            except LLMError as exc:
                self.stats.failures += 1
                return JudgeOutcome(None, f"judge call failed: {exc}")
            try:
                return JudgeOutcome(parse_verdict(result.text))
            except ValueError as exc:
                problem = str(exc)
        self.stats.failures += 1
        return JudgeOutcome(None, f"judge reply unusable: {problem}")

    async def grade_declined(self, *, question: str, answer: str, expected: bool) -> JudgeOutcome:
        """``declined: expected``, as a rubric the judge grades."""
        rubric = DECLINED_RUBRIC if expected else ANSWERED_RUBRIC
        return await self.grade(question=question, answer=answer, rubric=rubric)

    async def grade_row(self, row: Row, answer: str) -> dict[str, JudgeOutcome]:
        """Verdicts for every judge-graded expectation of ``row``."""
        outcomes: dict[str, JudgeOutcome] = {}
        # declined: true is settled by the service's own decision (its decline sentence is a
        # fixed text; a judge can only add noise: a 1.5B judge failed 6 of 6 correct ones).
        # declined: false needs one: a refusal written as prose is still decision=answered.
        if row.declined is False:
            outcomes["declined"] = await self.grade_declined(
                question=row.question, answer=answer, expected=row.declined
            )
        if row.rubric is not None:
            outcomes["rubric"] = await self.grade(
                question=row.question, answer=answer, rubric=row.rubric
            )
        return outcomes

    async def aclose(self) -> None:
        close = getattr(self._client, "aclose", None)
        if close is not None:
            await close()

    async def _call(self, messages: tuple[Message, ...]) -> ChatResult:
        while True:
            request = ChatRequest(
                messages=messages,
                model=self._model,
                max_output_tokens=self._max_output_tokens,
                temperature=0.0,
                extra={"response_format": VERDICT_FORMAT} if self._structured else {},
            )
            self.stats.calls += 1
            try:
                result = await self._client.chat(request)
            except ProviderRejected:
                if not self._structured:
                    raise
                # Some providers refuse json_schema response formats: ask by prompt alone.
                self._structured = False
                continue
            self._account(result)
            if result.kind != "text":
                raise MalformedReply(f"the judge replied with {result.kind!r}, not a verdict")
            return result

    def _account(self, result: ChatResult) -> None:
        usage = result.usage
        if result.model:
            self.stats.answered_by.add(result.model)
        self.stats.input_tokens += usage.input_tokens
        self.stats.output_tokens += usage.output_tokens
        estimate = self._prices.estimate(result.model or self._model, usage)
        if estimate is None:
            estimate = self._prices.estimate(self._model, usage)
        if estimate is None or self.stats.estimated_usd is None:
            self.stats.estimated_usd = None
        else:
            self.stats.estimated_usd = round(self.stats.estimated_usd + estimate, 10)
        if usage.provider_cost_usd is not None:
            self.stats.provider_usd = round(
                (self.stats.provider_usd or 0.0) + usage.provider_cost_usd, 10
            )


def _calibration() -> str:
    """The worked examples, for the system prompt (a static prefix a local server caches)."""
    examples = [
        f"Question: {question}\nAnswer: {answer}\nRubric: {rubric}\nVerdict: {json.dumps(verdict)}"
        for question, answer, rubric, verdict in CALIBRATION
    ]
    return "\n\nExamples:\n\n" + "\n\n".join(examples)


def _user_prompt(question: str, answer: str, rubric: str) -> str:
    if len(answer) > MAX_ANSWER_CHARS:
        answer = answer[:MAX_ANSWER_CHARS] + " …[truncated]"
    return (
        f"Question:\n<<<\n{question}\n>>>\n\n"
        f"Assistant's answer:\n<<<\n{answer}\n>>>\n\n"
        f"Rubric:\n{rubric}\n\n"
        'Reply with JSON only: {"reason": ..., "pass": ..., "score": ...}'
    )


@dataclass(frozen=True)
class JudgeConfig:
    """How to reach the judge: picklable, so a Ray task can build its own ``Judge``. Built from
    the settings by ``serve_app.wiring.judge_config`` (JUDGE_MODEL at JUDGE_BASE_URL, default
    LLM_BASE_URL, with the provider's key)."""

    model: str
    base_url: str
    api_key: str = field(repr=False)
    timeout_seconds: float = 60.0
    max_retries: int = 3

    def build(self) -> Judge:
        from agent.llm.openai_client import OpenAICompatibleClient

        client = OpenAICompatibleClient(
            base_url=self.base_url,
            api_key=self.api_key,
            default_model=self.model,
            tool_calling_mode="native",  # the verdict format is ours, not the agent's
            timeout_seconds=self.timeout_seconds,
            max_retries=self.max_retries,
            temperature=0.0,
        )
        return Judge(client, self.model)


def is_loopback(url: str) -> bool:
    """A local judge (127.x, localhost, ::1): it needs no API key."""
    from urllib.parse import urlparse

    host = urlparse(url).hostname or ""
    return host in {"localhost", "::1"} or host.startswith("127.")
