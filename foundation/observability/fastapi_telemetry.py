"""FastAPI's built-in OpenTelemetry (FastAPI >= 0.165) switched off for our apps: their traces
are the agent's span tree, rooted at ``agent.answer`` (an automatic ``POST /ask`` server span
would be a second root), and its exception logs could carry request content."""

from __future__ import annotations

from fastapi.telemetry import TelemetryConfig

FASTAPI_TELEMETRY_OFF: TelemetryConfig = {
    "tracing": False,
    "metrics": False,
    "logs": False,
    "operation_spans": False,
}
