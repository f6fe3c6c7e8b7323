"""Settings read from the environment, checked where they are read."""

from __future__ import annotations

import os


def int_env(name: str, default: int, *, minimum: int) -> int:
    """Integer setting ``name`` from the environment (``default`` when unset or empty);
    ValueError naming the variable when it is malformed or below ``minimum``."""
    text = os.environ.get(name, "")
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"${name} must be an integer, got {text!r}") from None
    if value < minimum:
        raise ValueError(f"${name} must be at least {minimum}, got {value}")
    return value
