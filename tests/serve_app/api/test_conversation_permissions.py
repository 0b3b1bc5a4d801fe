"""Read-time permissions (issue 17, item 4) over real HTTP (uvicorn on 127.0.0.1) on the real
embedded PostgreSQL: the real Agent searches a knowledge base of two pages (one for
business staff, one public) with the real MiniLM and cites both; then the staff page's ACL
is narrowed to admins (re-written with the same chunks, as a re-ingest does), and later the
public page is deleted. Reading the thread leaves the citations out and withholds the answer
that cited them; continuing it sends the model that note, never the answer or the page."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest
from api_helpers import NORTHWIND_STAFF

from agent.llm.base import ChatRequest, ChatResult
from agent.testing import FunctionModel, text_reply, tool_call, tool_calls_reply
from conversations.recheck import WITHHELD_ANSWER
from foundation.settings import Settings
from retrieval.search import embedding_input
from retrieval.store import ChunkRecord, DocumentRecord, PgDocumentStore
from serve_app.local_backend import LocalBackend

pytestmark = pytest.mark.integration

STAFF_ID, STAFF_TEXT = "rollbk000001", "Gateway rollbacks need a signed manifest."
PUBLIC_ID, PUBLIC_TEXT = "badges000001", "Badge readers sync every night."
STAFF_SOURCE, PUBLIC_SOURCE = "ops/rollbacks.md", "public/badges.md"
Q1 = "What do gateway rollbacks need, and when do badge readers sync?"
Q2 = "and who signs it?"
ANSWER = (
    f"Gateway rollbacks need a signed manifest [^{STAFF_ID}]. "
    f"Badge readers sync every night [^{PUBLIC_ID}]."
)


def page(source: str, chunk_id: str, text: str, acl: list[str], vector: Any) -> DocumentRecord:
    chunk = ChunkRecord(
        id=chunk_id,
        ordinal=0,
        text=text,
        section="Operations",
        kind="prose",
        token_count=len(text.split()),
        embedding=vector,
    )
    return DocumentRecord(
        source=source,
        title=source,
        content_hash=f"h-{'-'.join(acl)}",
        fingerprint=f"f-{'-'.join(acl)}",
        permissions=acl,
        chunks=[chunk],
    )


class Model:
    """Searches and cites both pages for Q1; answers anything else with a note. Keeps every
    request (the server runs on its own thread)."""

    def __init__(self) -> None:
        self.requests: list[ChatRequest] = []

    def reply(self, request: ChatRequest) -> ChatResult:
        self.requests.append(request)
        last = request.messages[-1]
        if last.role == "tool":
            return text_reply(ANSWER)
        if last.role == "user" and last.content == Q1:
            return tool_calls_reply(tool_call("search_docs", {"query": "rollbacks badge readers"}))
        return text_reply("Noted.")


async def test_a_narrowed_acl_and_a_deleted_page_leave_the_thread_on_read_and_in_history(
    make_settings: Callable[..., Settings],
    make_backend: Callable[..., LocalBackend],
    serve_local: Callable[..., str],
    minilm: Any,
    db_url: str,
) -> None:
    vectors = np.asarray(
        minilm.encode([embedding_input("Operations", t) for t in (STAFF_TEXT, PUBLIC_TEXT)]),
        dtype=np.float32,
    )
    staff_page = page(STAFF_SOURCE, STAFF_ID, STAFF_TEXT, ["role:business_staff"], vectors[0])
    store = await PgDocumentStore.connect(db_url, embedding_dim=384, max_size=1)
    model = Model()
    settings = make_settings(database_url=db_url, history_max_tokens=4000)
    url = serve_local(settings, make_backend(settings, llm=FunctionModel(model.reply)))
    try:
        await store.write_documents(
            [staff_page, page(PUBLIC_SOURCE, PUBLIC_ID, PUBLIC_TEXT, [], vectors[1])]
        )
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            first = (await http.post("/ask", json={"question": Q1}, headers=NORTHWIND_STAFF)).json()
            assert first["answer"] == ANSWER, first
            assert {c["chunk_id"] for c in first["citations"]} == {STAFF_ID, PUBLIC_ID}
            ident = first["conversation_id"]

            async def read() -> tuple[str, list[dict[str, Any]]]:
                response = await http.get(f"/conversations/{ident}", headers=NORTHWIND_STAFF)
                assert response.status_code == 200, response.text
                return response.text, response.json()["turns"]

            _, turns = await read()  # as stored, while both pages are visible
            assert (turns[0]["answer"], turns[0]["answer_withheld"]) == (ANSWER, False)
            assert len(turns[0]["citations"]) == 2

            # The staff page narrowed to admins (same chunk id, new ACL).
            narrowed = page(STAFF_SOURCE, STAFF_ID, STAFF_TEXT, ["role:admin"], vectors[0])
            assert await store.write_document(narrowed) == "replaced"
            text, turns = await read()
            assert (turns[0]["answer"], turns[0]["answer_withheld"]) == (WITHHELD_ANSWER, True)
            assert [c["chunk_id"] for c in turns[0]["citations"]] == [PUBLIC_ID]
            assert turns[0]["question"] == Q1  # the caller's own words stay
            for secret in (STAFF_ID, STAFF_TEXT, "signed manifest"):
                assert secret not in text

            # Continued: the model gets the note in place of that answer, never the page.
            before = len(model.requests)
            second = await http.post(
                "/ask", json={"question": Q2, "conversation_id": ident}, headers=NORTHWIND_STAFF
            )
            assert second.status_code == 200 and second.json()["turn"] == 2, second.text
            sent = model.requests[before:]
            assert sent
            history = [(m.role, m.content) for m in sent[0].messages[1:]]
            assert history == [("user", Q1), ("assistant", WITHHELD_ANSWER), ("user", Q2)]
            for request in sent:
                for message in request.messages:
                    assert "signed manifest" not in (message.content or "")
                    assert STAFF_ID not in (message.content or "")

            # The public page deleted: its citation goes too.
            assert await store.delete_sources([PUBLIC_SOURCE]) == 1
            text, turns = await read()
            assert [t["turn"] for t in turns] == [1, 2]
            assert (turns[0]["citations"], turns[0]["answer_withheld"]) == ([], True)
            assert PUBLIC_ID not in text and PUBLIC_TEXT not in text
    finally:
        await store.close()
