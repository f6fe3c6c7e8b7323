"""The embedding store's services of ``epd up --embedding-store mooncake``: its master and its
segment holder.

``mooncake_master`` (from Mooncake's wheel) holds the store's metadata and, with
``--enable_http_metadata_server``, serves the HTTP metadata server its clients meet at. It
listens on three free loopback ports: its RPC port, the metadata server and an admin port whose
``/health`` says when it serves. Once it serves, ``epd store-holder`` (service store-holder)
joins it and lends it the memory the values live in; the encoders, started after, lend none, so
the values outlive encoder restarts. ``Deployment.stop`` stops the encoders (and the rest)
first, then the holder, then the master, each once the previous ones ended.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from epd.common.advertise import endpoint
from epd.launch.free_ports import free_port
from epd.launch.launcher import Child, Deployment, tail
from epd.launch.public_entry import INTERNAL_SERVER_ARGS, LOOPBACK
from epd.server.store.base import MOONCAKE
from epd.server.store.client import INSTALL_HINT

MASTER_NAME = "store-master"
HOLDER_NAME = "store-holder"
READY_TIMEOUT_S = 30.0
MASTER_START_ATTEMPTS = 3
# NOTE: Deployment.stop's waves: the encoders leave the store, then the holder unmounts its
# segment from the master, which stops last.
HOLDER_STOP_WAVE = 1
MASTER_STOP_WAVE = 2


@dataclass(frozen=True, slots=True)
class MasterAddress:
    """Where a master listens: its RPC port, its HTTP metadata server and its admin port."""

    rpc_port: int
    metadata_port: int
    admin_port: int
    host: str = LOOPBACK

    @classmethod
    def free(cls) -> MasterAddress:
        """Three ports nobody listens on now."""
        return cls(free_port(), free_port(), free_port())

    @property
    def master(self) -> str:
        return endpoint(self.host, self.rpc_port)

    @property
    def metadata_server(self) -> str:
        return f"http://{endpoint(self.host, self.metadata_port)}/metadata"

    def store_args(self) -> list[str]:
        """The flags that name this master and its metadata server."""
        return ["--store-master", self.master, "--store-metadata-server", self.metadata_server]

    def encoder_args(self) -> list[str]:
        """The flags that point an encoder at this master's store."""
        return ["--embedding-store", MOONCAKE, *self.store_args()]


def master_binary() -> Path:
    """The ``mooncake_master`` binary of the installed wheel; ValueError saying how to install
    it when absent."""
    try:
        import mooncake
    except ImportError as e:
        raise ValueError(f"{INSTALL_HINT} ({e})") from e
    binary = Path(next(iter(mooncake.__path__))) / "mooncake_master"
    if not binary.is_file():
        raise ValueError(f"{INSTALL_HINT} (no {binary})")
    return binary


def master_command(address: MasterAddress) -> list[str]:
    """The command line of a master at ``address``, serving its metadata server there too."""
    host = address.host
    return [
        str(master_binary()),
        f"--rpc_address={host}",
        f"--rpc_port={address.rpc_port}",
        "--rpc_thread_num=2",
        "--enable_http_metadata_server=true",
        f"--http_metadata_server_host={host}",
        f"--http_metadata_server_port={address.metadata_port}",
        f"--metrics_host={host}",
        f"--metrics_port={address.admin_port}",
        "--enable_metric_reporting=false",
    ]


class MasterExited(RuntimeError):
    """The master exited before it served."""


@dataclass(slots=True)
class StartedMaster:
    """A master started as a service of ``deployment``."""

    deployment: Deployment
    child: Child
    address: MasterAddress

    async def ready_args(self) -> list[str]:
        """The encoders' store flags, once the master serves. A master that exits first (it
        aborts when another process took one of its ports between their choice and its bind)
        starts again on new ports, up to ``MASTER_START_ATTEMPTS`` times in all; RuntimeError
        when it still does not serve."""
        for _ in range(MASTER_START_ATTEMPTS - 1):
            try:
                await wait_master_ready(self.child, self.address)
                return self.address.encoder_args()
            except MasterExited:
                self.address = MasterAddress.free()
                self.child.port = self.address.rpc_port
                self.child.command = master_command(self.address)
                self.deployment.restart(self.child)
        await wait_master_ready(self.child, self.address)
        return self.address.encoder_args()


def start_master(deployment: Deployment) -> StartedMaster:
    """Start a master on free ports as ``deployment``'s service ``store-master``; ValueError
    when Mooncake is not installed."""
    address = MasterAddress.free()
    command = master_command(address)
    child = deployment.start_command(MASTER_NAME, address.rpc_port, command)
    child.stop_wave = MASTER_STOP_WAVE
    return StartedMaster(deployment, child, address)


@dataclass(frozen=True, slots=True)
class StartedStore:
    """The store's master, started; its holder starts once the master serves (``ready_args``)
    and lends ``segment_mb`` MiB."""

    deployment: Deployment
    master: StartedMaster
    segment_mb: int

    async def ready_args(self) -> list[str]:
        """The encoders' store flags (they lend no segment), once the master serves and the
        holder joined it; RuntimeError if either does not."""
        args = await self.master.ready_args()
        holder = start_holder(self.deployment, self.master.address, self.segment_mb)
        await self.deployment.wait_healthy(holder, READY_TIMEOUT_S)
        return [*args, "--store-segment-mb", "0"]


def start_store(deployment: Deployment, segment_mb: int) -> StartedStore:
    """Start the master of a store whose holder will lend ``segment_mb`` MiB; ValueError when
    Mooncake is not installed."""
    return StartedStore(deployment, start_master(deployment), segment_mb)


def holder_command(address: MasterAddress, port: int, segment_mb: int) -> list[str]:
    """The command line of a holder lending ``segment_mb`` MiB to the store of ``address``,
    serving its health on loopback ``port``."""
    server = [*INTERNAL_SERVER_ARGS, "--port", str(port)]
    return [
        sys.executable,
        "-m",
        "epd",
        HOLDER_NAME,
        *address.store_args(),
        "--store-segment-mb",
        str(segment_mb),
        *server,
    ]


def start_holder(deployment: Deployment, address: MasterAddress, segment_mb: int) -> Child:
    """Start ``epd store-holder`` on a free loopback port as ``deployment``'s service
    ``store-holder``."""
    port = free_port()
    child = deployment.start_command(HOLDER_NAME, port, holder_command(address, port, segment_mb))
    child.stop_wave = HOLDER_STOP_WAVE
    return child


async def wait_master_ready(
    child: Child, address: MasterAddress, timeout_s: float = READY_TIMEOUT_S
) -> None:
    """Return once the master at ``address`` says it serves; RuntimeError if ``child`` exits
    first or it does not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child.process.poll() is not None:
            child.is_reported = True
            raise MasterExited(f"{child.describe_exit()}; last log lines:\n{tail(child.log)}")
        if await asyncio.to_thread(is_master_ready, address):
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{child.name} not ready after {timeout_s:.0f}s; log {child.log}")


def is_master_ready(address: MasterAddress) -> bool:
    """Whether the master's admin port reports it ready to serve."""
    url = f"http://{endpoint(address.host, address.admin_port)}/health"
    try:
        with urllib.request.urlopen(url, timeout=1.0) as answer:
            return bool(json.loads(answer.read()).get("service_ready"))
    except (OSError, urllib.error.URLError, ValueError):
        return False
