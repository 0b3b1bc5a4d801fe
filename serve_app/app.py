"""Deprecated: the Serve graph is ``deployments.graph:build_app``.

This alias keeps a ``serve_config.yaml`` written before the move
(``import_path: serve_app.app:build_app``) deploying. It resolves the graph by name when the
attribute is read, the way Serve resolves an ``import_path`` itself, so the application
package holds no import of the layer above it; nothing in the project uses it, and reading it
logs a deprecation warning naming the new path.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

__all__ = ["NEW_IMPORT_PATH"]  # build_app is resolved by name (__getattr__)

NEW_IMPORT_PATH = "deployments.graph:build_app"

log = logging.getLogger(__name__)


def __getattr__(name: str) -> Any:
    if name != "build_app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    log.warning(
        "import_path serve_app.app:build_app is deprecated; use %s in serve_config.yaml",
        NEW_IMPORT_PATH,
    )
    module, attribute = NEW_IMPORT_PATH.split(":")
    return getattr(importlib.import_module(module), attribute)
