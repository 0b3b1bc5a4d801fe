"""Search before "I don't know" (issue 42, item 4): a run does not end in IDK without a
search of the knowledge base. When the model's final reply is IDK, no call of a tool that
answers documentation questions (``ToolSpec.answers``) has succeeded in the run, and the hop
offers one, the loop makes that search itself, with the question, as the caller, as a
visible step, and asks the model once more; what it says then stands. A decline is the
model's judgement that the question is off-topic, which needs no search (the small-model
strategy allows it only where the documentation matched poorly: ``routing``)."""

from __future__ import annotations

import json
from collections.abc import Mapping

from agent.llm.base import ChatRequest, ChatResult, ToolCall, ToolSpec
from agent.prompts import is_idk, is_refusal
from agent.run_state import Run

__all__ = ["DOCUMENTATION", "search_before_giving_up"]

DOCUMENTATION = "documentation"  # what a knowledge-base search answers (``ToolSpec.answers``)
SEARCH_CALL_ID = "service_search_1"


def _gives_up(reply: ChatResult) -> bool:
    text = (reply.text or "").strip()
    return reply.kind == "text" and is_idk(text) and not is_refusal(text)


def _query_argument(spec: ToolSpec) -> str | None:
    """The one required string argument a search takes (its query)."""
    properties = spec.parameters.get("properties", {})
    required = [n for n in spec.parameters.get("required", []) if n in properties]
    strings = [n for n in required if properties[n].get("type") == "string"]
    return strings[0] if len(strings) == 1 else None


def search_before_giving_up(
    run: Run, request: ChatRequest, reply: ChatResult, settles: Mapping[str, tuple[str, ...]]
) -> ToolCall | None:
    """The search to make before accepting ``reply`` as the run's end, or None (the reply
    is not IDK, the run already searched, or the hop offers no search). ``settles``: what
    each tool answers on its own (``ToolSpec.answers``, by tool name)."""
    if not _gives_up(reply) or any(note.startswith(NOTE) for note in run.notes):
        return None
    searchers = {name for name, answers in settles.items() if DOCUMENTATION in answers}
    if any(trace.ok and trace.name in searchers for trace in run.traces):
        return None
    for spec in request.tools:
        argument = _query_argument(spec) if spec.name in searchers else None
        if argument is not None:
            run.notes.append(f"{NOTE} ({spec.name})")
            arguments = json.dumps({argument: run.question[:500]})
            return ToolCall(SEARCH_CALL_ID, spec.name, arguments)
    return None


NOTE = "the model said IDK without a search: the service searched the documentation"
