"""A YAML file of flag values for any ``epd`` command (``--config FILE``).

The file is a mapping. Its top-level keys are flags, spelled as on the command line without the
dashes (``max-batch-size`` or ``max_batch_size``), with the value the flag would take: a scalar, a
list for a repeatable flag or one taking several values, ``true``/``false`` for a switch. A
top-level key that names a command (``encode``, ``prefill``, ``up``...) and holds a mapping is
that command's own section. A command applies the top-level keys it has a flag for and then its
section, so one file can configure every service of a deployment (``epd up`` hands it on).

Precedence: flags on the command line, then the flag's ``EPD_*`` variable, then the file, then
the built-in default. The file's values become arguments placed before the command line's, so
argparse itself checks them (types, choices) and a later flag wins.

A key no command has is an error (a typo), a top-level key that another command has is left to
that command; a section's key must be a flag of its command.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

ENV_IN_HELP = re.compile(r"env (EPD_[A-Z0-9_]+)")
# Flags that are not settings a file can give.
NOT_SETTINGS = ("help", "config")


def load_config(path: str | Path) -> dict[str, Any]:
    """The file's mapping; ValueError (naming the file) when it is unreadable or not a mapping."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ValueError(f"--config {path}: {e.strerror or e}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"--config {path}: not valid YAML: {e}") from None
    if document is None:
        return {}
    if not isinstance(document, dict) or not all(isinstance(k, str) for k in document):
        raise ValueError(f"--config {path}: expected a mapping of flag names to values")
    return document


def config_arguments(
    document: Mapping[str, Any],
    command: str,
    parser: argparse.ArgumentParser,
    *,
    commands: Iterable[str],
    environ: Mapping[str, str],
    is_flag_elsewhere: Callable[[str], bool],
) -> list[str]:
    """Command-line arguments for ``command`` (whose flags ``parser`` holds) from ``document``:
    the top-level keys it has, then its section. Keys whose ``EPD_*`` variable is set in
    ``environ`` are skipped (the variable wins). ``is_flag_elsewhere(key)``: whether another
    command has flag ``key`` (called only for top-level keys this one lacks). ValueError names
    the key."""
    commands = set(commands)
    shared: list[tuple[str, Any, argparse.Action]] = []
    section: dict[str, Any] = {}
    for key, value in document.items():
        if key in commands and isinstance(value, dict):
            if key == command:
                section = value
            continue
        action = _action_of(parser, key)
        if action is not None:
            shared.append((key, value, action))
        elif not is_flag_elsewhere(key):
            raise ValueError(f"{key}: no epd command has a flag --{_option_name(key)}")
    own: list[tuple[str, Any, argparse.Action]] = []
    for key, value in section.items():
        action = _action_of(parser, key) if isinstance(key, str) else None
        if action is None:
            raise ValueError(f"{command}.{key}: epd {command} has no flag --{_option_name(key)}")
        own.append((key, value, action))
    arguments: list[str] = []
    for key, value, action in [*shared, *own]:
        variable = ENV_IN_HELP.search(action.help or "")
        if variable and variable[1] in environ:
            continue
        arguments += _as_arguments(action, key, value)
    return arguments


def _option_name(key: str) -> str:
    return key.strip().replace("_", "-")


def _action_of(parser: argparse.ArgumentParser, key: str) -> argparse.Action | None:
    option = "--" + _option_name(key)
    if _option_name(key) in NOT_SETTINGS:
        return None
    # NOTE: argparse has no public lookup of an option's action.
    return parser._option_string_actions.get(option)


def _as_arguments(action: argparse.Action, key: str, value: Any) -> list[str]:
    option = "--" + _option_name(key)
    if value is None:
        return []
    if action.nargs == 0:
        if not isinstance(value, bool):
            raise ValueError(f"{key}: a switch takes true or false, not {value!r}")
        if isinstance(action, argparse.BooleanOptionalAction):
            positive, negative = action.option_strings[0], "--no-" + action.option_strings[0][2:]
            return [positive if value == (option == positive) else negative]
        return [option] if value else []
    if isinstance(value, dict):
        raise ValueError(f"{key}: expected a value or a list, not a mapping")
    items = value if isinstance(value, list) else [value]
    texts = [_text(item) for item in items]
    if isinstance(action, argparse._AppendAction):
        return [f"{option}={text}" for text in texts]
    if action.nargs in ("+", "*") or isinstance(action.nargs, int):
        return [option, *texts]
    if isinstance(value, list):
        raise ValueError(f"{key}: takes one value, not a list")
    return [f"{option}={texts[0]}"]


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        raise ValueError(f"expected a value, not {value!r}")
    return str(value)
