"""``agent-service serve``'s deployment plan (no Ray): the environment every replica gets, and
how the local LLM's models become the agent's answer model and override allowlist."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from foundation.settings import Settings
from serve_app.runner import (
    LOCAL_LLM_APP,
    SERVE_QUIET_DEFAULTS,
    RunnerError,
    RunState,
    deploy_config,
    ensure_ray_auth_token,
    local_model_allowlist,
    local_world_name,
    ray_env,
    service_env,
    start_simulators,
)

BIG = "qwen2.5-coder-1.5b-instruct"
SMALL = "qwen2.5-coder-0.5b-instruct"
MakeSettings = Callable[..., Settings]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in (
        "LOCAL_LLM_MODELS",
        "LOCAL_LLM_MODEL_NAME",
        "LOCAL_LLM_MODEL_PATH",
        "ALLOWED_MODELS",
        "ANSWER_MODEL",
        "LOCAL_WORLD_FILE",
    ):
        monkeypatch.delenv(variable, raising=False)


def test_the_local_llm_answers_with_its_model_and_allows_only_it(
    settings_factory: MakeSettings,
) -> None:
    env = service_env(settings_factory(), local_llm=True)
    assert env["LLM_BASE_URL"] == "http://127.0.0.1:8000/llm/v1"
    assert env["TOOL_CALLING_MODE"] == "json_schema"
    assert env["ANSWER_MODEL"] == BIG
    assert env["ALLOWED_MODELS"] == f"{BIG},local/{BIG}"


def test_two_local_models_are_both_allowed(
    settings_factory: MakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_LLM_MODELS", f"{BIG},{SMALL}")
    env = service_env(settings_factory(), local_llm=True)
    assert env["ANSWER_MODEL"] == BIG
    assert env["ALLOWED_MODELS"].split(",") == [BIG, SMALL, f"local/{BIG}", f"local/{SMALL}"]
    assert env["LOCAL_LLM_MODELS"] == f"{BIG},{SMALL}"  # the LLM app reads the same list
    assert local_model_allowlist((SMALL,)) == [SMALL, f"local/{SMALL}"]


def test_the_first_listed_model_is_the_answer_model(
    settings_factory: MakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_LLM_MODELS", f"local/{SMALL}, {BIG}")
    assert service_env(settings_factory(), local_llm=True)["ANSWER_MODEL"] == SMALL


def test_an_allowlist_the_user_set_is_kept(
    settings_factory: MakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_LLM_MODELS", f"{BIG},{SMALL}")
    monkeypatch.setenv("ALLOWED_MODELS", f"local/{SMALL}")
    env = service_env(settings_factory(allowed_models=[f"local/{SMALL}"]), local_llm=True)
    assert env["ALLOWED_MODELS"] == f"local/{SMALL}"


def test_a_provider_leaves_the_models_alone(
    settings_factory: MakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_LLM_MODELS", f"{BIG},{SMALL}")
    env = service_env(settings_factory(), local_llm=False)
    assert "ANSWER_MODEL" not in env and "ALLOWED_MODELS" not in env


def test_a_bad_model_list_is_a_runner_error_naming_the_variable(
    settings_factory: MakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_LLM_MODELS", "qwen2.5-coder-7b-instruct")
    with pytest.raises(
        RunnerError,
        match=r"LOCAL_LLM_MODELS: unknown model 'qwen2\.5-coder-7b-instruct'; the packaged",
    ):
        service_env(settings_factory(), local_llm=True)


def test_the_deployed_config_adds_the_llm_app_with_the_models(
    settings_factory: MakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_LLM_MODELS", f"{BIG},{SMALL}")
    config = deploy_config(settings_factory(), local_llm=True)
    apps: dict[str, Any] = {app["name"]: app for app in config["applications"]}
    llm = apps[LOCAL_LLM_APP["name"]]
    assert llm["import_path"] == "deployments.local_llm:build_local_llm_app"
    assert llm["runtime_env"]["env_vars"]["LOCAL_LLM_MODELS"] == f"{BIG},{SMALL}"
    agent_env = apps["agent"]["runtime_env"]["env_vars"]
    assert agent_env["ANSWER_MODEL"] == BIG
    assert SMALL in agent_env["ALLOWED_MODELS"].split(",")


def test_ray_runs_serve_quietly_unless_the_environment_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in SERVE_QUIET_DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    env = ray_env()
    assert env["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"] == "1"
    assert env["RAY_SERVE_METRICS_EXPORT_INTERVAL_MS"] == "1000"
    monkeypatch.setenv("RAY_SERVE_CONTROL_LOOP_INTERVAL_S", "0.1")
    assert ray_env()["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"] == "0.1"


def test_a_fresh_machine_gets_a_ray_auth_token_once(tmp_path: Path) -> None:
    """``ray start`` in token mode refuses to start without one (``make run`` on a fresh
    machine failed so); the token is written to the file and never printed."""
    env = {**ray_env(), "HOME": str(tmp_path)}
    env.pop("RAY_AUTH_TOKEN", None)
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    ensure_ray_auth_token(env)
    token_file = tmp_path / ".ray" / "auth_token"
    token = token_file.read_text()
    assert len(token.strip()) >= 32
    ensure_ray_auth_token(env)  # an existing token is kept
    assert token_file.read_text() == token


def test_an_operators_token_is_left_alone(tmp_path: Path) -> None:
    for given in ({"RAY_AUTH_TOKEN": "x" * 32}, {"RAY_AUTH_TOKEN_PATH": str(tmp_path / "t")}):
        ensure_ray_auth_token({**ray_env(), "HOME": str(tmp_path), **given})
    ensure_ray_auth_token({**ray_env(), "HOME": str(tmp_path), "RAY_AUTH_MODE": "disabled"})
    assert not (tmp_path / ".ray").exists()


def test_simulators_started_before_a_failed_ray_start_stay_stoppable(
    settings_factory: MakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, a failed ``ray start`` lost the simulators' pid: they kept the ports, the next
    ``serve`` adopted them as someone else's, and ``stop`` never ended them."""
    import serve_app.runner as runner

    settings = settings_factory()
    settings.home.mkdir(parents=True, exist_ok=True)

    def started(_: Settings, state: runner.RunState) -> None:
        state.simulator_pid = 424242

    def ray_fails(_: Settings, __: runner.RunState) -> None:
        raise RunnerError("`ray start` failed")

    monkeypatch.setattr(runner, "start_simulators", started)
    monkeypatch.setattr(runner, "start_ray", ray_fails)
    with pytest.raises(RunnerError):
        runner.serve(settings, simulators=True, local_llm=False)
    assert runner.load_state(settings).simulator_pid == 424242


