"""``ToolError``: a tool failure the model can act on."""

from __future__ import annotations


class ToolError(Exception):
    """A failure the model can act on; ``str(error)`` is what the model reads."""
