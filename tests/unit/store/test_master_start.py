"""A master that exits before it serves, because another process took one of its ports between
their choice and its bind (it aborts: CI saw it once), starts again on new ports."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from epd.launch import store_service
from epd.launch.launcher import Deployment
from epd.launch.store_service import MasterAddress, MasterExited, start_master
from tests.mooncake import skip_without_mooncake

FREE = MasterAddress.free


def taken_address(listener: socket.socket) -> MasterAddress:
    """Free ports but for the metadata server's, which ``listener`` holds."""
    fresh = FREE()
    return MasterAddress(fresh.rpc_port, listener.getsockname()[1], fresh.admin_port)


async def test_a_master_whose_port_was_taken_starts_again_on_new_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    skip_without_mooncake()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        addresses = iter([taken_address(listener)])
        monkeypatch.setattr(MasterAddress, "free", lambda: next(addresses, None) or FREE())
        deployment = Deployment(tmp_path, dict(os.environ))
        master = start_master(deployment)
        first = master.address
        try:
            args = await master.ready_args()
        finally:
            deployment.stop(grace_s=10)
    assert master.address != first and master.child.num_restarts == 1
    assert args == master.address.encoder_args()
    assert "restarting it" in (tmp_path / "store-master.log").read_text()


async def test_a_master_that_never_serves_fails_after_its_attempts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    skip_without_mooncake()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        monkeypatch.setattr(MasterAddress, "free", lambda: taken_address(listener))
        deployment = Deployment(tmp_path, dict(os.environ))
        master = start_master(deployment)
        try:
            with pytest.raises(MasterExited):
                await master.ready_args()
        finally:
            deployment.stop(grace_s=10)
    assert master.child.num_restarts == store_service.MASTER_START_ATTEMPTS - 1
