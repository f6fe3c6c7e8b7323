"""The store's memory as a service of its own: the segment holder (``epd store-holder``).

Mooncake keeps each value in one client's mounted segment, which its master chooses, and a value
leaves the store with that client: what sat in an encoder's segment is gone once the encoder
restarts. A holder is a Mooncake client that mounts the store's segment and does nothing else;
the encoders mount none (``--store-segment-mb 0``), so the master puts every value here and the
values outlive any encoder. A holder that stops takes the values with it (the encoders then miss
and encode, as without a store); a new one starts empty.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from epd.common.flags import flag
from epd.server.store.client import (
    CLOSE_WAIT_S,
    STORE_MASTER_FLAG,
    STORE_METADATA_SERVER_FLAG,
    Client,
    MooncakeSettings,
    join,
    new_client,
)

# NOTE: the holder reads and writes nothing itself; Mooncake still wants a local buffer.
BUFFER_BYTES = 1 << 20
JOIN_POLL_S = 0.2
logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HolderConfig:
    """The store a holder joins and the memory it lends it; the defaults of ``epd
    store-holder``'s flags (ValueError for a missing address or a segment under 1 MiB)."""

    store_master: str = field(default="", metadata=STORE_MASTER_FLAG)
    store_metadata_server: str = field(default="", metadata=STORE_METADATA_SERVER_FLAG)
    store_segment_mb: int = field(
        default=1024,
        metadata=flag(
            "MiB of host memory lent to the store: every value the encoders store lives in it "
            "when they lend none (--store-segment-mb 0)"
        ),
    )

    def __post_init__(self) -> None:
        if self.store_segment_mb < 1:
            raise ValueError(
                f"the holder's segment needs at least 1 MiB, got {self.store_segment_mb}"
            )
        self.settings("127.0.0.1")

    def settings(self, local_hostname: str) -> MooncakeSettings:
        """The client settings of a holder joining as ``local_hostname`` (the address the
        encoders reach its segment at)."""
        return MooncakeSettings(
            self.store_master,
            self.store_metadata_server,
            local_hostname=local_hostname,
            segment_bytes=self.store_segment_mb << 20,
            buffer_bytes=BUFFER_BYTES,
        )


class SegmentHolder:
    """One Mooncake client lending its segment to the store; joins in a background thread from
    construction on (retrying until the master answers) and leaves on ``close``."""

    def __init__(
        self, settings: MooncakeSettings, open_client: Callable[[], Client] = new_client
    ) -> None:
        """``open_client`` makes the client (here, so that a missing Mooncake is a ValueError
        at once)."""
        self.settings = settings
        self._client = open_client()
        self._closed = threading.Event()
        self._joined = threading.Event()
        self._thread = threading.Thread(target=self._hold, name="epd-store-holder", daemon=True)
        self._thread.start()

    async def wait_joined(self, timeout_s: float) -> bool:
        """Whether the holder joined the store within ``timeout_s`` (False at once when closed)."""
        deadline = time.monotonic() + timeout_s
        while not self._closed.is_set() and time.monotonic() < deadline:
            if await asyncio.to_thread(self._joined.wait, JOIN_POLL_S):
                return not self._closed.is_set()
        return False

    async def close(self) -> None:
        """Stop joining, or leave the store (its values go with the segment); waits up to
        ``CLOSE_WAIT_S`` for Mooncake, whose close must end before the process does."""
        self._closed.set()
        await asyncio.to_thread(self._thread.join, CLOSE_WAIT_S)

    def _hold(self) -> None:
        if not join(self._client, self.settings, self._closed):
            return
        self._joined.set()
        logger.info(
            "lending %d MiB to the embedding store at %s",
            self.settings.segment_bytes >> 20,
            self.settings.master,
        )
        self._closed.wait()
        self._client.close()
        logger.info("left the embedding store")
