"""LOCAL_LLM_* settings: defaults, environment, overrides, errors naming the variable."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from serve_app.local_llm.settings import LocalLLMConfigError, LocalLLMSettings


def test_defaults() -> None:
    settings = LocalLLMSettings.from_env({})
    assert settings == LocalLLMSettings()
    assert settings.home == Path(".agent-service")
    assert settings.model_path is None
    assert settings.model_name == "qwen2.5-coder-1.5b-instruct"
    assert (settings.context, settings.parallel, settings.route_prefix) == (4096, 1, "/llm")
    cores = min(2, len(os.sched_getaffinity(0)))
    assert (settings.threads, settings.effective_batch_threads) == (cores, cores)
    assert settings.models_dir == Path(".agent-service/models")


def test_environment_then_overrides() -> None:
    env = {
        "AGENT_SERVICE_HOME": "/srv/agent",
        "LOCAL_LLM_MODEL_PATH": "/models/x.gguf",
        "LOCAL_LLM_THREADS": "1",
        "LOCAL_LLM_BATCH_THREADS": "2",
        "LOCAL_LLM_CONTEXT": "8192",
        "LOCAL_LLM_PARALLEL": "2",
        "LOCAL_LLM_ROUTE_PREFIX": "/models/",
        "LOCAL_LLM_NUM_CPUS": "0.25",
        "LOCAL_LLM_TIMEOUT_SECONDS": "30",
        "LOCAL_LLM_MODEL_NAME": "mine",
        "LOCAL_LLM_PORT": "ignored",
    }
    settings = LocalLLMSettings.from_env(env)
    assert settings.home == Path("/srv/agent")
    assert settings.model_path == Path("/models/x.gguf")
    assert (settings.threads, settings.effective_batch_threads) == (1, 2)
    assert (settings.context, settings.parallel) == (8192, 2)
    assert settings.route_prefix == "/models"
    assert (settings.num_cpus, settings.timeout_seconds) == (0.25, 30.0)
    assert settings.model_name == "mine"
    overridden = LocalLLMSettings.from_env(env, threads=2, context="2048", model_path=None)
    assert (overridden.threads, overridden.context) == (2, 2048)
    assert overridden.model_path == Path("/models/x.gguf")  # None overrides nothing


def test_empty_values_count_as_unset() -> None:
    assert LocalLLMSettings.from_env({"LOCAL_LLM_THREADS": " ", "LOCAL_LLM_MODEL_PATH": ""}) == (
        LocalLLMSettings()
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LOCAL_LLM_THREADS": "two"}, "LOCAL_LLM_THREADS: expected an integer"),
        ({"LOCAL_LLM_THREADS": "0"}, "LOCAL_LLM_THREADS: must be at least 1"),
        ({"LOCAL_LLM_BATCH_THREADS": "0"}, "LOCAL_LLM_BATCH_THREADS"),
        ({"LOCAL_LLM_CONTEXT": "100"}, "LOCAL_LLM_CONTEXT"),
        ({"LOCAL_LLM_PARALLEL": "0"}, "LOCAL_LLM_PARALLEL"),
        ({"LOCAL_LLM_ROUTE_PREFIX": "llm"}, "LOCAL_LLM_ROUTE_PREFIX: must start with '/'"),
        ({"LOCAL_LLM_NUM_CPUS": "lots"}, "LOCAL_LLM_NUM_CPUS: expected a number"),
        ({"LOCAL_LLM_TIMEOUT_SECONDS": "0"}, "LOCAL_LLM_TIMEOUT_SECONDS"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(LocalLLMConfigError, match=message):
        LocalLLMSettings.from_env(env)


def test_unknown_override_is_refused() -> None:
    with pytest.raises(LocalLLMConfigError, match="unknown local LLM setting 'thread'"):
        LocalLLMSettings.from_env({}, thread=1)


def test_resolved_paths_and_dict_round_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    settings = LocalLLMSettings(home=Path("home"), model_path=Path("m.gguf"), threads=1)
    resolved = settings.resolved()
    assert resolved.home == tmp_path / "home"
    assert resolved.model_path == tmp_path / "m.gguf"
    data = resolved.to_dict()
    assert data["home"] == str(tmp_path / "home")
    assert LocalLLMSettings.from_env({}, **data) == resolved


# --- several models: LOCAL_LLM_MODELS ----------------------------------------------------------

BIG = "qwen2.5-coder-1.5b-instruct"
SMALL = "qwen2.5-coder-0.5b-instruct"


def test_one_model_by_default() -> None:
    settings = LocalLLMSettings.from_env({})
    assert settings.models == ()
    assert settings.served_models == (BIG,)
    assert LocalLLMSettings.from_env({"LOCAL_LLM_MODEL_NAME": "mine"}).served_models == ("mine",)


def test_models_are_listed_in_order_and_normalised() -> None:
    env = {"LOCAL_LLM_MODELS": f" {BIG} , LOCAL/Qwen2.5-Coder-0.5B-Instruct,"}
    settings = LocalLLMSettings.from_env(env)
    assert settings.models == (BIG, SMALL)
    assert settings.served_models == (BIG, SMALL)
    assert LocalLLMSettings.from_env({"LOCAL_LLM_MODELS": SMALL}).served_models == (SMALL,)
    assert LocalLLMSettings.from_env({}, models=[SMALL, BIG]).served_models == (SMALL, BIG)
    assert LocalLLMSettings.from_env({}, models=f"{SMALL},{BIG}").models == (SMALL, BIG)
    assert LocalLLMSettings.from_env({"LOCAL_LLM_MODELS": " , "}).models == ()  # unset


def test_model_name_may_repeat_a_listed_model() -> None:
    env = {"LOCAL_LLM_MODELS": f"{SMALL},{BIG}", "LOCAL_LLM_MODEL_NAME": f"local/{SMALL}"}
    assert LocalLLMSettings.from_env(env).served_models == (SMALL, BIG)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"LOCAL_LLM_MODELS": f"{BIG},gpt-4o-mini"},
            rf"LOCAL_LLM_MODELS: unknown model 'gpt-4o-mini'; the packaged models are {BIG}, "
            rf"{SMALL} \(a GGUF file of your own: LOCAL_LLM_MODEL_PATH",
        ),
        (
            {"LOCAL_LLM_MODELS": f"{SMALL},local/{SMALL.upper()}"},
            f"LOCAL_LLM_MODELS: '{SMALL}' is listed twice",
        ),
        (
            {"LOCAL_LLM_MODELS": SMALL, "LOCAL_LLM_MODEL_PATH": "/m.gguf"},
            "LOCAL_LLM_MODELS: cannot be combined with LOCAL_LLM_MODEL_PATH",
        ),
        (
            {"LOCAL_LLM_MODELS": SMALL, "LOCAL_LLM_MODEL_NAME": "mine"},
            r"LOCAL_LLM_MODEL_NAME: 'mine' is not one of LOCAL_LLM_MODELS \(qwen2.5-coder-0.5b",
        ),
    ],
)
def test_bad_model_lists_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(LocalLLMConfigError, match=message):
        LocalLLMSettings.from_env(env)


def test_a_non_list_is_refused() -> None:
    with pytest.raises(LocalLLMConfigError, match="LOCAL_LLM_MODELS: must be a comma-separated"):
        LocalLLMSettings(models=(BIG, 5))  # type: ignore[arg-type]


def test_for_model_gives_a_single_model_deployment_its_settings(tmp_path: Path) -> None:
    settings = LocalLLMSettings.from_env(
        {"LOCAL_LLM_MODELS": f"{BIG},{SMALL}", "LOCAL_LLM_THREADS": "2"}, home=tmp_path
    )
    small = settings.for_model(SMALL)
    assert (small.model_name, small.models, small.served_models) == (SMALL, (), (SMALL,))
    assert (small.threads, small.home) == (2, tmp_path)
    with pytest.raises(LocalLLMConfigError, match="'mine' is not served"):
        settings.for_model("mine")
    custom = LocalLLMSettings(model_path=tmp_path / "m.gguf", model_name="mine")
    assert custom.for_model("mine") == custom


def test_models_round_trip_through_a_dict() -> None:
    settings = LocalLLMSettings.from_env({"LOCAL_LLM_MODELS": f"{SMALL},{BIG}"})
    data = settings.to_dict()
    assert data["models"] == [SMALL, BIG]
    assert LocalLLMSettings.from_env({}, **data) == settings
