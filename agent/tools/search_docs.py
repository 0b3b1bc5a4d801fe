"""``search_docs``: permission-filtered hybrid search over the documentation.

Retrieval filters by the caller's typed ACL entries in SQL; the request's ``top_k`` sets the
depth. Every chunk handed to the model is recorded in ``ctx.seen_chunks``: citation markers
in the answer are validated against exactly that set.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from agent.tools.base import Tool, ToolContext, ToolError, ToolExample
from agent.tools.twin import Args

MAX_CHUNK_CHARS = 1500


class SearchDocsArgs(Args):
    query: str = Field(
        min_length=1,
        max_length=500,
        description="What to look for in the CrowdVision documentation (a few keywords).",
    )


class DocChunk(BaseModel):
    chunk_id: str
    source: str
    section: str
    text: str  # at most MAX_CHUNK_CHARS


class SearchDocsResult(BaseModel):
    results: list[DocChunk]
    note: str | None = None  # when nothing matched
    cite: str | None = None  # how to cite, when something did


class SearchDocs(Tool[SearchDocsArgs, SearchDocsResult]):
    name = "search_docs"
    answers = ("documentation",)
    description = (
        "Search the CrowdVision documentation (how the platform works: features, settings, "
        "sensors, alerts, APIs, troubleshooting). Cite what you use as [^chunk_id]."
    )
    guidance = "How the platform works: search_docs."
    examples = (
        ToolExample(
            "How do I set up an occupancy alert?",
            "how the platform works",
            {"query": "set up occupancy alert"},
        ),
    )
    prompt_order = 80

    async def run(self, args: SearchDocsArgs, ctx: ToolContext) -> SearchDocsResult:
        if ctx.retriever is None:
            raise ToolError("documentation search is unavailable right now")
        hits = await ctx.retriever.search(
            args.query.strip(), acl=ctx.user.acl_entries, top_k=ctx.top_k
        )
        ctx.seen_chunks.add(hits)
        results = [
            DocChunk(
                chunk_id=hit.chunk_id,
                source=hit.source,
                section=hit.section,
                text=hit.text[:MAX_CHUNK_CHARS],
            )
            for hit in hits
        ]
        if not results:
            return SearchDocsResult(
                results=[],
                note="No documentation matched. Try other keywords, or say you don't know.",
            )
        return SearchDocsResult(
            results=results,
            cite="Mark each claim taken from a result with its marker, e.g. "
            f"[^{hits[0].chunk_id}]. Cite only chunk_ids listed here.",
        )
