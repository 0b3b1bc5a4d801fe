"""Deprecated: the Serve graph is ``deployments.graph:build_app``. This alias keeps a
``serve_config.yaml`` written before the move (``import_path: serve_app.app:build_app``)
deploying; nothing in the project imports it."""

from deployments.graph import build_app

__all__ = ["build_app"]
