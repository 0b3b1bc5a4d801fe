"""LLM_PROVIDER and RETRIEVER: a ``module:function`` factory is loaded by name and builds the
service's model client or retriever; anything else is refused with the variable's name."""

from __future__ import annotations

import pytest

from agent.llm.openai_client import OpenAICompatibleClient
from agent.testing import ScriptedModel
from foundation.settings import Settings, SettingsError, load_settings
from retrieval.search import HybridRetriever
from serve_app.wiring import build_llm_client, build_retriever

EXAMPLES = "serve_app.plugin_examples"  # tests/ is on the path as a package root


def settings(**env: str) -> Settings:
    return Settings(  # type: ignore[call-arg]
        _env_file=None, llm_api_key="test-key", llm_base_url="http://127.0.0.1:9/v1", **env
    )


def test_the_defaults_are_the_openai_client_and_the_hybrid_search() -> None:
    configured = settings()
    assert (configured.llm.provider, configured.retrieval.strategy) == ("openai", "hybrid")
    assert isinstance(build_llm_client(configured), OpenAICompatibleClient)
    assert isinstance(build_retriever(configured, store=None), HybridRetriever)  # type: ignore[arg-type]


def test_a_provider_factory_builds_the_client() -> None:
    configured = settings(llm_provider=f"tests.{EXAMPLES}:scripted_provider")
    client = build_llm_client(configured, model="override")
    assert isinstance(client, ScriptedModel) and client.default_model == "override"


def test_a_retriever_factory_wraps_the_hybrid_search() -> None:
    configured = settings(retriever=f"tests.{EXAMPLES}:tagged_retriever")
    retriever = build_retriever(configured, store=None)  # type: ignore[arg-type]
    assert type(retriever).__name__ == "Tagged"
    assert isinstance(retriever.inner, HybridRetriever)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("variable", "value"),
    [("LLM_PROVIDER", "anthropic"), ("LLM_PROVIDER", "no colon"), ("RETRIEVER", "bm25")],
)
def test_a_value_that_names_no_factory_is_refused_at_load(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError, match=variable):
        load_settings()


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("tests.serve_app.nowhere:factory", "cannot load it"),
        (f"tests.{EXAMPLES}:missing", "cannot load it"),
        (f"tests.{EXAMPLES}:NOT_CALLABLE", "not a function"),
        (f"tests.{EXAMPLES}:not_a_client", "returned str, not an LLMClient"),
    ],
)
def test_a_provider_that_does_not_load_names_the_variable(spec: str, why: str) -> None:
    with pytest.raises(SettingsError, match=f"LLM_PROVIDER={spec}: {why}"):
        build_llm_client(settings(llm_provider=spec))


def test_a_retriever_without_search_names_the_variable() -> None:
    spec = f"tests.{EXAMPLES}:scripted_provider"  # returns a model client, not a retriever
    with pytest.raises(SettingsError, match=f"RETRIEVER={spec}: returned ScriptedModel"):
        build_retriever(settings(retriever=spec), store=None)  # type: ignore[arg-type]
