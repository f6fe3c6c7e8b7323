"""Environment fallbacks of flags, checked where they are read: only ``cli`` modules call these
(library code takes options, never the environment)."""

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


def float_env(name: str, default: float) -> float:
    """Number setting ``name`` from the environment (``default`` when unset or empty);
    ValueError naming the variable when it is malformed."""
    text = os.environ.get(name, "")
    if not text:
        return default
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"${name} must be a number, got {text!r}") from None
