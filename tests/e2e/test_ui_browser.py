"""The chat page in a real browser (Debian's chromium, driven by Playwright) against the real
Serve application with the scripted model (``stack_helpers.agent_stack``), over a knowledge
base of two pages of its own: one about the alert cooldown, one carrying ``<script>`` and
``<img onerror>``.

One stack and one browser for the module. The page is used as production uses it (the mesh's
``x-gateway-claims`` on every request, here the browser context's extra header), and through
the development sign-in (this stack sets ``EVAL_JWT_SECRET``). The dev sign-in's absence with
auth on is shown against the in-process app with production settings.

``test_screenshots`` takes the README's screenshots; it writes them into docs/ui/ only with
``UPDATE_SCREENSHOTS=1``, otherwise into a temporary directory, so a test run leaves the
working tree clean."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from foundation.eval_tokens import mint_eval_token
from local_world.claims import encode_claims
from tests.e2e.stack_helpers import (
    AgentStack,
    SharedServe,
    agent_stack,
    chunk_id_for,
    replica_actors,
)

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "docs" / "ui"  # the README's screenshots, rewritten only with UPDATE_SCREENSHOTS=1
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SECRET = "ui-e2e-eval-secret-0123456789abcdef"
NINA = (["business_staff"], ["northwind"])  # the dev sign-in's first user
STAFF = {"x-gateway-claims": encode_claims("u-ui-staff", [("northwind", "business_staff")])}
T = TypeVar("T")
DESKTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}

COOLDOWN_PAGE = """# Alert cooldown

## Cooldown: how often alerts repeat

An occupancy alert repeats at most once per cooldown. The default cooldown is 15 minutes;
change it under Settings, Alerts. Each room keeps its own cooldown clock.
"""
XSS_PAGE = """# Widget calibration

## Calibrating the widget

