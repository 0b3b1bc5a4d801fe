"""Shared helpers for the evals tests: canned ``/ask`` answers, a fake of the service
(verifying the eval token like the real ingress) served either in-process through an
``httpx.MockTransport`` (no sockets) or as a tiny real-HTTP app on 127.0.0.1, and a dataset
writer."""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from agent.answer import AgentAnswer
from foundation.settings import Settings
from local_world.servers import run_in_thread
from serve_app.auth import AuthenticationError, verify_eval_token

SECRET = "evals-test-secret-0123456789abcdef0123"


def answer(text: str = "The cooldown is 10 minutes.", **fields: Any) -> AgentAnswer:
    """An ``AgentAnswer`` with sensible defaults; ``fields`` override any member."""
    values: dict[str, Any] = {
        "answer": text,
        "decision": "answered",
        "answered_by": "model",
        "model": "local/scripted",
    }
    values.update(fields)
    return AgentAnswer.model_validate(values)


def citation(source: str, snippet: str = "snippet", chunk_id: str = "c1") -> dict[str, Any]:
    return {"chunk_id": chunk_id, "source": source, "section": None, "snippet": snippet}


def call(name: str, ok: bool = True, error: str | None = None, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments, "ok": ok, "error": error, "duration_ms": 3.0}


@dataclass
class FakeService:
    """Canned replies per question: ``(status, JSON body)``; records who asked what."""

    replies: dict[str, tuple[int, Any]] = field(default_factory=dict)
    asked: list[dict[str, Any]] = field(default_factory=list)
    ready: bool = True
    delay_s: float = 0.0
    in_flight: int = 0
    max_in_flight: int = 0

    def reply(self, question: str, body: AgentAnswer | dict[str, Any], status: int = 200) -> None:
        data = body.model_dump(mode="json") if isinstance(body, AgentAnswer) else body
        self.replies[question] = (status, data)


def create_fake_app(service: FakeService) -> FastAPI:
    app = FastAPI()

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        if service.ready:
            return JSONResponse({"ready": True, "checks": []})
        checks = [{"name": "database", "ok": False, "detail": "unreachable (OSError)"}]
        return JSONResponse({"ready": False, "checks": checks}, status_code=503)

    @app.post("/ask")
    async def ask(request: Request) -> JSONResponse:
        _scheme, _, token = request.headers.get("authorization", "").partition(" ")
        try:
            user = verify_eval_token(token, SECRET)
        except AuthenticationError as exc:
            body = {"error": {"code": "unauthenticated", "message": exc.message}}
            return JSONResponse(body, status_code=401)
        payload = await request.json()
        service.asked.append(
            {**payload, "sub": user.sub, "roles": user.roles, "domains": user.domains}
        )
        service.in_flight += 1
        service.max_in_flight = max(service.max_in_flight, service.in_flight)
        try:
            await asyncio.sleep(service.delay_s)
        finally:
            service.in_flight -= 1
        status, body = service.replies.get(
            payload["question"],
            (500, {"error": {"code": "internal_error", "message": "internal server error"}}),
        )
        return JSONResponse(body, status_code=status)

    return app


def mock_transport(service: FakeService) -> httpx.MockTransport:
    """The same fake as ``create_fake_app``, in-process: ``run_eval(..., transport=...)``."""

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/readyz"):
            return httpx.Response(200 if service.ready else 503, json={"checks": []})
        _scheme, _, token = request.headers.get("authorization", "").partition(" ")
        try:
            user = verify_eval_token(token, SECRET)
        except AuthenticationError as exc:
            body = {"error": {"code": "unauthenticated", "message": exc.message}}
            return httpx.Response(401, json=body)
        payload = json.loads(request.content)
        service.asked.append({**payload, "sub": user.sub})
        status, body = service.replies.get(payload["question"], (500, {"error": {}}))
        return httpx.Response(status, json=body)

    return httpx.MockTransport(handle)


@contextmanager
def fake_service(service: FakeService) -> Iterator[str]:
    with run_in_thread(create_fake_app(service)) as url:
        yield url


def write_dataset(directory: Path, text: str, name: str = "golden.yaml") -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


def settings(tmp_path: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "agent_service_home": tmp_path / "home",
        "eval_jwt_secret": SECRET,
        "answer_model": "local/scripted",
        "llm_base_url": "http://127.0.0.1:9/v1",
    }
    values.update(overrides)
    return Settings(**values)
