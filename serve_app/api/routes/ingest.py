"""``POST /ingest`` and ``GET /ingest/{run_id}``: admin only (Cedar ``IngestDocuments``).

``POST`` starts a run over the server's configured DOC_ROOTS and answers ``202`` with the
run (``Location`` points at its status); ``409`` while another run is still going. ``GET``
reports its status, progress (``{"done", "total"}`` documents) and, when finished, the
counts; ``404`` for an unknown run id.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body
from fastapi.responses import JSONResponse

from serve_app.api.deps import BackendDep, IngestAdmin, SettingsDep
from serve_app.api.errors import ApiError, error_responses
from serve_app.backend import IngestRequest, IngestRun

router = APIRouter(tags=["ingest"])


@router.post(
    "/ingest",
    status_code=202,
    response_model=IngestRun,
    responses=error_responses(401, 403, 409, 413, 422, 500, 503),
    summary="Start an ingestion run over DOC_ROOTS (admin only)",
)
async def start_ingest(
    user: IngestAdmin,
    backend: BackendDep,
    settings: SettingsDep,
    body: Annotated[IngestRequest | None, Body()] = None,
) -> JSONResponse:
    run = await backend.start_ingest(user, body or IngestRequest())
    location = f"{settings.api_prefix}/ingest/{run.run_id}"
    return JSONResponse(
        run.model_dump(mode="json"), status_code=202, headers={"location": location}
    )


@router.get(
    "/ingest/{run_id}",
    response_model=IngestRun,
    responses=error_responses(401, 403, 404, 422, 500, 503),
    summary="Status, progress and counts of an ingestion run (admin only)",
)
async def ingest_status(run_id: str, user: IngestAdmin, backend: BackendDep) -> IngestRun:
    run = await backend.ingest_status(run_id)
    if run is None:
        raise ApiError(404, f"no ingestion run {run_id[:100]!r}", code="not_found")
    return run
