"""Factories for LLM_PROVIDER and RETRIEVER, as a user's module would hold them (imported by
name from the environment in tests/serve_app/test_plugins.py)."""

from __future__ import annotations

from collections.abc import Sequence

from agent.testing import ScriptedModel, text_reply
from agent.tools.base import Retriever
from foundation.settings import Settings
from retrieval.search import SearchHit


def scripted_provider(settings: Settings, model: str | None) -> ScriptedModel:
    return ScriptedModel(text_reply("from the plug-in"), model=model or settings.llm.answer_model)


def not_a_client(settings: Settings, model: str | None) -> str:
    return "a string"


class Tagged:
    """The hybrid search's hits, and a record that it was asked."""

    def __init__(self, inner: Retriever) -> None:
        self.inner = inner
        self.queries: list[str] = []

    async def search(
        self, query: str, *, acl: Sequence[str], top_k: int | None = None
    ) -> list[SearchHit]:
        self.queries.append(query)
        return await self.inner.search(query, acl=acl, top_k=top_k)


def tagged_retriever(settings: Settings, hybrid: Retriever) -> Tagged:
    return Tagged(hybrid)


NOT_CALLABLE = 42
