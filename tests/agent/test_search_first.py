"""Search before "I don't know" (issue 42, item 4): no IDK without a search of the
knowledge base. The loop searches with the question, as the caller, as a
visible step, and asks once more; what the model says then stands."""

from __future__ import annotations

from typing import Any

from agent_helpers import ACME_STAFF, Call, Decline, FakeRetriever, Idk, Say, hit, scripted

from agent.search_first import NOTE

QUESTION = "Can I move a desk booking to another floor?"
CHUNK = hit("c-move", "A booking can be moved to any floor of the same site.", source="u/b.md")
ANSWER = "Yes: a booking can be moved to any floor of the same site [^c-move]."


async def test_idk_without_a_search_searches_first(
    make_local_agent: Any, retriever: FakeRetriever
) -> None:
    retriever.hits = [CHUNK]
    model = scripted("native", Idk(), Say(ANSWER))
    answer = await make_local_agent(model, plan_first="off").answer(QUESTION, ACME_STAFF)
    assert [call["query"] for call in retriever.calls] == [QUESTION]
    assert [t.name for t in answer.tool_calls] == ["search_docs"]
    assert (answer.decision, answer.citations[0].chunk_id) == ("answered", "c-move")
    assert any(note.startswith(NOTE) for note in answer.notes)
    assert model.requests[-1].messages[-1].role == "tool"  # the model saw the results


async def test_giving_up_after_a_search_stands(
    make_local_agent: Any, retriever: FakeRetriever
) -> None:
    model = scripted("native", Call("search_docs", {"query": "desk floor"}), Idk())
    answer = await make_local_agent(model, plan_first="off").answer(QUESTION, ACME_STAFF)
    assert answer.decision == "idk"
    assert len(retriever.calls) == 1 and len(model.requests) == 2


async def test_it_searches_once_and_the_second_answer_stands(
    make_local_agent: Any, retriever: FakeRetriever
) -> None:
    model = scripted("native", Idk(), Idk())
    answer = await make_local_agent(model, plan_first="off").answer(QUESTION, ACME_STAFF)
    assert answer.decision == "idk"
    assert len(retriever.calls) == 1 and len(model.requests) == 2


async def test_a_decline_is_the_models_judgement(
    make_local_agent: Any, retriever: FakeRetriever
) -> None:
    model = scripted("native", Decline())
    answer = await make_local_agent(model, plan_first="off").answer(QUESTION, ACME_STAFF)
    assert answer.decision == "declined_out_of_scope" and retriever.calls == []


async def test_not_on_the_last_hop(make_local_agent: Any, retriever: FakeRetriever) -> None:
    model = scripted("native", Idk())
    agent = make_local_agent(model, plan_first="off", max_tool_hops=1)
    assert (await agent.answer(QUESTION, ACME_STAFF)).decision == "idk"
    assert retriever.calls == []
