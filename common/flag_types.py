"""How a flag's or its variable's text becomes its value: the argparse types ``common.flags``
generates flags with, and how a default is written in a help."""

from __future__ import annotations

import argparse
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


@dataclass(frozen=True, slots=True, eq=False)
class NoneOr:
    """A flag's type whose ``word`` gives None, and any other text ``parse``'s value."""

    word: str
    parse: Callable[[str], Any]

    def __call__(self, text: str) -> Any:
        if text == self.word:
            return None
        try:
            return self.parse(text)
        except ValueError as e:
            expected = EXPECTED.get(self.parse)
            reason = f"{expected}, got {text!r}" if expected else f"a value: {e}"
            raise argparse.ArgumentTypeError(f"expected {self.word} or {reason}") from None


class Choices(tuple[str, ...]):
    """A flag's choices as the command line spells them, which also holds the values its type
    gives for them (argparse checks those): an enum's members, None for a word."""

    accepted: frozenset[Any]

    def __new__(cls, words: tuple[Any, ...], accepted: tuple[Any, ...]) -> Choices:
        choices = super().__new__(cls, words)
        choices.accepted = frozenset(accepted)
        return choices

    def __contains__(self, value: object) -> bool:
        return value in self.accepted or tuple.__contains__(self, value)


@dataclass(frozen=True, slots=True, eq=False)
class EnumWord:
    """An enum flag's type: the member a word spells."""

    members: Mapping[str, Any]

    def __call__(self, text: str) -> Any:
        if text not in self.members:
            words = ", ".join(self.members)
            raise argparse.ArgumentTypeError(f"expected one of {words}, got {text!r}")
        return self.members[text]


@dataclass(frozen=True, slots=True, eq=False)
class Explained:
    """A flag's own type, whose ValueError argparse shows (it shows only its own message for
    ``int``'s and ``float``'s)."""

    parse: Callable[[str], Any]

    def __call__(self, text: str) -> Any:
        try:
            return self.parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None


def parse_bool(text: str) -> bool:
    """A boolean variable's value: 1/true/yes/on or 0/false/no/off, any case."""
    if text.lower() in TRUE_WORDS:
        return True
    if text.lower() in FALSE_WORDS:
        return False
    raise ValueError(f"expected a boolean, got {text!r}")


# What a variable read by each parser must hold, for the error naming it.
EXPECTED: dict[Callable[[str], Any], str] = {
    int: "an integer",
    float: "a number",
    parse_bool: "a boolean (1/0, true/false)",
}


def shown(value: Any) -> str:
    """A default as the help writes it: 20 for 20.0, off for False, a list comma-separated."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, enum.Enum):
        return str(getattr(value, "label", value.value))
    if isinstance(value, tuple | list):
        return ",".join(str(item) for item in value)
    return str(value)
