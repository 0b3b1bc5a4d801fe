"""One streamed model call as the loop passes it on: ``waiting`` heartbeats until the model
sends something, text through the ``CitationStreamFilter`` (an invented marker is never
sent), a ``citation`` event for each valid marker as it completes, then the finished
``ChatResult``. A reply that is the IDK sentence is held back whole (sent while it still may
not be): the loop may search before accepting it (``agent.search_first``), and the finisher
sends it when it stands."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import suppress

from agent.answer import AgentEvent, CitationEvent, ProgressEvent, TokenEvent
from agent.citations import Citation, CitationStreamFilter, snippet
from agent.llm.base import ChatResult, Completed, StreamEvent, TextDelta
from agent.progress import with_heartbeat
from agent.prompts import IDK_MARKER
from agent.run_state import Run, citation_out

__all__ = ["stream_hop"]


async def stream_hop(
    source: AsyncIterator[StreamEvent], run: Run, hop: int, heartbeat_seconds: float
) -> AsyncGenerator[AgentEvent | ChatResult, None]:
    """The events of one streamed model call (``source``), then its ``ChatResult``."""
    retrieved = run.retrieved()
    stream_filter = CitationStreamFilter(valid_ids=frozenset(retrieved))

    def citation_events() -> list[AgentEvent]:
        events: list[AgentEvent] = []
        for chunk_id in stream_filter.pop_citations():
            chunk = retrieved[chunk_id]
            citation = Citation(chunk_id, chunk.source, chunk.section, snippet(chunk.text))
            events.append(CitationEvent(citation=citation_out(citation)))
        return events

    held = ""  # the reply so far, while it is the start of the IDK sentence
    released = False

    def release(text: str) -> str:
        """What to send of ``text`` now: nothing while the reply may be the IDK sentence."""
        nonlocal held, released
        if not released and IDK_MARKER.startswith((held + text).lstrip()):
            held += text
            return ""
        released, text, held = True, held + text, ""
        return text

    events = with_heartbeat(source, hop=hop, every=heartbeat_seconds)
    try:
        async for event in events:
            if isinstance(event, ProgressEvent):
                yield event
            elif isinstance(event, TextDelta):
                text = release(stream_filter.feed(event.text))
                if text:
                    yield TokenEvent(text=text)
                for citation_event in citation_events():
                    yield citation_event
            elif isinstance(event, Completed):
                tail = release(stream_filter.flush())
                if not released and held.strip() != IDK_MARKER:
                    tail = held + tail  # a short reply that only began like it
                if tail:
                    yield TokenEvent(text=tail)
                for citation_event in citation_events():
                    yield citation_event
                yield event.result
                return
    finally:
        with suppress(Exception):
            await events.aclose()
