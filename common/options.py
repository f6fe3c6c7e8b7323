"""Defaults of options dataclasses, read by the command lines: a dataclass field owns its default,
and the flag that sets it takes the default from there instead of writing it a second time."""

from __future__ import annotations

import dataclasses
from typing import Any


def field_default(cls: type, name: str) -> Any:
    """The default of dataclass ``cls``'s field ``name`` (a ``default_factory``'s value for a
    field with one); ValueError for a field without a default or a name that is not a field."""
    for field in dataclasses.fields(cls):
        if field.name != name:
            continue
        if field.default is not dataclasses.MISSING:
            return field.default
        if field.default_factory is not dataclasses.MISSING:
            return field.default_factory()
        raise ValueError(f"{cls.__name__}.{name} has no default")
    raise ValueError(f"{cls.__name__} has no field {name!r}")
