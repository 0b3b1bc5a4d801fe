"""Answers quoted from a reference entry (agent.small_model.reference): a question about one
documented key or code whose own entry the caller's search put first is answered with that entry,
cited, without a model call; anything beyond the entry goes to the model."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from agent_helpers import ACME_STAFF, FakeRetriever, hit

from agent.answer import CitationEvent, DoneEvent, TokenEvent
from agent.small_model.reference import ENTRY_CHARS, compose_reference
from agent.testing import ScriptedModel, text_reply
from retrieval.search import SearchHit

COOLDOWN = dataclasses.replace(
    hit(
        "c0ffee000001",
        "Default `15`, range 1–1440, **tenant-overridable** and overridable per rule. Minimum "
        "time between two notifications from the same rule for the same room and alert type.",
        source="developer/configuration-reference.md",
    ),
    title="Platform configuration reference",
    section="Platform configuration reference > Alerting > ALERT_COOLDOWN_MINUTES",
)
E1014 = dataclasses.replace(
    hit(
        "c0ffee000002",
        "The sensor is registered but has never sent a reading. **Fix:** usually commissioning "
        "is incomplete; check the gateway configuration.",
        source="developer/error-codes.md",
    ),
    title="Error codes",
    section="Error codes > Sensors (CV-E1010 – CV-E1019) > CV-E1014 – No readings yet",
)
MENTION = dataclasses.replace(  # a page that names the key in passing, not its entry
    hit("c0ffee000003", "Alerts repeat at most every ALERT_COOLDOWN_MINUTES (15 by default)."),
    section="Occupancy alerts > Cooldown",
)


@pytest.mark.parametrize(
    ("question", "entry"),
    [
        ("What is the default of ALERT_COOLDOWN_MINUTES?", COOLDOWN),
        ("What does ALERT_COOLDOWN_MINUTES control and what is its default?", COOLDOWN),
        ("When do I get CV-E1014?", E1014),
        ("How do I fix CV-E1014?", E1014),
        ("What does error CV-E1014 mean?", E1014),
    ],
)
def test_a_question_about_one_key_or_code_is_answered_with_its_entry(
    question: str, entry: SearchHit
) -> None:
    answer = compose_reference(question, [entry, MENTION])

    assert answer is not None
    page, *_, heading = entry.section.split(" > ")
    assert answer.startswith(f"{heading} ({page}): ")
    assert " ".join(entry.text.split()) in answer
    assert answer.endswith(f"[^{entry.chunk_id}]")


@pytest.mark.parametrize(
    ("question", "hits"),
    [
        # the first hit only mentions the key: its entry was not found (or is not visible)
        ("What is the default of ALERT_COOLDOWN_MINUTES?", [MENTION, COOLDOWN]),
        # the question asks more than the entry says
        ("Which cvctl command resets ALERT_COOLDOWN_MINUTES for a tenant?", [COOLDOWN]),
        ("Does CV-E1014 show on the MQTT error topic?", [E1014]),
        # no token, two tokens, a token that is only a prefix of the entry's
        ("How long is the alert cooldown by default?", [COOLDOWN]),
        ("What is the difference between CV-E1014 and ALERT_COOLDOWN_MINUTES?", [E1014]),
        ("What does CV-E10 mean?", [E1014]),
        ("What is the default of ALERT_COOLDOWN_MINUTES?", []),
    ],
)
def test_anything_else_is_left_to_the_model(question: str, hits: list[SearchHit]) -> None:
    assert compose_reference(question, hits) is None


def test_a_long_entry_is_cut_at_a_word_with_an_ellipsis() -> None:
    long_entry = dataclasses.replace(COOLDOWN, text="Default `15`. " + "word " * 400)

    answer = compose_reference("What is ALERT_COOLDOWN_MINUTES?", [long_entry])

    assert answer is not None
    quoted = answer.split(": ", 1)[1].rsplit(" [^", 1)[0]
    assert len(quoted) <= ENTRY_CHARS and quoted.endswith("word…")


# --- through the agent --------------------------------------------------------------------------


def silent_model() -> ScriptedModel:
    """Any model call fails the test: the script has no replies."""
    return ScriptedModel(tool_calling_mode="json_schema")


async def test_the_agent_quotes_the_entry_cited_without_calling_the_model(
    make_local_agent: Any, retriever: FakeRetriever
) -> None:
    retriever.hits = [E1014, MENTION]
    agent = make_local_agent(silent_model(), plan_first="on")

    answer = await agent.answer("When do I get CV-E1014?", ACME_STAFF)

    assert answer.decision == "answered" and not answer.idk
    assert any("composed by the service" in note for note in answer.notes)
    assert [c.chunk_id for c in answer.citations] == [E1014.chunk_id]
    assert [call.name for call in answer.tool_calls] == ["search_docs"]
    assert answer.usage.input_tokens == 0 and answer.retrieval.ungrounded == []


async def test_the_stream_sends_the_quote_its_citation_then_done(
    make_local_agent: Any, retriever: FakeRetriever
) -> None:
    retriever.hits = [COOLDOWN]
    agent = make_local_agent(silent_model(), plan_first="on")

    events = [e async for e in agent.stream("What is ALERT_COOLDOWN_MINUTES?", ACME_STAFF)]
    tail = [e for e in events if isinstance(e, TokenEvent | CitationEvent | DoneEvent)]

    assert [type(e) for e in tail] == [TokenEvent, CitationEvent, DoneEvent]
    assert isinstance(tail[1], CitationEvent) and tail[1].citation.chunk_id == COOLDOWN.chunk_id
    assert isinstance(tail[2], DoneEvent) and tail[2].response.citations == [tail[1].citation]


async def test_without_the_entry_the_model_answers(
    make_local_agent: Any, retriever: FakeRetriever
) -> None:
    retriever.hits = [MENTION]
    reply = text_reply(f"Every 15 minutes at most. [^{MENTION.chunk_id}]")
    model = ScriptedModel(reply, tool_calling_mode="json_schema")
    agent = make_local_agent(model, plan_first="on")

    answer = await agent.answer("What is the default of ALERT_COOLDOWN_MINUTES?", ACME_STAFF)

    assert not any("composed by the service" in note for note in answer.notes)
    assert answer.answer.startswith("Every 15 minutes at most.")
    assert [c.chunk_id for c in answer.citations] == [MENTION.chunk_id]