Calibrate the widget every 30 days. <script>window.__xss = 'script'</script>
<img src="x" onerror="window.__xss = 'img'"> Then restart the gateway.
"""
XSS_TEXT = "<script>window.__xss = 'doc'</script><img src=x onerror=\"window.__xss='img'\">"

if not CHROMIUM.exists():
    if os.environ.get("CI"):
        raise RuntimeError("/usr/bin/chromium is missing: `make test` installs it (apt-get)")
    pytest.skip("needs Debian's chromium (/usr/bin/chromium)", allow_module_level=True)


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` in a thread of its own: Playwright's sync API keeps a loop running in
    this one."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


# --- the stack: its own small knowledge base ------------------------------------------------------


@pytest.fixture(scope="module")
def ui_docs_url(
    pg_admin_url: str, cached_minilm: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    from foundation.acl import parse_acl
    from foundation.database import migrate, with_database
    from foundation.settings import Settings
    from ingest_jobs.pipeline import IngestOptions, run_ingest
    from retrieval.store import PgDocumentStore
    from serve_app.wiring import ingest_config
    from tests.conftest import TEST_HOME, _create_database, _drop_database, _ensure_server

    docs = TEST_HOME / "ui-docs"  # a fixed path: the screenshots show the pages' sources
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "alert-cooldown.md").write_text(COOLDOWN_PAGE)
    (docs / "widget-calibration.md").write_text(XSS_PAGE)
    _ensure_server()
    name = f"t_ui_{uuid.uuid4().hex[:10]}"

    async def build() -> str:
        await _create_database(pg_admin_url, name)
        url = with_database(pg_admin_url, name)
        await asyncio.to_thread(migrate, url, 384)
        store = await PgDocumentStore.connect(url, embedding_dim=384, max_size=2)
        try:
            await run_ingest(
                store,
                ingest_config(Settings(agent_service_home=TEST_HOME)),
                IngestOptions(roots=[(docs, parse_acl([]))], executor="local", max_tokens=200),
                embedder=cached_minilm,
            )
        finally:
            await store.close()
        return url

    url = _run(build())
    yield url
    _run(_drop_database(pg_admin_url, name))


@pytest.fixture(scope="module")
def stack(
    ui_docs_url: str, tmp_path_factory: pytest.TempPathFactory, shared_serve: SharedServe
) -> Iterator[AgentStack]:
    from tests.conftest import TEST_HOME

    env = {
        "EVAL_JWT_SECRET": SECRET,
        "MODEL_OVERRIDE_MIN_ROLE": "business_admin",
        "ALLOWED_MODELS": "local/scripted,local/other",
        "ASK_TIMEOUT_SECONDS": "30",
        "DOC_ROOTS": f"{TEST_HOME / 'ui-docs'}=",  # what the admin panel's run ingests
    }
    home = tmp_path_factory.mktemp("ui-home")
    with agent_stack(ui_docs_url, home, env=env, shared=shared_serve) as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # Playwright gives each launch a fresh, throwaway user-data-dir.
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        yield chromium
        chromium.close()


class Page:
    """A page of the chat in its own browser context, with what it logged and requested."""

    def __init__(self, browser: Any, url: str, **context: Any) -> None:
        context.setdefault("viewport", DESKTOP)
        self.context = browser.new_context(**context)
        self.page = self.context.new_page()
        self.console: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        self.page.on("request", lambda r: self.requests.append(f"{r.method} {r.url}"))
        self.page.set_default_timeout(20_000)
        self.page.goto(f"{url}/ui/")
        self.expect(self.page.locator("#who")).not_to_have_text("Loading…")

    @staticmethod
    def expect(locator: Any) -> Any:
        from playwright.sync_api import expect

        return expect(locator)

    def ask(self, question: str) -> Any:
        self.page.fill("#question", question)
        self.page.press("#question", "Enter")
        return self.page.locator(".turn").last

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def open_page(browser: Any, stack: AgentStack) -> Iterator[Any]:
    pages: list[Page] = []

    def make(**context: Any) -> Page:
        context.setdefault("extra_http_headers", STAFF)  # as the mesh signs each request
        page = Page(browser, stack.url, **context)
        pages.append(page)
        return page

    yield make
    for page in pages:
        page.close()


def _script_cited_answer(stack: AgentStack, question: str, text: str, **final: Any) -> None:
    stack.llm.script(
        {"tool_calls": [{"name": "search_docs", "arguments": {"query": "alert cooldown"}}]},
        {"text": text, "usage": {"prompt_tokens": 120, "completion_tokens": 30}, **final},
        key=question,
    )


# --- the tests ------------------------------------------------------------------------------------


def test_an_answer_streams_with_its_tool_trace_and_a_citation_opens_its_snippet(
    stack: AgentStack, ui_docs_url: str, open_page: Any
) -> None:
    chunk = chunk_id_for(ui_docs_url, "Cooldown: how often")
    question = "How often do alerts repeat? (ui)"
    answer = (
        "Alerts repeat **at most once per cooldown** [^" + chunk + "]:\n\n"
        "- the default is 15 minutes\n- each room keeps its own clock\n\n"
        "| setting | default |\n|---|---|\n| cooldown | 15 min |\n"
    )
    # ~30 deltas 50 ms apart: the model takes ~1.5 s to write the answer
    _script_cited_answer(stack, question, answer, chunk_chars=4, stream_delay_ms=50)
    ui = open_page()
    ui.page.evaluate(
        """() => {
          window.__samples = [];
          const turns = document.getElementById('turns');
          new MutationObserver(() => {
            const turn = turns.lastElementChild;
            if (!turn) return;
            const text = turn.querySelector('.answer').textContent;
            window.__samples.push([performance.now(), text.length, turn.dataset.state]);
          }).observe(turns, {
            subtree: true, childList: true, characterData: true, attributes: true,
          });
        }"""
    )
    turn = ui.ask(question)
    ui.expect(turn.locator(".trace li.tool.ok")).to_contain_text("search_docs")
    ui.expect(turn).to_have_attribute("data-state", "done")
    samples = ui.page.evaluate("() => window.__samples")
    streaming = [(t, n) for t, n, s in samples if s == "streaming" and n > 0]
    done_at = next(t for t, _, s in samples if s == "done")
    final_len = samples[-1][1]
    # tokens arrived one by one: partial answers were shown, the first well before the end
    assert len({n for _, n in streaming}) >= 5, samples
    assert streaming[0][1] < final_len / 2
    assert done_at - streaming[0][0] > 800, (streaming[0], done_at)
    trace = turn.locator(".trace li.tool.ok")
    ui.expect(trace).to_contain_text("alert cooldown")
    ui.expect(trace).to_contain_text(" ms")
    # Markdown rendered: bold, a list, a table
    ui.expect(turn.locator(".answer strong")).to_have_text("at most once per cooldown")
    assert turn.locator(".answer li").count() == 2
    assert turn.locator(".answer table td").count() == 2
    ui.expect(turn.locator(".usage")).to_contain_text("tokens")
    ui.expect(turn.locator(".usage")).to_contain_text("local/scripted")
    # who wrote it: the model, by name, next to the answer
    ui.expect(turn).to_have_attribute("data-answered-by", "model")
    ui.expect(turn.locator(".author")).to_have_text("Written by local/scripted")
    # the footnote opens the cited section's snippet, from the response alone
    before = len(ui.requests)
    turn.locator("a.cite").first.click()
    pane = ui.page.locator("#source-pane")
    ui.expect(pane).to_be_visible()
    ui.expect(pane.locator("#source-title")).to_contain_text("Cooldown")
    ui.expect(pane.locator("#source-snippet")).to_contain_text("at most once per cooldown")
    ui.expect(pane.locator("#source-meta")).to_contain_text(chunk)
    assert ui.requests[before:] == []  # nothing fetched to show it
    assert not [line for line in ui.console if line.startswith(("error", "pageerror"))]


def test_an_off_topic_question_is_declined_as_a_state(stack: AgentStack, open_page: Any) -> None:
    question = "Write me a poem about cats (ui)"
    stack.llm.script(
        {"text": "I can only help with CrowdVision: buildings, rooms, occupancy and sensors."},
        key=question,
    )
    ui = open_page()
    turn = ui.ask(question)
    ui.expect(turn).to_have_attribute("data-decision", "declined_out_of_scope")
    ui.expect(turn.locator(".decision")).to_contain_text("Out of scope")
    ui.expect(turn).to_have_attribute("data-state", "done")
    ui.expect(ui.page.locator("#ask-button")).to_be_enabled()


def test_a_provider_error_is_a_clear_state(stack: AgentStack, open_page: Any) -> None:
    question = "What does CV-E1033 mean? (ui provider error)"
    stack.llm.script({"fault": "server_error", "status": 400}, key=question)
    ui = open_page()
    turn = ui.ask(question)
    ui.expect(turn).to_have_attribute("data-decision", "provider_error")
    ui.expect(turn).to_have_attribute("data-state", "error")
    ui.expect(turn.locator(".decision")).to_contain_text("Model provider error")
    ui.expect(turn.locator(".usage")).to_contain_text("tokens")  # what it spent, still shown
    ui.expect(turn.locator(".author")).to_have_text("Written by the service")  # its message


def test_stop_cancels_the_stream_and_the_server_logs_it(stack: AgentStack, open_page: Any) -> None:
    question = "Tell me everything about occupancy alerts (ui stop)"
    long_text = "Occupancy alerts fire when a room passes its threshold. " * 12
    stack.llm.script({"text": long_text, "chunk_chars": 3, "stream_delay_ms": 60}, key=question)
    ui = open_page()
    turn = ui.ask(question)
    ui.expect(turn.locator(".answer")).to_contain_text("Occupancy")
    ui.page.click("#stop-button")
    ui.expect(turn).to_have_attribute("data-state", "stopped")
    ui.expect(turn.locator(".decision")).to_contain_text("Stopped")
    shown = turn.locator(".answer").text_content() or ""
    assert 0 < len(shown) < len(long_text.strip())
    ui.expect(ui.page.locator("#stop-button")).to_be_disabled()
    ui.expect(ui.page.locator("#ask-button")).to_be_enabled()
    assert _wait_for_log(stack, "answer stream cancelled by the client"), "no cancellation logged"
    # the cancelled run stored no turn
    listed = httpx.get(f"{stack.url}/conversations", headers=STAFF, timeout=30).json()
    assert question not in [c["title"] for c in listed["conversations"]]


def test_keyboard_only_ask_source_and_feedback(
    stack: AgentStack, ui_docs_url: str, open_page: Any
) -> None:
    chunk = chunk_id_for(ui_docs_url, "Cooldown: how often")
    question = "What is the default cooldown? (ui keyboard)"
    _script_cited_answer(stack, question, f"The default cooldown is 15 minutes [^{chunk}].")
    ui = open_page()
    page = ui.page
    page.keyboard.press("Tab")  # the skip link first
    assert page.evaluate("() => document.activeElement.className") == "skip-link"
    page.keyboard.press("Enter")
    assert page.evaluate("() => document.activeElement.id") == "question"
    page.keyboard.type(question)
    page.keyboard.press("Enter")
    turn = page.locator(".turn").last
    ui.expect(turn).to_have_attribute("data-state", "done")
    # back from the question box into the answer: to its footnote link
    for _ in range(12):
        page.keyboard.press("Shift+Tab")
        if page.evaluate("() => document.activeElement.classList.contains('cite')"):
            break
    else:
        pytest.fail("the citation link is not reachable with the keyboard")
    page.keyboard.press("Enter")
    ui.expect(page.locator("#source-pane")).to_be_visible()
    assert page.evaluate("() => document.activeElement.id") == "source-pane"
    page.keyboard.press("Escape")
    ui.expect(page.locator("#source-pane")).to_be_hidden()
    assert page.evaluate("() => document.activeElement.classList.contains('cite')")
    # rate it: Tab to "Helpful", Enter, type a comment, Tab to send, Enter
    for _ in range(6):
        page.keyboard.press("Tab")
        if page.evaluate("() => document.activeElement.textContent") == "Helpful":
            break
    page.keyboard.press("Enter")
    page.keyboard.type("Clear and cited.")
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    ui.expect(turn.locator(".feedback-row [role=status]")).to_have_text(
        "Thanks: feedback recorded."
    )
    # the streamed answer is announced: a live region, not busy once done
    assert turn.locator(".answer").get_attribute("aria-live") == "polite"
    assert turn.locator(".answer").get_attribute("aria-busy") == "false"


def test_a_document_and_an_answer_carrying_script_execute_nothing(
    browser: Any, stack: AgentStack, ui_docs_url: str, open_page: Any
) -> None:
    chunk = chunk_id_for(ui_docs_url, "Calibrating the widget")
    question = "How do I calibrate the widget? (ui xss)"
    _script_cited_answer(
        stack, question, f"Calibrate it every 30 days [^{chunk}]. {XSS_TEXT} Then restart."
    )
    ui = open_page()
    turn = ui.ask(question)
    ui.expect(turn).to_have_attribute("data-state", "done")
    turn.locator("a.cite").first.click()
    snippet = ui.page.locator("#source-snippet")
    ui.expect(snippet).to_contain_text("<script>")  # shown as text
    ui.expect(turn.locator(".answer")).to_contain_text("<script>")
    # and again without the CSP, so the sanitising alone is what stops it
    bare = open_page(bypass_csp=True)
    bare.page.locator(".thread-open", has_text="calibrate the widget").first.click()
    ui.expect(bare.page.locator(".turn").last).to_have_attribute("data-state", "done")
    bare.page.locator(".turn a.cite").first.click()
    ui.expect(bare.page.locator("#source-snippet")).to_contain_text("onerror")
    for page in (ui, bare):
        page.page.wait_for_timeout(300)  # give an onerror its chance to fire
        assert page.page.evaluate("() => window.__xss") is None
        assert page.page.locator(".answer script, .answer img, #source-pane img").count() == 0
        assert not [line for line in page.console if "Content Security Policy" in line]


def test_dev_sign_in_shows_what_each_role_may_use(stack: AgentStack, open_page: Any) -> None:
    ui = open_page(extra_http_headers={})  # no mesh: the development sign-in
    page = ui.page
    ui.expect(page.locator("#dev-sign-in")).to_be_visible()
    ui.expect(page.locator(".dev-badge")).to_have_text("DEV sign-in")
    page.select_option("#dev-user", "nina")
    page.click("#dev-sign-in-button")
    ui.expect(page.locator("#who")).to_contain_text("nina · business_staff · northwind")
    ui.expect(page.locator("#model-picker")).to_be_hidden()
    ui.expect(page.locator("#admin-panel")).to_be_hidden()
    cookie = next(c for c in ui.context.cookies() if c["name"] == "authentication_token")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert page.evaluate("() => document.cookie") == ""  # not readable by a script
    page.select_option("#dev-user", "bram")
    page.click("#dev-sign-in-button")
    ui.expect(page.locator("#who")).to_contain_text("bram · business_admin")
    ui.expect(page.locator("#model-picker")).to_be_visible()
    options = page.locator("#model option").all_text_contents()
    assert options == ["local/scripted", "local/other"]
    ui.expect(page.locator("#admin-panel")).to_be_hidden()
    page.select_option("#dev-user", "eve")
    page.click("#dev-sign-in-button")
    ui.expect(page.locator("#admin-panel")).to_be_visible()
    page.click("#dev-sign-out-button")
    ui.expect(page.locator("#who")).to_have_text("Not signed in")
    ui.expect(page.locator("#ask-button")).to_be_disabled()


def test_dev_sign_in_is_absent_when_auth_is_on(browser: Any, tmp_path: Path) -> None:
    """Production settings (REQUIRE_AUTH on, no EVAL_JWT_SECRET) on the in-process app."""
    from foundation.settings import Settings
    from local_world.servers import run_in_thread
    from serve_app.api.app import create_app
    from serve_app.authz import load_authorizer
    from tests.serve_app.api.api_helpers import FakeBackend

    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        agent_service_home=tmp_path,
        require_auth=True,
        eval_jwt_secret=None,
        database_url="postgresql://nobody@127.0.0.1:1/none",
    )
    app = create_app(FakeBackend(), settings, load_authorizer())
    with run_in_thread(app) as url:
        ui = Page(browser, url)
        try:
            ui.expect(ui.page.locator("#auth-note")).to_contain_text("mesh")
            ui.expect(ui.page.locator("#dev-sign-in")).to_be_hidden()
            ui.expect(ui.page.locator("#ask-button")).to_be_disabled()
            for path in ("/ui/dev/users", "/ui/dev/sign-in"):
                assert ui.page.request.get(url + path).status == 404
                assert ui.page.request.post(url + path, data={"user": "eve"}).status in (404, 405)
            assert not [c for c in ui.context.cookies() if c["name"] == "authentication_token"]
        finally:
            ui.close()


def test_without_a_secret_the_dev_sign_in_sends_the_claims(browser: Any, tmp_path: Path) -> None:
    """REQUIRE_AUTH=false and no EVAL_JWT_SECRET (in-process app): anonymous at first; the
    dev sign-in hands the page the chosen user's claims, which it sends on every request."""
    from agent.answer import DoneEvent, TokenEvent
    from foundation.settings import Settings
    from local_world.claims import parse_claims
    from local_world.servers import run_in_thread
    from serve_app.api.app import create_app
    from serve_app.authz import load_authorizer
    from tests.serve_app.api.api_helpers import FakeBackend, answer

    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        agent_service_home=tmp_path,
        require_auth=False,
        eval_jwt_secret=None,
        database_url="postgresql://nobody@127.0.0.1:1/none",
    )
    backend = FakeBackend(
        stream_events=[TokenEvent(text="Hello "), DoneEvent(response=answer("Hello Carla."))]
    )
    with run_in_thread(create_app(backend, settings, load_authorizer())) as url:
        ui = Page(browser, url)
        try:
            ui.expect(ui.page.locator("#who")).to_contain_text("Anonymous")
            ui.page.select_option("#dev-user", "carla")
            ui.page.click("#dev-sign-in-button")
            ui.expect(ui.page.locator("#who")).to_contain_text("carla · standard_customer · acme")
            with ui.page.expect_request(lambda r: r.url.endswith("/ask")) as sent:
                turn = ui.ask("Hello? (ui header mode)")
            ui.expect(turn).to_have_attribute("data-state", "done")
            ui.expect(turn.locator(".answer")).to_have_text("Hello Carla.")
            claims = parse_claims(sent.value.headers["x-gateway-claims"])
            assert (claims.sub, claims.roles, claims.domains) == (
                "carla",
                ("standard_customer",),
                ("acme",),
            )
            assert backend.asks[-1][0].sub == "carla"
            assert not ui.context.cookies()  # no token: nothing to mint it with
        finally:
            ui.close()


