from __future__ import annotations

from pathlib import Path

import pytest

from foundation.settings import Settings, SettingsError, load_settings


def _load(monkeypatch: pytest.MonkeyPatch, **env: str) -> Settings:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return load_settings(_env_file=None)


def test_defaults_are_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _load(monkeypatch)
    assert s.resolved_embedding_dim == 384
    assert s.rrf_k == 10
    assert s.reranker == "noop"
    assert s.database_url is None
    assert s.agent_service_home.name == ".agent-service"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("TOP_K_FINAL", "many"),
        ("TOP_K_FINAL", "0"),
        ("RRF_K", "-1"),
        ("MAX_TOOL_HOPS", "1000"),
        ("DATABASE_URL", "mysql://db/agent"),
        ("LLM_BASE_URL", "ftp://models.example"),
        ("TWIN_SERVICE_URL", "twin:8080"),
        ("MODEL_OVERRIDE_MIN_ROLE", "superuser"),
        ("LOG_FORMAT", "xml"),
        ("EMBEDDING_DIM", "0"),
        ("EMBEDDING_DTYPE", "float16"),
        ("DOC_ROOTS", "documentation/user=group:ops"),
        ("API_PREFIX", "agent"),
        ("CONVERSATION_MAX_TURNS", "0"),
        ("CONVERSATION_MAX_TURNS", "lots"),
        ("HISTORY_MAX_TOKENS", "-1"),
        ("KEYWORD_RANKING", "bm25"),
        ("INGEST_DEFER_VECTOR_INDEX", "sometimes"),
        ("LOCAL_WORLD_FILE", "local_world/worlds/second.toml"),
    ],
)
def test_bad_values_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    with pytest.raises(SettingsError) as err:
        _load(monkeypatch, **{variable: value})
    assert variable in str(err.value)


def test_secret_never_in_messages_or_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _load(monkeypatch, OPENROUTER_API_KEY="sk-or-very-secret")
    assert s.llm_api_key is not None
    assert s.llm_api_key.get_secret_value() == "sk-or-very-secret"
    assert "very-secret" not in repr(s)
    with pytest.raises(SettingsError) as err:
        _load(monkeypatch, OPENROUTER_API_KEY="sk-or-very-secret", TOP_K_FINAL="x")
    assert "very-secret" not in str(err.value)


@pytest.mark.parametrize("alias", ["LLM_API_KEY", "DEEPSEEK_API_KEY", "GOOGLE_API_KEY"])
def test_legacy_key_aliases(monkeypatch: pytest.MonkeyPatch, alias: str) -> None:
    s = _load(monkeypatch, **{alias: "k-123"})
    assert s.llm_api_key is not None and s.llm_api_key.get_secret_value() == "k-123"


def test_lists_and_case(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _load(
        monkeypatch,
        ALLOWED_MODELS="openai/gpt-4o-mini, google/gemini-2.5-flash",
        CORS_ORIGINS='["http://localhost:3000"]',
        LOG_LEVEL="debug",
        LOG_FORMAT="JSON",
        API_PREFIX="/agent/",
    )
    assert s.allowed_models == ["openai/gpt-4o-mini", "google/gemini-2.5-flash"]
    assert s.cors_origins == ["http://localhost:3000"]
    assert (s.log_level, s.log_format, s.api_prefix) == ("DEBUG", "json", "/agent")


def test_doc_roots_parse_typed_acls(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _load(monkeypatch, DOC_ROOTS="docs/a=,docs/b=role:Admin domain:Acme")
    assert [(str(p), acl) for p, acl in s.doc_root_acls] == [
        ("docs/a", []),
        ("docs/b", ["domain:acme", "role:admin"]),
    ]


def test_local_world_file_names_a_world_file(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _load(monkeypatch).serve.local_world_file is None  # the sample world
    s = _load(monkeypatch, LOCAL_WORLD_FILE="local_world/worlds/second.yaml")
    assert s.serve.local_world_file == Path("local_world/worlds/second.yaml")
    assert _load(monkeypatch, LOCAL_WORLD_FILE=" ").serve.local_world_file is None


def test_embedding_dim_required_for_other_models(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _load(monkeypatch, EMBEDDING_MODEL="/models/other")
    with pytest.raises(SettingsError, match="EMBEDDING_DIM"):
        _ = s.resolved_embedding_dim


def test_cross_encoder_needs_model(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SettingsError, match="RERANKER_MODEL"):
        _load(monkeypatch, RERANKER="cross-encoder")


def test_history_budget_follows_the_tool_calling_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _load(monkeypatch).resolved_history_max_tokens == 4000
    assert _load(monkeypatch, TOOL_CALLING_MODE="json_schema").resolved_history_max_tokens == 256
    set_ = _load(monkeypatch, TOOL_CALLING_MODE="json_schema", HISTORY_MAX_TOKENS="0")
    assert set_.resolved_history_max_tokens == 0


def test_keyword_ranking(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _load(monkeypatch).keyword_ranking == "ts_rank"
    assert _load(monkeypatch, KEYWORD_RANKING="ts_rank_cd").keyword_ranking == "ts_rank_cd"
