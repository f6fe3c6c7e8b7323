"""The one NIXL agent of a process: registrations, remote agents, READs and notifications.

Creating an agent and connecting to a peer are slow (docs/transfer.md), so a process makes one
agent, lazily, on first use (``process_agent``) and keeps it until it exits; producers and
consumers of every DataPlane in the process share it. A reference carries the producer's partial
metadata for the regions it points into (connection info + those registrations, ~450 bytes
whatever the pool size); a consumer loads each distinct metadata blob once (the first costs the
connection, later ones a few microseconds) and remembers it per remote agent name.

Descriptors cross the wire as integers ``(address, length, device_id)``; this module never calls
``deserialize_descs`` (it unpickles). The UCX backend runs with error handling mode ``none`` by
default, which lets UCX pick shared-memory transports between processes of one host; ``peer``
(``NixlOptions.ucx_error_handling``) trades that for peer-failure detection.

Progress: a passive agent must make progress for peers to connect, for their notifications to
arrive and, over transports without one-sided READs (UCX TCP), for the READs it serves. NIXL's
own progress thread does that without pause and takes a whole core; by default it is off and a
thread of ours polls every ``NixlOptions.poll_interval_s`` instead (``nixl_notifications``),
started with the agent, before anything can wait on it. ``NixlOptions.progress_thread`` turns
NIXL's on and ours off, where cores are plentiful.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Sequence
from typing import Any

from epd.common.errors import InvalidArgument, NotFound, Unavailable
from epd.server.transfer.nixl_notifications import NotificationListener, Notifications
from epd.server.transfer.options import NixlOptions

logger = logging.getLogger(__name__)

Region = tuple[int, int, int]  # (address, length, device id)
_SPINS_BEFORE_SLEEP = 2000
_MAX_METADATA_PER_PEER = 4096


def is_available() -> bool:
    """Whether the nixl package can be imported in this environment."""
    try:
        import nixl._api  # noqa: F401
    except ImportError:
        return False
    return True


class NixlAgent:
    """Thread-safe wrapper over one ``nixl_agent`` with the UCX backend (host or device memory)."""

    def __init__(self, name: str, options: NixlOptions | None = None) -> None:
        from nixl._api import nixl_agent, nixl_agent_config, nixl_thread_sync_t

        options = options or NixlOptions()
        config = nixl_agent_config(
            enable_prog_thread=options.progress_thread,
            backends=[],
            sync_mode=nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT,
        )
        self.name = name
        self._agent: Any = nixl_agent(name, config)
        self._agent.create_backend("UCX", {"ucx_error_handling_mode": options.ucx_error_handling})
        self._lock = threading.Lock()
        self._registered: dict[int, Any] = {}
        self._lengths: dict[int, int] = {}
        self._kinds: dict[int, tuple[str, int]] = {}
        self._shares: dict[int, int] = {}
        self._share_lock = threading.Lock()
        self._metadata: dict[int, bytes] = {}
        self._remote: dict[str, set[bytes]] = {}
        self._notifications = Notifications(
            self._agent, interval_s=options.poll_interval_s, threaded=not options.progress_thread
        )
        # NOTE: a daemon thread inside a NIXL call while the interpreter tears down aborts the
        # process ("terminate called without an active exception").
        atexit.register(self.stop_progress)

    def stop_progress(self) -> None:
        """Stop the polling thread (at exit; idempotent)."""
        self._notifications.stop()

    # -- local memory ---------------------------------------------------------------------------

    def register(
        self, address: int, length: int, memory_type: str = "DRAM", device_id: int = 0
    ) -> None:
        """Register ``length`` bytes at ``address`` so peers can READ them."""
        descs = self._agent.get_reg_descs([(address, length, device_id, "")], memory_type)
        self._agent.register_memory(descs)
        with self._lock:
            self._registered[address] = descs
            self._lengths[address] = length
            self._kinds[address] = (memory_type, device_id)

    def deregister(self, address: int) -> None:
        """Undo ``register`` for the region starting at ``address`` (unknown: no-op)."""
        with self._lock:
            descs = self._registered.pop(address, None)
            self._metadata.pop(address, None)
            self._lengths.pop(address, None)
            self._kinds.pop(address, None)
            self._shares.pop(address, None)
        if descs is not None:
            self._agent.deregister_memory(descs)

    def share(
        self, address: int, length: int, memory_type: str = "DRAM", device_id: int = 0
    ) -> bool:
        """Register caller memory (host, or ``VRAM`` of GPU ``device_id``) until ``unshare`` is
        called as many times; the same region shared twice is registered once. False if a
        different registered region starts at ``address`` (the caller then copies instead).
        Raises what NIXL raises when it cannot register such memory (no CUDA in its build)."""
        with self._share_lock:
            with self._lock:
                if address in self._registered:
                    if (
                        self._lengths.get(address) != length
                        or self._kinds.get(address) != (memory_type, device_id)
                        or address not in self._shares
                    ):
                        return False
                    self._shares[address] += 1
                    return True
            self.register(address, length, memory_type, device_id)
            with self._lock:
                self._shares[address] = 1
            return True

    def unshare(self, address: int) -> None:
        """Drop one ``share`` of the region at ``address``; the last one deregisters it."""
        with self._share_lock:
            with self._lock:
                count = self._shares.get(address, 0) - 1
                if count > 0:
                    self._shares[address] = count
                    return
            self.deregister(address)

    def metadata_of(self, addresses: Sequence[int]) -> bytes:
        """Connection info and the registrations of several regions of one memory type, in one
        blob (not cached)."""
        with self._lock:
            regions = [(a, self._lengths[a], *self._kinds[a]) for a in addresses]
        memory_types = {memory_type for _, _, memory_type, _ in regions}
        if len(memory_types) != 1:
            raise ValueError(f"regions of one memory type expected, got {sorted(memory_types)}")
        descs = self._agent.get_reg_descs(
            [(a, n, device_id, "") for a, n, _, device_id in regions], memory_types.pop()
        )
        return bytes(self._agent.get_partial_agent_metadata(descs, True))

    @property
    def num_registered_regions(self) -> int:
        """Regions registered now (leak checks compare it before and after)."""
        with self._lock:
            return len(self._registered)

    def metadata(self, address: int) -> bytes:
        """Metadata a peer needs to READ the registered region at ``address``: connection info
        and that one registration (cached per region)."""
        with self._lock:
            cached = self._metadata.get(address)
            descs = self._registered[address]
        if cached is None:
            cached = bytes(self._agent.get_partial_agent_metadata(descs, True))
            with self._lock:
                self._metadata[address] = cached
        return cached

    # -- peers ----------------------------------------------------------------------------------

    def connect(self, agent_name: str, metadata: bytes) -> None:
        """Make sure ``agent_name`` is loaded, with ``metadata`` if it is newer than the cache.
        This agent's own name needs nothing: NIXL reads its own registrations in loopback."""
        if agent_name == self.name:
            return
        # NOTE: no lock to look: dict.get and a set's `in` are atomic under the GIL.
        known = self._remote.get(agent_name)
        if known is not None and (not metadata or metadata in known):
            return
        if not metadata:
            raise NotFound(
                f"NIXL agent {agent_name!r} is unknown here and the reference carries "
                "no agent metadata",
                reason="NIXL_AGENT_UNKNOWN",
            )
        try:
            loaded = self._agent.add_remote_agent(metadata)
        except Exception as e:
            # NOTE: a failed load may have erased what NIXL knew of the agent: load it afresh.
            with self._lock:
                self._remote.pop(agent_name, None)
            # NOTE: nixl raises nixlBackendError / nixlRemoteDisconnectError when the peer cannot
            # be reached (e.g. its process died), other errors for metadata it cannot parse.
            if type(e).__name__ in ("nixlBackendError", "nixlRemoteDisconnectError"):
                raise Unavailable(
                    f"cannot connect to NIXL agent {agent_name!r} (its process may be gone): {e}",
                    reason="NIXL_PEER_UNREACHABLE",
                ) from e
            raise InvalidArgument(
                f"cannot load metadata of NIXL agent {agent_name!r}: {e}",
                reason="NIXL_BAD_METADATA",
            ) from e
        loaded_name = loaded.decode() if isinstance(loaded, bytes) else str(loaded)
        if loaded_name != agent_name:
            raise InvalidArgument(
                f"metadata is of agent {loaded_name!r}, the reference names {agent_name!r}",
                reason="NIXL_AGENT_MISMATCH",
            )
        with self._lock:
            known = self._remote.setdefault(agent_name, set())
            if len(known) >= _MAX_METADATA_PER_PEER:
                known.clear()  # NOTE: reloading a blob is harmless, it only costs microseconds
            known.add(metadata)

    def forget(self, agent_name: str) -> None:
        """Drop a remote agent (after a failure): the next reference reloads its metadata."""
        with self._lock:
            known = self._remote.pop(agent_name, None)
        if known is not None:
            with contextlib.suppress(Exception):
                self._agent.remove_remote_agent(agent_name)

    # -- READs ----------------------------------------------------------------------------------

    def read(
        self,
        local: Sequence[Region],
        remote: Sequence[Region],
        agent_name: str,
        *,
        remote_memory_type: str = "DRAM",
        local_memory_type: str = "DRAM",
        timeout_s: float = 30.0,
    ) -> None:
        """One-sided READ of ``remote`` regions of ``agent_name`` into registered ``local`` ones
        (pairwise equal lengths; host or device memory on either side); blocks until done. A
        peer that failed is forgotten."""
        try:
            handle = self._agent.initialize_xfer(
                "READ",
                self._agent.get_xfer_descs(list(local), local_memory_type),
                self._agent.get_xfer_descs(list(remote), remote_memory_type),
                agent_name,
            )
        except Exception as e:
            raise _region_not_found(agent_name, e) from e
        try:
            self._complete(handle, agent_name, timeout_s)
        except Unavailable:
            self.forget(agent_name)
            raise
        finally:
            self._agent.release_xfer_handle(handle)

    def _complete(self, handle: Any, agent_name: str, timeout_s: float) -> None:
        try:
            state = self._agent.transfer(handle)
        except Exception as e:
            # NOTE: NIXL raises (rather than returning "ERR") for a request whose remote agent's
            # record was erased or reloaded, or whose peer disconnected.
            if type(e).__name__ == "nixlNotFoundError":
                raise _region_not_found(agent_name, e) from e
            raise Unavailable(
                f"NIXL READ from {agent_name!r} failed: {e}", reason="NIXL_TRANSFER_FAILED"
            ) from e
        deadline = time.monotonic() + timeout_s
        spins = 0
        while state == "PROC":
            spins += 1
            if spins > _SPINS_BEFORE_SLEEP:
                # NOTE: spin first (small transfers finish within it), then yield the core.
                time.sleep(0.0002)
                if time.monotonic() > deadline:
                    raise Unavailable(
                        f"NIXL READ from {agent_name!r} did not finish in {timeout_s} s",
                        reason="NIXL_TRANSFER_TIMEOUT",
                    )
            state = self._agent.check_xfer_state(handle)
        if state != "DONE":
            raise Unavailable(
                f"NIXL READ from {agent_name!r} failed ({state})", reason="NIXL_TRANSFER_FAILED"
            )

    # -- notifications (``nixl_notifications``) ----------------------------------------------

    def notify(self, agent_name: str, message: bytes) -> None:
        """Send ``message`` to ``agent_name``; a peer that cannot be reached is logged, not
        raised (what the message would have freed expires instead)."""
        self._notifications.send(agent_name, message)

    def add_listener(self, listener: NotificationListener) -> None:
        """Call ``listener(peer_name, message)`` for each notification ``poll`` receives."""
        self._notifications.add_listener(listener)

    def remove_listener(self, listener: NotificationListener) -> None:
        """Stop calling ``listener`` (unknown: no-op)."""
        self._notifications.remove_listener(listener)

    def poll(self) -> int:
        """Deliver notifications that arrived since the last poll; returns how many."""
        return self._notifications.poll()


