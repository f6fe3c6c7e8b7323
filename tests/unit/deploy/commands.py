"""The real argument parsers of the `epd` commands a chart container runs, built with the
environment Kubernetes gives that container."""

from __future__ import annotations

import argparse
import importlib
import os
from typing import Any

import pytest

from epd.cli import COMMANDS


class ParserError(AssertionError):
    pass


class StrictParser(argparse.ArgumentParser):
    """Raises instead of printing usage and exiting."""

    def error(self, message: str) -> Any:
        raise ParserError(f"{self.prog}: {message}")


def parser_for(command: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> StrictParser:
    """`epd COMMAND`'s parser, built where the environment is exactly ``env`` for EPD_*
    (the CLIs read their fallbacks while adding arguments)."""
    for name in [n for n in os.environ if n.startswith("EPD_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parser = StrictParser(prog=f"epd {command}")
    importlib.import_module(COMMANDS[command][0]).add_arguments(parser)
    return parser


def parse_container(
    container: dict[str, Any], env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> argparse.Namespace:
    """A chart container's command line as its `epd` command parses it."""
    assert container["command"][0] == "epd", container["name"]
    [command] = container["command"][1:]
    return parser_for(command, env, monkeypatch).parse_args(container["args"])
