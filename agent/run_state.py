"""The mutable state of one question in the agent loop, and the ``AgentAnswer`` built from it
(answered, declined, or ended by a provider error)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

from agent.answer import (
    AgentAnswer,
    AgentError,
    AnsweredBy,
    CitationOut,
    CostOut,
    Decision,
    DoneEvent,
    HopUsageOut,
    RetrievalOut,
    ToolCallTrace,
    UsageOut,
)
from agent.citations import ChunkInfo, Citation
from agent.grounding import Evidence, build_evidence
from agent.llm.base import ChatResult, LLMError, MalformedReply, Message, ProviderRejected
from agent.tools.base import ChunkSink
from agent.tools.executor import ToolRequest
from agent.tools.registry import ToolOutcome
from agent.usage import RunUsage
from foundation.records import EntityRefOut

PROVIDER_UNAVAILABLE_TEXT = (
    "The assistant is temporarily unavailable: the language model did not respond. "
    "Please try again in a moment."
)
PROVIDER_REJECTED_TEXT = (
    "The assistant could not get an answer from the language model. Please try again later."
)
MALFORMED_TEXT = "The assistant could not understand the language model's reply. Please try again."


def citation_out(citation: Citation) -> CitationOut:
    return CitationOut(
        chunk_id=citation.chunk_id,
        source=citation.source,
        section=citation.section,
        snippet=citation.snippet,
    )


def tool_trace(outcome: ToolOutcome) -> ToolCallTrace:
    return ToolCallTrace(
        name=outcome.name,
        arguments=outcome.arguments,
        ok=outcome.ok,
        error=outcome.error,
        duration_ms=outcome.duration_ms,
        entities=tuple(EntityRefOut(kind=kind, id=i) for kind, i in outcome.entities),
    )


@dataclass
class Run:
    """The mutable state of one question."""

    request: ToolRequest
    model: str
    usage: RunUsage
    # This turn's question as asked, and the conversation's earlier questions: the user's own
    # figures. Not "the user messages": the service's repair notes are user turns too, and
    # they quote the very figures a rejected answer invented.
    question: str
    earlier_questions: tuple[str, ...] = ()
    messages: list[Message] = field(default_factory=list)
    traces: list[ToolCallTrace] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    malformed: int = 0
    seen_chunks: ChunkSink = field(default_factory=ChunkSink)
    trace_id: str | None = None
    ungrounded: list[str] = field(default_factory=list)  # claims a rejected answer made
    asked_at: float = field(default_factory=time.time)  # wall clock: it crosses processes

    def retrieved(self) -> dict[str, ChunkInfo]:
        return {
            hit.chunk_id: ChunkInfo(hit.source, hit.section, hit.text) for hit in self.seen_chunks
        }

    def evidence(self) -> Evidence:
        """What this run's answer may draw on: the conversation's questions (the user's own
        figures), every tool call's arguments and result, and the full text of every chunk
        retrieved."""
        texts = [self.question, *self.earlier_questions]
        for message in self.messages:
            if message.role == "tool":
                texts.append(message.content or "")
            texts.extend(call.arguments for call in message.tool_calls)
        texts.extend(hit.text for hit in self.seen_chunks)
        return build_evidence(texts)

    def declined(self, text: str, result: ChatResult) -> AgentAnswer:
        if self.traces:
            self.notes.append(f"declined after {len(self.traces)} tool call(s)")
        if result.reason:
            self.notes.append(f"model reason: {result.reason[:200]}")
        # The model's decline, whether it wrote it (native) or the service spells it.
        return self.response(text, "declined_out_of_scope", by="model")

    def provider_error(self, error: LLMError) -> DoneEvent:
        code: Literal["provider_unavailable", "provider_rejected", "malformed_reply"]
        if isinstance(error, MalformedReply):
            code, text = "malformed_reply", MALFORMED_TEXT
        elif isinstance(error, ProviderRejected):
            code, text = "provider_rejected", PROVIDER_REJECTED_TEXT
        else:
            code, text = "provider_unavailable", PROVIDER_UNAVAILABLE_TEXT
        response = self.response(text, "provider_error", by="service")
        response.error = AgentError(code=code, message=str(error), status_code=error.status_code)
        return DoneEvent(response=response)

    def response(
        self,
        text: str,
        decision: Decision,
        *,
        by: AnsweredBy,
        idk: bool = False,
        citations: list[CitationOut] | None = None,
        hallucinated: list[str] | None = None,
    ) -> AgentAnswer:
        usage = self.usage.usage_dict()
        cost = self.usage.cost_dict()
        chunk_ids = [hit.chunk_id for hit in self.seen_chunks]
        return AgentAnswer(
            answer=text,
            citations=citations or [],
            tool_calls=list(self.traces),
            usage=UsageOut(
                input_tokens=usage["input_tokens"],
                output_tokens=usage["output_tokens"],
                hops=[HopUsageOut(**hop) for hop in usage["hops"]],
            ),
            cost=CostOut(estimated_usd=cost["estimated_usd"], provider_usd=cost["provider_usd"]),
            idk=idk,
            decision=decision,
            answered_by=by,
            retrieval=RetrievalOut(
                hallucinated_citations=hallucinated or [],
                chunks_seen=len(chunk_ids),
                chunk_ids=chunk_ids,
                ungrounded=list(self.ungrounded),
            ),
            model=self.model,
            trace_id=self.trace_id,
            notes=list(self.notes),
        )