def _region_not_found(agent_name: str, error: Exception) -> NotFound:
    return NotFound(
        f"NIXL agent {agent_name!r} does not expose the referenced regions "
        f"(released, or its process restarted): {error}",
        reason="NIXL_REGION_NOT_FOUND",
    )


_PROCESS_AGENT: NixlAgent | None = None
_PROCESS_AGENT_PID = 0
_PROCESS_LOCK = threading.Lock()


def process_agent(options: NixlOptions | None = None) -> NixlAgent:
    """This process's agent, created on first call (named ``epd-<host hash>-<pid>-<random>``)
    with that call's ``options``; later calls return it whatever options they give."""
    global _PROCESS_AGENT, _PROCESS_AGENT_PID
    with _PROCESS_LOCK:
        if _PROCESS_AGENT is None or os.getpid() != _PROCESS_AGENT_PID:
            host = zlib.crc32(socket.gethostname().encode())
            name = f"epd-{host:08x}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            _PROCESS_AGENT, _PROCESS_AGENT_PID = NixlAgent(name, options), os.getpid()
            logger.info("NIXL agent %s created", name)
        return _PROCESS_AGENT


def num_registered_regions() -> int:
    """Regions this process has registered with NIXL now (0 if it never made an agent)."""
    agent = _PROCESS_AGENT
    return 0 if agent is None or os.getpid() != _PROCESS_AGENT_PID else agent.num_registered_regions
