"""``epd encode``'s flags: ``EncodeConfig`` owns their defaults and checks their values, and
``--device`` reads EPD_DEVICE like every service's (EPD_ENCODER_DEVICE, its old name, still
wins when set, with a warning)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from epd.server.encode import cli
from epd.server.encode.app import EncodeConfig


@pytest.fixture(autouse=True)
def no_epd_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("EPD_DEVICE", "EPD_ENCODER_DEVICE", "EPD_MAX_INLINE_MS"):
        monkeypatch.delenv(name, raising=False)


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="epd encode")
    cli.add_arguments(parser)
    return parser.parse_args(["--model", "m", *flags])


def test_the_device_falls_back_to_epd_device(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse().device == EncodeConfig.device == "auto"
    monkeypatch.setenv("EPD_DEVICE", "cpu")
    assert parse().device == "cpu"
    assert parse("--device", "cuda").device == "cuda"


def test_the_old_device_variable_still_wins_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EPD_DEVICE", "cuda")
    monkeypatch.setenv("EPD_ENCODER_DEVICE", "cpu")
    assert parse().device == "cpu"
    assert "$EPD_ENCODER_DEVICE is deprecated: set EPD_DEVICE" in capsys.readouterr().err


def test_the_config_is_built_by_field_name() -> None:
    config = cli.encode_config(parse("--cache-mb", "64", "--vision-attention", "sdpa"))
    assert (config.cache_mb, config.attention, config.lease_ttl_s) == (64, "sdpa", 60.0)
    assert config.max_inline_ms is None and config.transfer_kind is None


@pytest.mark.parametrize(
    "flags",
    [
        ("--cache-mb", "-1"),
        ("--max-batch-size", "-1"),
        ("--max-batch-wait-ms", "-1"),
        ("--preprocess-threads", "-1"),
        ("--lease-ttl-s", "0"),
    ],
)
def test_values_out_of_range_are_refused_by_the_config(flags: tuple[str, ...]) -> None:
    with pytest.raises(ValueError):
        cli.encode_config(parse(*flags))


def test_a_bad_flag_is_a_usage_error(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.run(parse("--cache-mb", "-1", "--model", str(tiny_model_dir))) == 2
    assert "must not be negative" in capsys.readouterr().err