def test_the_world_file_reaches_the_simulators_and_the_replicas_absolute(
    settings_factory: MakeSettings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """LOCAL_WORLD_FILE is relative to where ``serve`` runs; the simulators run in the
    project and the replicas on the Ray node, so both get it absolute."""
    import subprocess

    import httpx

    import serve_app.runner as runner

    project = Path(runner.__file__).resolve().parent.parent
    monkeypatch.chdir(project)
    settings = settings_factory(local_world_file="local_world/worlds/second.yaml")
    second = project / "local_world" / "worlds" / "second.yaml"
    assert service_env(settings, local_llm=False)["LOCAL_WORLD_FILE"] == str(second)
    assert "LOCAL_WORLD_FILE" not in service_env(settings_factory(), local_llm=False)
    assert local_world_name(settings) == "second" and local_world_name(settings_factory()) == (
        "sample"
    )

    commands: list[list[str]] = []

    class Started:
        pid = 4242

        def __init__(self, command: list[str], **_: object) -> None:
            commands.append(command)

        def poll(self) -> None:
            return None

    answers = iter([httpx.ConnectError("down"), httpx.Response(401)])

    def get(url: str, **_: object) -> httpx.Response:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(subprocess, "Popen", Started)
    monkeypatch.setattr(httpx, "get", get)
    settings.home.joinpath("run").mkdir(parents=True)
    state = RunState()
    start_simulators(settings, state)
    assert state.simulator_pid == 4242
    assert commands[0][-2:] == ["--world", str(second)]


def test_a_bad_world_file_stops_serve_naming_the_file_and_field(
    settings_factory: MakeSettings, tmp_path: Path
) -> None:
    bad = tmp_path / "world.yaml"
    bad.write_text("name: broken\nseed: many\n", encoding="utf-8")
    with pytest.raises(RunnerError) as caught:
        start_simulators(settings_factory(local_world_file=bad), RunState())
    message = str(caught.value)
    assert message.startswith(f"LOCAL_WORLD_FILE: {bad}: not a valid local world")
    assert "seed: Input should be a valid integer" in message
    assert "installations: Field required" in message
