"""A misspelt flag or command answered with the one meant ("did you mean --model-id?").

Python 3.14's argparse suggests close choices (``suggest_on_error``), 3.11's nothing; every
``epd`` command parses with ``parse_known_args`` and hands what is left to ``reject_unknown``,
which fails as argparse does (usage, the message, exit code 2) with the flag meant added.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterable, Sequence
from typing import NoReturn


def close_match(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``word`` when one is close enough to be the one meant."""
    matches = difflib.get_close_matches(word, list(candidates), n=1)
    return matches[0] if matches else None


def chosen_parser(
    parser: argparse.ArgumentParser, parsed: argparse.Namespace
) -> argparse.ArgumentParser:
    """The innermost (sub)parser ``parsed`` went through: ``epd model tiny``'s for its flags."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            name = getattr(parsed, action.dest, None)
            if name in action.choices:
                subparser: argparse.ArgumentParser = action.choices[name]
                return chosen_parser(subparser, parsed)
    return parser


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every spelling of every flag of ``parser`` (aliases included)."""
    return [option for action in parser._actions for option in action.option_strings]


def unrecognized_message(extras: Sequence[str], options: Iterable[str]) -> str:
    """argparse's "unrecognized arguments: ..." followed by the flag meant by each unknown flag
    of ``extras`` that is close to one of ``options``."""
    options = list(options)
    hints = []
    for argument in extras:
        if not argument.startswith("-"):
            continue
        name = argument.split("=", 1)[0]
        meant = close_match(name, options)
        if meant is not None:
            hints.append((name, meant))
    message = "unrecognized arguments: " + " ".join(extras)
    if len(hints) == 1:
        return f"{message} (did you mean {hints[0][1]}?)"
    if hints:
        meanings = "; ".join(f"{name}: did you mean {meant}?" for name, meant in hints)
        return f"{message} ({meanings})"
    return message


def reject_unknown(
    parser: argparse.ArgumentParser, parsed: argparse.Namespace, extras: Sequence[str]
) -> NoReturn:
    """Exit 2 with the usage of the command ``parsed`` chose and ``unrecognized_message``."""
    chosen = chosen_parser(parser, parsed)
    chosen.error(unrecognized_message(extras, option_strings(chosen)))
