"""Tracing, logs and metrics: OpenTelemetry spans with the GenAI conventions and Langfuse's
observation types (``spans``, ``attributes``), per-process setup and exporters (``setup``),
and the measurements the Serve deployments publish as Ray metrics (``metrics``).
See docs/observability.md."""
