"""The control endpoints (loopback only): load and remove scripts, queue embedding faults,
read and clear the request log."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from local_world._service import require_loopback
from local_world.scripted_llm.script import ScriptError
from local_world.scripted_llm.state import ScriptedLLM
from local_world.scripted_llm.wire import read_json


def _invalid_script(message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": "invalid_script", "message": message}}, 400)


def add_script_routes(app: FastAPI, state: ScriptedLLM) -> None:
    @app.post("/_script")
    async def load_script(request: Request) -> Response:
        require_loopback(request)
        body = await read_json(request)
        try:
            script = state.load(body)
        except ScriptError as exc:
            return _invalid_script(str(exc))
        return JSONResponse(
            {"key": script.key, "mode": script.mode, "steps": len(script.steps)}, 201
        )

    @app.get("/_script")
    async def script_progress(request: Request) -> dict[str, Any]:
        require_loopback(request)
        return {"scripts": state.progress()}

    @app.delete("/_script", status_code=204)
    async def delete_script(request: Request) -> Response:
        require_loopback(request)
        if "key" in request.query_params:
            state.remove_script(request.query_params["key"].strip() or None)
        else:
            state.clear_scripts()
        return Response(status_code=204)


def add_fault_and_log_routes(app: FastAPI, state: ScriptedLLM) -> None:
    @app.post("/_embedding_faults", status_code=204)
    async def embedding_faults(request: Request) -> Response:
        require_loopback(request)
        body = await read_json(request)
        faults = body.get("faults") if isinstance(body, dict) else None
        if not isinstance(faults, list) or not all(isinstance(f, dict) for f in faults):
            return _invalid_script("expected {'faults': [...]}")
        try:
            state.queue_embedding_faults(*faults)
        except (ScriptError, KeyError) as exc:
            return _invalid_script(str(exc))
        return Response(status_code=204)

    @app.get("/_requests")
    async def read_requests(request: Request) -> dict[str, Any]:
        require_loopback(request)
        log = state.requests
        return {
            "requests": [entry.to_json() for entry in log],
            "unscripted": sum(1 for entry in log if entry.unscripted),
        }

    @app.delete("/_requests", status_code=204)
    async def clear_requests(request: Request) -> Response:
        require_loopback(request)
        state.clear_requests()
        return Response(status_code=204)
