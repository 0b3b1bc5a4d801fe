"""``GET /healthz`` (the process is up) and ``GET /readyz`` (it can serve: the backend's
checks; ``503`` with the same body when any fails). Neither needs credentials."""

from __future__ import annotations

import logging
from typing import Literal

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from serve_app.api.deps import BackendDep
from serve_app.readiness import Readiness, ReadinessCheck

log = logging.getLogger(__name__)

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: Literal["ok"] = "ok"


@router.get("/healthz", response_model=Health, summary="Liveness: the process is up")
async def healthz() -> Health:
    return Health()


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "Not ready: the failing checks"}},
    summary="Readiness: database, schema, embedding dimension, provider",
)
async def readyz(backend: BackendDep) -> JSONResponse:
    try:
        readiness = await backend.readiness()
    except Exception as exc:  # a probe answers 503, never 500
        log.warning("readiness check failed", exc_info=True)
        check = ReadinessCheck(name="backend", ok=False, detail=type(exc).__name__)
        readiness = Readiness(ready=False, checks=[check])
    status = 200 if readiness.ready else 503
    return JSONResponse(readiness.model_dump(mode="json"), status_code=status)
