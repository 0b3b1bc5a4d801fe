"""The end of a run: classify the final reply (answered, idk, declined), validate its
citations, and check that its figures are grounded (``agent.grounding``): an answer with a
number, id or designator that no tool result holds is repaired once (the violation fed back)
or becomes the IDK answer. Kept out of ``agent.loop`` so the loop reads as the loop."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Mapping

from agent.answer import AgentEvent, CitationEvent, CitationOut, Decision, DoneEvent, TokenEvent
from agent.citation_support import check_support
from agent.citations import CitationResult, extract_citations
from agent.grounding import Evidence, ungrounded, unsupported_states
from agent.instrumented import RunTrace, model_call
from agent.llm.base import ChatRequest, ChatResult, LLMClient, LLMError, Message
from agent.prompts import DECLINE_TEXT, IDK_MARKER, is_idk, is_refusal
from agent.run_state import Run, citation_out

__all__ = ["Finisher"]

log = logging.getLogger(__name__)


def _repair_note(missing: list[str], states: list[str]) -> str:
    """What the repair call is told: the figures no tool result holds, and the statements of
    state no result of this turn shows."""
    figures = [m for m in missing if m not in states]
    said = ""
    if figures:
        said += f"These figures do not appear in any tool result: {'; '.join(figures)}. "
    if states:
        said += (
            f"No result of this turn shows the state you describe: {'; '.join(states)} "
            "(the present needs a reading, the past a history). "
        )
    return (
        f"{said}Answer again using only what the tool results say, or, if they do not answer "
        "the question, say you don't know as instructed. Follow the required format."
    )


class Finisher:
    """Ends runs for one agent; ``llm`` is the agent's traced model (for the repair call,
    made only when ``repair``: else an ungrounded answer becomes IDK at once). ``settles``:
    what each tool answers on its own (``ToolSpec.answers``), for statements of live state
    and of the past (``agent.grounding.unsupported_states``)."""

    def __init__(
        self,
        llm: LLMClient,
        *,
        repair: bool = True,
        settles: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        self.llm = llm
        self.repair = repair
        self.settles = dict(settles or {})

    def unsupported(
        self, run: Run, answer: str, evidence: Evidence | None = None
    ) -> tuple[list[str], list[str]]:
        """What ``answer`` says that this run's evidence (``evidence``, else built) does not
        hold: figures, ids and names (``ungrounded``), and the statements of state among
        them: in a run about buildings or rooms (a successful call with an entity argument),
        statements of live state or of the past that no result of this turn settles."""
        missing = ungrounded(answer, evidence or run.evidence())
        states = self._states(run, answer)
        return missing + [s for s in states if s not in missing], states

    def _states(self, run: Run, answer: str) -> list[str]:
        if not any(trace.ok and trace.entities for trace in run.traces):
            return []
        settled = {a for t in run.traces if t.ok for a in self.settles.get(t.name, ())}
        return unsupported_states(answer, settled)

    def composed(self, run: Run, text: str, streaming: bool) -> list[AgentEvent]:
        """The events of an answer the service wrote from its own tool results (its
        markers cite chunks the run retrieved), or none when a figure in it is not grounded
        or a marker names no such chunk (a composer bug: the model answers instead)."""
        missing, _ = self.unsupported(run, text)
        cited = extract_citations(text, run.retrieved())
        if missing or cited.hallucinated:
            why = "; ".join([*missing, *(f"no chunk {c}" for c in cited.hallucinated)])
            log.warning("composed answer not grounded (%s); asking the model", why)
            return []
        run.notes.append("answer composed by the service from the tool results (no model call)")
        idk = is_idk(text)
        citations = [citation_out(c) for c in cited.citations]
        decision: Decision = "idk" if idk else "answered"
        done = DoneEvent(
            response=run.response(text, decision, by="service", idk=idk, citations=citations)
        )
        if not streaming:
            return [done]
        return [TokenEvent(text=text), *(CitationEvent(citation=c) for c in citations), done]

    async def finish(
        self,
        run: Run,
        result: ChatResult,
        streaming: bool,
        request: ChatRequest,
        trace: RunTrace,
        hop: int,
    ) -> AsyncIterator[AgentEvent]:
        """Classify the final reply, validate its citations, check its figures are grounded
        (``_grounded``; ``request``, ``trace`` and ``hop`` are for its repair call), yield the
        done event. A streamed answer replaced here was already sent as tokens: the done
        answer supersedes them."""
        if result.kind == "refusal":
            if streaming:
                yield TokenEvent(text=DECLINE_TEXT)
            yield DoneEvent(response=run.declined(DECLINE_TEXT, result))
            return

        raw = (result.text or "").strip()
        if not raw:
            if streaming:
                yield TokenEvent(text=IDK_MARKER)
            run.notes.append("the model returned an empty answer")
            yield DoneEvent(response=run.response(IDK_MARKER, "idk", by="service", idk=True))
            return
        checked = extract_citations(result.text or "", run.retrieved())
        answer = checked.answer.strip()
        citations = [citation_out(c) for c in checked.citations]
        if is_refusal(answer):
            yield DoneEvent(response=run.declined(answer, result))
            return
        decision: Decision = "idk" if is_idk(answer) else "answered"
        if streaming and answer == IDK_MARKER:  # held back while streamed (agent.streaming)
            yield TokenEvent(text=IDK_MARKER)
        if decision == "answered":
            grounded = await self._grounded(run, checked, request, trace, hop)
            if grounded is None:  # the service's IDK answer in place of the model's
                yield DoneEvent(response=run.response(IDK_MARKER, "idk", by="service", idk=True))
                return
            answer = grounded.answer.strip()
            citations = [citation_out(c) for c in grounded.citations]
            if grounded is not checked:  # a repaired answer: report both replies' inventions
                extra = [i for i in grounded.hallucinated if i not in checked.hallucinated]
                checked = dataclasses.replace(grounded, hallucinated=checked.hallucinated + extra)
            answer, citations = self._supported(run, answer, citations)
        yield DoneEvent(
            response=run.response(
                answer,
                decision,
                by="model",
                idk=decision == "idk",
                citations=citations,
                hallucinated=checked.hallucinated,
            )
        )

    @staticmethod
    def _supported(
        run: Run, answer: str, citations: list[CitationOut]
    ) -> tuple[str, list[CitationOut]]:
        """The answer with each marker moved to the chunk that supports its claim
        (``agent.citation_support``); what moved goes to ``notes``."""
        retrieved = run.retrieved()
        check = check_support(answer, run.question, retrieved)
        if not check.changed:
            return answer, citations
        dropped, added = ", ".join(check.dropped) or "none", ", ".join(check.added) or "none"
        run.notes.append(f"citations checked against the answer: dropped {dropped}, added {added}")
        resolved = extract_citations(check.answer, retrieved)
        return check.answer, [citation_out(c) for c in resolved.citations]

    async def _grounded(
        self, run: Run, checked: CitationResult, request: ChatRequest, trace: RunTrace, hop: int
    ) -> CitationResult | None:
        """``checked`` if every figure, id and designator in it is grounded in the run's
        evidence; else the answer of one repair call, if that one is; else None (the run
        answers IDK). What was rejected goes to ``run.ungrounded`` and ``notes``."""
        evidence = run.evidence()  # once, for the answer and its repair
        missing, states = self.unsupported(run, checked.answer, evidence)
        if not missing:
            return checked
        run.ungrounded.extend(missing)
        repaired = None
        if self.repair:
            note = _repair_note(missing, states)
            repaired = await self._repair(run, checked.answer, note, request, trace, hop + 1)
        if repaired is not None:
            still, _ = self.unsupported(run, repaired.answer, evidence)
            if not still:
                run.notes.append(f"answer repaired; not in any tool result: {'; '.join(missing)}")
                return repaired
            run.ungrounded.extend(c for c in still if c not in run.ungrounded)
        run.notes.append(
            f"answer replaced by IDK; not in any tool result: {'; '.join(run.ungrounded)}"
        )
        return None

    async def _repair(
        self,
        run: Run,
        answer: str,
        note: str,
        request: ChatRequest,
        trace: RunTrace,
        hop: int,
    ) -> CitationResult | None:
        """One more model call (a hop of its own, never streamed: the done answer replaces
        what was streamed) with the violation fed back (``note``); its answer, or None when it asks
        for tools, declines, says IDK, is empty or fails."""
        run.messages += [Message("assistant", answer), Message("user", note)]
        retry = dataclasses.replace(request, messages=tuple(run.messages))
        with trace.hop(hop) as hop_ctx:
            try:
                with model_call(hop_ctx, run.model):
                    reply = await self.llm.chat(retry)
            except LLMError as exc:
                log.warning("hop %d: the grounding repair call failed: %s", hop, exc)
                return None
        run.model = reply.model or run.model
        run.usage.record(reply.usage, run.model, hop=hop)
        text = (reply.text or "").strip()
        if reply.kind != "text" or not text or is_idk(text) or is_refusal(text):
            return None
        return extract_citations(text, run.retrieved())
