"""A Mooncake Store client (``mooncake.store.MooncakeDistributedStore``, TCP): where it joins,
the memory it lends, and joining. Shared by the encoders' store (``mooncake.py``) and the
segment holder (``holder.py``); imports neither torch nor Mooncake until a client is made.

NOTE: ``setup`` holds the GIL, for about 90 s when the master cannot be reached: ``join`` calls
it only once the master's port and the metadata server's accept a connection.
"""

from __future__ import annotations

import logging
import socket
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any, Protocol

from epd.common.flags import flag

RETRY_CONNECT_S = 2.0
# NOTE: a client's close takes about 12 s once its master died; a process that exits before
# it ends aborts in Mooncake's destructors.
CLOSE_WAIT_S = 30.0
INSTALL_HINT = (
    "--embedding-store mooncake needs Mooncake's Python package (mooncake-transfer-engine-non-cuda "
    "on CPU, -cuda13 on GPUs) and Debian's libibverbs1 and librdmacm1: scripts/install.sh "
    "installs them"
)
# NOTE: where the store is, for every command that joins it (encoders, the segment holder).
STORE_MASTER_FLAG = flag(
    "HOST:PORT of the embedding store's Mooncake master",
    env="EPD_STORE_MASTER",
)
STORE_METADATA_SERVER_FLAG = flag(
    "URL of Mooncake's HTTP metadata server, e.g. http://HOST:PORT/metadata "
    "(mooncake_master --enable_http_metadata_server serves one)",
    env="EPD_STORE_METADATA_SERVER",
)
logger = logging.getLogger(__name__)


class Client(Protocol):
    """The calls of ``MooncakeDistributedStore`` this store makes (status codes: 0 or a size
    for success, a negative Mooncake ``ErrorCode`` otherwise; ``get`` answers b"" on failure)."""

    def setup(self, *args: Any) -> int: ...
    def get_size(self, key: str) -> int: ...
    def get(self, key: str) -> bytes: ...
    def put(self, key: str, value: bytes) -> int: ...
    def close(self) -> int: ...


@dataclass(frozen=True, slots=True)
class MooncakeSettings:
    """Where the master and its metadata server are, how this client joins (``local_hostname``:
    the address its peers reach it at), how long a lookup may take, the memory it lends (0:
    none, the values live in other clients' segments) and buffers, and how many publishes may
    wait. ValueError for an empty address or a size or wait out of range."""

    master: str
    metadata_server: str
    local_hostname: str = "127.0.0.1"
    timeout_s: float = 0.05
    segment_bytes: int = 256 << 20
    buffer_bytes: int = 64 << 20
    max_queued: int = 64

    def __post_init__(self) -> None:
        if not self.master or not self.metadata_server:
            raise ValueError(
                "--embedding-store mooncake needs --store-master HOST:PORT and "
                "--store-metadata-server http://HOST:PORT/metadata"
            )
        if not self.timeout_s > 0:
            raise ValueError(f"store timeout must be positive, got {self.timeout_s}")
        if self.segment_bytes < 0 or min(self.buffer_bytes, self.max_queued) < 1:
            raise ValueError(
                "store segment size must not be negative, buffer and queue sizes at least 1"
            )


def new_client() -> Client:
    """A Mooncake client, not set up; ValueError saying how to install Mooncake when it cannot
    be loaded."""
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as e:
        raise ValueError(f"{INSTALL_HINT} ({e})") from e
    client: Client = MooncakeDistributedStore()
    return client


def join(client: Client, settings: MooncakeSettings, closed: threading.Event) -> bool:
    """Set ``client`` up in the store of ``settings`` (blocking), retried every
    ``RETRY_CONNECT_S`` until it joins (True) or ``closed`` is set (False)."""
    while not closed.is_set():
        if not is_reachable(settings):
            closed.wait(RETRY_CONNECT_S)
            continue
        status = client.setup(
            settings.local_hostname,
            settings.metadata_server,
            settings.segment_bytes,
            settings.buffer_bytes,
            "tcp",
            "",
            settings.master,
        )
        if status == 0:
            logger.info("joined the embedding store at %s", settings.master)
            return True
        logger.warning("embedding store at %s: setup failed (%d)", settings.master, status)
        closed.wait(RETRY_CONNECT_S)
    return False


def is_reachable(settings: MooncakeSettings) -> bool:
    """Whether the master's port and the metadata server's both accept a connection now."""
    metadata = urllib.parse.urlsplit(settings.metadata_server)
    master = urllib.parse.urlsplit(f"//{settings.master}")
    for host, port in ((master.hostname, master.port), (metadata.hostname, metadata.port)):
        try:
            with socket.create_connection((host or "", port or 80), timeout=1.0):
                pass
        except (OSError, ValueError):
            return False
    return True
