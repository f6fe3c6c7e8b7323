"""Data-plane flags: each falls back to its EPD_* variable, malformed variables are named, and
the options reach the plane (host id, shm mapping budget) and the NIXL agent's settings."""

from __future__ import annotations

import argparse

import pytest

from epd.server.transfer.options import NixlOptions, TransferOptions
from epd.server.transfer.plane import DataPlane, default_host_id
from epd.server.transfer.shm import ShmConsumer
from epd.server.transfer.transfer_cli import add_transfer_arguments, transfer_options

VARIABLES = (
    "EPD_HOST_ID",
    "EPD_SHM_MAPPED_BYTES",
    "EPD_NIXL_UCX_ERROR_HANDLING",
    "EPD_NIXL_POLL_INTERVAL_S",
    "EPD_NIXL_PROGRESS_THREAD",
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
    assert transfer_options(parser.parse_args(["--host-id", "h"])) == TransferOptions("h")


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
