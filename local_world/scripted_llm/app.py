"""The FastAPI app: OpenAI's endpoints, a health check and the control endpoints."""

from __future__ import annotations

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from local_world._service import FASTAPI_TELEMETRY_OFF
from local_world._service import ApiError as _ApiError
from local_world.scripted_llm.chat import chat_completion
from local_world.scripted_llm.context import ServerContext
from local_world.scripted_llm.control import add_fault_and_log_routes, add_script_routes
from local_world.scripted_llm.embeddings import create_embeddings
from local_world.scripted_llm.state import ScriptedLLM


def create_llm_app(llm: ScriptedLLM | None = None) -> FastAPI:
    """The scripted model server. Pass a :class:`ScriptedLLM` to drive it in-process."""
    state = llm if llm is not None else ScriptedLLM()
    app = FastAPI(
        title="local scripted LLM", docs_url=None, redoc_url=None, telemetry=FASTAPI_TELEMETRY_OFF
    )
    app.state.llm = state
    app.add_exception_handler(_ApiError, _api_error)
    _add_openai_routes(app, ServerContext(state))
    add_script_routes(app, state)
    add_fault_and_log_routes(app, state)
    return app


async def _api_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, _ApiError)
    return JSONResponse({"error": {"code": exc.code, "message": exc.message}}, exc.status)


def _add_openai_routes(app: FastAPI, ctx: ServerContext) -> None:
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await chat_completion(ctx, request)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        return await create_embeddings(ctx, request)

    @app.get("/v1/models")
    async def list_models(request: Request) -> Response:
        denied = ctx.check_auth(request)
        if denied is not None:
            return denied
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": m, "object": "model", "created": 0, "owned_by": "local-world"}
                    for m in ctx.state.models
                ],
            }
        )

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "service": "scripted-llm"}
