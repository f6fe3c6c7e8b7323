"""``epd scheduler`` flags: the probe horizon is a flag with an env fallback, checked at start."""

from __future__ import annotations

import argparse

import pytest

from epd.scheduler.cli import add_arguments, run


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_probe_horizon_flag_has_an_env_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse().probe_after_s == 5.0
    monkeypatch.setenv("EPD_SCHEDULER_PROBE_AFTER_S", "2.5")
    assert parse().probe_after_s == 2.5
    assert parse("--probe-after-s", "9").probe_after_s == 9.0


def test_a_non_positive_probe_horizon_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(parse("--probe-after-s", "0")) == 2
    assert "probe_after_s" in capsys.readouterr().err
