"""``epd route``'s flags for surviving lost workers: defaults, environment, bad values."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from epd.server.route import cli
from epd.server.route.resumption import DEFAULT_MAX_RESUMPTIONS


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="epd route")
    cli.add_arguments(parser)
    return parser.parse_args(["--model", "/nowhere", *flags])


def test_resumptions_default_and_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert parse().max_resumptions == DEFAULT_MAX_RESUMPTIONS
    monkeypatch.setenv("EPD_MAX_RESUMPTIONS", "0")
    assert parse().max_resumptions == 0
    assert parse("--max-resumptions", "5").max_resumptions == 5


def test_negative_resumptions_are_a_usage_error(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = parse("--max-resumptions", "-1")
    args.model = str(tiny_model_dir)
    assert cli.run(args) == 2
    assert "--max-resumptions must not be negative" in capsys.readouterr().err