def _screenshot_dir(tmp_path: Path) -> Path:
    """docs/ui/ when ``UPDATE_SCREENSHOTS=1`` asks for the README's screenshots to be
    rewritten; otherwise ``tmp_path``, so the run leaves the working tree untouched."""
    return SHOTS if os.environ.get("UPDATE_SCREENSHOTS") == "1" else tmp_path


def test_screenshots(stack: AgentStack, ui_docs_url: str, open_page: Any, tmp_path: Path) -> None:
    """docs/ui/*.png (README): an answered, cited question opened from the thread list,
    light and dark, desktop and phone width (into tmp_path unless ``UPDATE_SCREENSHOTS=1``)."""
    chunk = chunk_id_for(ui_docs_url, "Cooldown: how often")
    title = "How long is the alert cooldown, and can each room have its own?"
    _script_cited_answer(
        stack,
        title,
        f"The default cooldown is **15 minutes** [^{chunk}]. Each room keeps its own "
        "cooldown clock, so:\n\n- an alert in one room does not silence another\n"
        "- change the default under *Settings → Alerts*",
    )
    nina = {"authorization": f"Bearer {mint_eval_token(SECRET, 'nina', NINA[0], NINA[1])}"}
    asked = httpx.post(f"{stack.url}/ask", json={"question": title}, headers=nina, timeout=60)
    assert asked.status_code == 200, asked.text
    shots = _screenshot_dir(tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    for scheme in ("light", "dark"):
        for name, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
            ui = open_page(color_scheme=scheme, viewport=viewport, extra_http_headers={})
            ui.page.select_option("#dev-user", "nina")
            ui.page.click("#dev-sign-in-button")
            ui.expect(ui.page.locator("#who")).to_contain_text("nina")
            ui.page.locator(".thread-open", has_text=title).first.click()
            ui.expect(ui.page.locator(".turn").last).to_have_attribute("data-state", "done")
            ui.page.locator(".turn a.cite").first.click()
            ui.expect(ui.page.locator("#source-pane")).to_be_visible()
            if name == "phone":
                ui.page.locator(".turn").last.scroll_into_view_if_needed()
            ui.page.screenshot(path=str(shots / f"chat-{name}-{scheme}.png"), full_page=True)
            width = ui.page.evaluate("() => document.documentElement.scrollWidth")
            assert width <= viewport["width"], f"{name}: {width}px wide"  # no sideways scroll


def test_a_thread_continues_then_is_deleted(stack: AgentStack, open_page: Any) -> None:
    question = "What is Harbor Warehouse? (ui thread)"
    stack.llm.script(
        {"text": "Harbor Warehouse is Northwind's warehouse."},
        {"text": "It has two floors."},
        key=question,
    )
    ui = open_page()
    page = ui.page
    ui.expect(ui.ask(question)).to_have_attribute("data-state", "done")
    item = page.locator(".thread", has_text="(ui thread)")
    ui.expect(item.locator(".thread-open")).to_have_attribute("aria-current", "true")
    second = ui.ask("And how many floors?")
    ui.expect(second).to_have_attribute("data-state", "done")
    ui.expect(second.locator(".answer")).to_have_text("It has two floors.")
    assert page.locator(".turn").count() == 2  # the same thread, continued
    listed = httpx.get(f"{stack.url}/conversations", headers=STAFF, timeout=30).json()
    (thread,) = [c for c in listed["conversations"] if c["title"] == question]
    assert thread["turn_count"] == 2
    delete = item.locator(".thread-delete")
    delete.click()
    ui.expect(delete).to_have_text("Confirm delete")
    delete.click()
    ui.expect(page.locator(".thread", has_text="(ui thread)")).to_have_count(0)
    ui.expect(page.locator(".turn")).to_have_count(0)  # a new chat
    gone = httpx.get(f"{stack.url}/conversations/{thread['id']}", headers=STAFF, timeout=30)
    assert gone.status_code == 404


def test_an_admin_starts_an_ingestion_run_from_the_panel(stack: AgentStack, open_page: Any) -> None:
    """Last: the run (a Ray job over this module's two pages) goes on after the test."""
    import re

    ui = open_page(extra_http_headers={})
    ui.page.select_option("#dev-user", "eve")
    ui.page.click("#dev-sign-in-button")
    ui.expect(ui.page.locator("#admin-panel")).to_be_visible()
    ui.page.click("#ingest-start")
    status = ui.page.locator("#ingest-status")
    ui.expect(status).to_have_text(re.compile(r"^ingest-\w+: (pending|running|succeeded)"))
    run_id = (status.text_content() or "").split(":")[0]
    eve = {"authorization": f"Bearer {mint_eval_token(SECRET, 'eve', ['admin'], ['acme'])}"}
    run = httpx.get(f"{stack.url}/ingest/{run_id}", headers=eve, timeout=30)
    assert run.status_code == 200 and run.json()["run_id"] == run_id


# --- the server's logs ---------------------------------------------------------------------------


def _wait_for_log(stack: AgentStack, needle: str, timeout: float = 15) -> bool:
    """Whether ``needle`` appears in a log file of the stack's Ray cluster (the Ingress
    replica's own log, or its worker's stderr), read through Ray's state API."""
    import ray
    from ray.util.state import get_log, list_logs

    node = ray.get_runtime_context().get_node_id()  # one node: the head
    # Only this stack's Ingress replicas (their log and their workers' output): the session's
    # shared cluster keeps the logs of the applications deployed before this one.
    ingress = replica_actors("Ingress", stack.app)
    tags = {str(actor.name).rsplit("#", 1)[-1] for actor in ingress}
    pids = {str(actor.pid) for actor in ingress}

    def ours(name: str) -> bool:
        base = name.rsplit("/", 1)[-1]
        if "Ingress" in base:
            return any(tag in base for tag in tags)
        return base.startswith("worker-") and base.rsplit(".", 1)[0].rsplit("-", 1)[-1] in pids

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = list_logs(address=stack.address, node_id=node) or {}
        names = [name for group in files.values() for name in group if ours(name)]
        for name in names:
            try:
                text = "".join(
                    get_log(address=stack.address, node_id=node, filename=name, tail=2000)
                )
            except Exception:
                continue
            if needle in text:
                return True
        time.sleep(1)
    return False
