"""Data-plane flags: each falls back to its EPD_* variable, malformed variables are named, and
the options reach the plane (host id, shm mapping budget) and the NIXL agent's settings."""

from __future__ import annotations

import argparse
import os

import pytest

from epd.server.transfer.options import NixlOptions, TransferOptions
from epd.server.transfer.plane import DataPlane, default_host_id
from epd.server.transfer.shm import ShmConsumer
from epd.server.transfer.transfer_cli import (
    add_nixl_log_level_argument,
    add_transfer_arguments,
    set_nixl_log_level,
    transfer_options,
)

VARIABLES = (
    "EPD_HOST_ID",
    "EPD_SHM_MAPPED_BYTES",
    "EPD_NIXL_UCX_ERROR_HANDLING",
    "EPD_NIXL_POLL_INTERVAL_S",
    "EPD_NIXL_PROGRESS_THREAD",
    "EPD_NIXL_LOG_LEVEL",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


def parse(argv: list[str], **groups: bool) -> TransferOptions:
    parser = argparse.ArgumentParser()
    add_transfer_arguments(parser, **groups)
    return transfer_options(parser.parse_args(argv))


def test_defaults_are_the_options_defaults() -> None:
    assert parse([]) == TransferOptions()


def test_variables_are_the_fallbacks_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPD_HOST_ID", "pod-a")
    monkeypatch.setenv("EPD_SHM_MAPPED_BYTES", "0")
    monkeypatch.setenv("EPD_NIXL_UCX_ERROR_HANDLING", "peer")
    monkeypatch.setenv("EPD_NIXL_POLL_INTERVAL_S", "0.01")
    monkeypatch.setenv("EPD_NIXL_PROGRESS_THREAD", "1")
    expected = TransferOptions("pod-a", 0, NixlOptions("peer", 0.01, progress_thread=True))
    assert parse([]) == expected
    flags = ["--host-id", "pod-b", "--shm-mapped-bytes", "4096", "--nixl-poll-interval-s", "0.5"]
    assert parse(flags) == TransferOptions("pod-b", 4096, NixlOptions("peer", 0.5, True))


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("EPD_SHM_MAPPED_BYTES", "1GiB", "must be an integer"),
        ("EPD_SHM_MAPPED_BYTES", "-1", "must be at least 0"),
        ("EPD_NIXL_POLL_INTERVAL_S", "fast", "must be a number"),
    ],
)
def test_a_malformed_variable_is_named(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=rf"\${variable} {message}"):
        add_transfer_arguments(argparse.ArgumentParser())


@pytest.mark.parametrize(
    "argv",
    [["--shm-mapped-bytes", "-1"], ["--nixl-poll-interval-s", "0"]],
)
def test_out_of_range_flags_are_refused(argv: list[str]) -> None:
    with pytest.raises(ValueError):
        parse(argv)


def test_a_process_without_shm_or_nixl_takes_only_its_host_id() -> None:
    parser = argparse.ArgumentParser()
    add_transfer_arguments(parser, shm=False, nixl=False)
    assert "--shm-mapped-bytes" not in parser.format_help()
    assert "--nixl-poll-interval-s" not in parser.format_help()
    assert "--nixl-log-level" not in parser.format_help()
    assert transfer_options(parser.parse_args(["--host-id", "h"])) == TransferOptions("h")


@pytest.mark.parametrize(
    ("nixl_variable", "argv", "expected"),
    [
        (None, [], "WARN"),
        ("DEBUG", [], "DEBUG"),
        ("DEBUG", ["--nixl-log-level", "ERROR"], "ERROR"),
        (None, ["--nixl-log-level", "INFO"], "INFO"),
    ],
)
def test_the_nixl_log_level_is_handed_to_nixl_by_the_command_line(
    monkeypatch: pytest.MonkeyPatch, nixl_variable: str | None, argv: list[str], expected: str
) -> None:
    """NIXL reads NIXL_LOG_LEVEL itself: WARN unless it is set or the flag says otherwise."""
    monkeypatch.delenv("NIXL_LOG_LEVEL", raising=False)
    if nixl_variable is not None:
        monkeypatch.setenv("NIXL_LOG_LEVEL", nixl_variable)
    parser = argparse.ArgumentParser()
    add_transfer_arguments(parser)
    set_nixl_log_level(parser.parse_args(argv))
    assert os.environ["NIXL_LOG_LEVEL"] == expected


def test_a_process_without_a_plane_of_nixl_still_sets_nixls_log_level(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NIXL_LOG_LEVEL", raising=False)
    monkeypatch.setenv("EPD_NIXL_LOG_LEVEL", "ERROR")
    parser = argparse.ArgumentParser()
    add_transfer_arguments(parser, shm=False, nixl=False)
    add_nixl_log_level_argument(parser)
    assert "--nixl-log-level" in parser.format_help()
    set_nixl_log_level(parser.parse_args([]))
    assert os.environ["NIXL_LOG_LEVEL"] == "ERROR"
    monkeypatch.setenv("EPD_NIXL_LOG_LEVEL", "loud")
    with pytest.raises(ValueError, match=r"\$EPD_NIXL_LOG_LEVEL"):
        add_nixl_log_level_argument(argparse.ArgumentParser())


def test_the_plane_takes_the_options() -> None:
    plane = DataPlane.from_options(TransferOptions("pod-a", 4096), kinds=("shm",))
    try:
        assert plane.host_id == "pod-a"
        shm_consumer = plane.consumers["shm"]
        assert isinstance(shm_consumer, ShmConsumer) and shm_consumer.views.max_bytes == 4096
    finally:
        plane.close()
    unnamed = DataPlane.from_options(TransferOptions(), kinds=("inline",))
    assert unnamed.host_id == default_host_id()
    unnamed.close()
