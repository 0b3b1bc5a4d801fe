"""Field validators shared by the request bodies."""

from __future__ import annotations


def integral(value: object) -> object:
    """``5.0`` is the JSON integer 5 (JSON Schema says so; some clients serialise it that
    way); strict validation would refuse the float. ``5.5``, strings and booleans still fail."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
