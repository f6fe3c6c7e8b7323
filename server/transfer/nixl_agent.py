"""The one NIXL agent of a process: registrations, remote agents, READs and notifications.

Creating an agent costs ~0.5 s and connecting to a peer up to ~50 ms, so a process makes one
agent, lazily, on first use (``process_agent``) and keeps it until it exits; producers and
consumers of every DataPlane in the process share it. A reference carries the producer's partial
metadata for the one region it points into (connection info + that registration, ~450 bytes
whatever the pool size); a consumer loads each distinct metadata blob once (the first costs the
connection, later ones a few microseconds) and remembers it per remote agent name.

Descriptors cross the wire as integers ``(address, length, device_id)``; this module never calls
``deserialize_descs`` (it unpickles). The UCX backend runs with error handling mode ``none`` by
default, which lets UCX use shared-memory transports (cma) on one host: ``peer`` mode forces TCP
and is ~10x slower here. Set $EPD_NIXL_UCX_ERROR_HANDLING=peer where peer-failure detection
matters more than speed. NIXL's progress thread is off (see the note in ``NixlAgent``); set
$EPD_NIXL_PROGRESS_THREAD=1 to turn it on where cores are plentiful.

READs of $EPD_NIXL_STRIPE_MIN_BYTES (default 8 MiB) or more are cut into $EPD_NIXL_READ_STRIPES
parts (default 2; 1 turns striping off) that as many reader threads, on UCX workers of their own,
post at once (``nixl_stripes``). The agent runs NIXL's reader/writer thread-sync mode for that:
transfers of several threads proceed together, registrations and peer changes exclude them.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import logging
import mmap
import os
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Sequence
from typing import Any

from epd.server.common.env import int_env
from epd.server.common.errors import InvalidArgument, NotFound, Unavailable
from epd.server.transfer.nixl_notifications import NotificationListener, Notifications
from epd.server.transfer.nixl_prepared import PreparedReads, Region, Regions
from epd.server.transfer.nixl_stripes import StripeReaders, split_regions

logger = logging.getLogger(__name__)
# NOTE: read when nixl is first imported; INFO lines on every agent start are noise in servers.
os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")

_SPINS_BEFORE_SLEEP = 2000
_MAX_METADATA_PER_PEER = 4096
_BIND_BYTES = 128
# Scratch regions of binding READs that did not finish (kept for the process's lifetime).
_UNFINISHED_SCRATCH: list[mmap.mmap] = []


def is_available() -> bool:
    """Whether the nixl package can be imported in this environment."""
    try:
        import nixl._api  # noqa: F401
    except ImportError:
        return False
    return True


class NixlAgent:
    """Thread-safe wrapper over one ``nixl_agent`` with the UCX backend (host or device memory)."""

    def __init__(self, name: str) -> None:
        from nixl._api import nixl_agent, nixl_agent_config, nixl_thread_sync_t

        stripes = int_env("EPD_NIXL_READ_STRIPES", 2, minimum=1)
        self.stripe_min_bytes = int_env("EPD_NIXL_STRIPE_MIN_BYTES", 8 << 20, minimum=1)
        # NOTE: NIXL's progress thread spins a whole core; ours polls every millisecond instead
        # (``nixl_notifications``).
        progress_thread = os.environ.get("EPD_NIXL_PROGRESS_THREAD", "0") == "1"
        config = nixl_agent_config(enable_prog_thread=progress_thread, backends=[],
                                   sync_mode=nixl_thread_sync_t.NIXL_THREAD_SYNC_RW)  # fmt: skip
        self.name = name
        self._agent: Any = nixl_agent(name, config)
        mode = os.environ.get("EPD_NIXL_UCX_ERROR_HANDLING", "none")
        # NOTE: one worker more than readers: the threads after them start again at worker 0.
        self._agent.create_backend("UCX", {"ucx_error_handling_mode": mode,
                                           "num_workers": str(stripes + 1 if stripes > 1 else 1)})
        self._lock = threading.Lock()
        self._registered: dict[int, Any] = {}
        self._lengths: dict[int, int] = {}
        self._shares: dict[int, int] = {}
        self._share_lock = threading.Lock()
        self._metadata: dict[int, bytes] = {}
        self._remote: dict[str, set[bytes]] = {}
        # NOTE: one lock around every use of prepared READs and every load or removal of a remote
        # agent: NIXL may erase an agent's record (and the pointers prepared READs hold) there.
        self._prepared_lock = threading.Lock()
        self._prepared = PreparedReads(self._agent)
        # NOTE: a poll during one stripe's copy kept the other stripes from starting until it
        # was done (see ``Notifications``): polls and striped READs take turns on this gate.
        self._poll_gate = threading.Lock()
        interval_s = float(os.environ.get("EPD_NIXL_POLL_INTERVAL_S", "0.001"))
        self._notifications = Notifications(self._agent, self._poll_gate, interval_s=interval_s,
                                            threaded=not progress_thread)  # fmt: skip
        # NOTE: after the polling thread: over UCX's TCP transport a READ is served by the
        # target's worker, so the binding READ of our own memory needs our progress (it timed out,
        # and its late reply then wrote into freed memory, without it).
        self._readers = self._start_readers(stripes) if stripes > 1 else None
        # NOTE: a daemon thread inside a NIXL call while the interpreter tears down aborts the
        # process ("terminate called without an active exception").
        atexit.register(self.stop_progress)

    def stop_progress(self) -> None:
        """Stop the polling thread and the readers, then send what ``notify`` left (at exit;
        idempotent)."""
        self._notifications.stop()
        if self._readers is not None:
            self._readers.stop()
            self._readers = None
        self._notifications.flush()

    @property
    def num_read_stripes(self) -> int:
        """Parts a READ of ``stripe_min_bytes`` or more is cut into (1: not striped)."""
        return 1 if self._readers is None else self._readers.count

    def _start_readers(self, count: int) -> StripeReaders | None:
        """Reader threads bound to workers 1..count by a loopback READ of a scratch region each;
        None (READs unstriped) if that fails."""
        scratch = mmap.mmap(-1, _BIND_BYTES)
        address = ctypes.addressof(ctypes.c_char.from_buffer(scratch))
        half = _BIND_BYTES // 2
        self.register(address, _BIND_BYTES)
        try:
            readers = StripeReaders(count, lambda: self._read_once(
                ((address, half, 0),), ((address + half, half, 0),), self.name, "DRAM", b"", 5.0))
        except Exception as e:
            logger.warning("NIXL READs are not striped: binding reader threads failed: %s", e)
            # NOTE: a READ that timed out may still land: its memory stays registered and mapped.
            _UNFINISHED_SCRATCH.append(scratch)
            return None
        self.deregister(address)
        scratch.close()
        return readers

    # -- local memory ---------------------------------------------------------------------------

    def register(self, address: int, length: int, memory_type: str = "DRAM",
                 device_id: int = 0) -> None:  # fmt: skip
        """Register ``length`` bytes at ``address`` so peers can READ them."""
        descs = self._agent.get_reg_descs([(address, length, device_id, "")], memory_type)
        self._agent.register_memory(descs)
        with self._lock:
            self._registered[address] = descs
            self._lengths[address] = length

    def deregister(self, address: int) -> None:
        """Undo ``register`` for the region starting at ``address`` (unknown: no-op)."""
        with self._lock:
            descs = self._registered.pop(address, None)
            self._metadata.pop(address, None)
            length = self._lengths.pop(address, 0)
            self._shares.pop(address, None)
        if descs is not None:
            with self._prepared_lock:
                if len(self._prepared):
                    self._prepared.drop_local(address, length)
            self._agent.deregister_memory(descs)

    def share(self, address: int, length: int) -> bool:
        """Register caller memory (host) until ``unshare`` is called as many times; the same
        region shared twice is registered once. False if a different registered region starts
        at ``address`` (the caller then copies instead)."""
        with self._share_lock:
            with self._lock:
                if address in self._registered:
                    if self._lengths.get(address) != length or address not in self._shares:
                        return False
                    self._shares[address] += 1
                    return True
            self.register(address, length)
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
        """Connection info and the registrations of several regions, in one blob (not cached)."""
        with self._lock:
            regions = [(a, self._lengths[a]) for a in addresses]
        descs = self._agent.get_reg_descs([(a, n, 0, "") for a, n in regions], "DRAM")
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
            raise NotFound(f"NIXL agent {agent_name!r} is unknown here and the reference carries "
                           "no agent metadata", reason="NIXL_AGENT_UNKNOWN")  # fmt: skip
        try:
            with self._prepared_lock:
                loaded = self._load(agent_name, metadata)
        except Exception as e:
            # NOTE: nixl raises nixlBackendError / nixlRemoteDisconnectError when the peer cannot
            # be reached (e.g. its process died), other errors for metadata it cannot parse.
            if type(e).__name__ in ("nixlBackendError", "nixlRemoteDisconnectError"):
                raise Unavailable(f"cannot connect to NIXL agent {agent_name!r} (its process may "
                                  f"be gone): {e}", reason="NIXL_PEER_UNREACHABLE") from e
            raise InvalidArgument(f"cannot load metadata of NIXL agent {agent_name!r}: {e}",
                                  reason="NIXL_BAD_METADATA") from e  # fmt: skip
        loaded_name = loaded.decode() if isinstance(loaded, bytes) else str(loaded)
        if loaded_name != agent_name:
            raise InvalidArgument(f"metadata is of agent {loaded_name!r}, the reference names "
                                  f"{agent_name!r}", reason="NIXL_AGENT_MISMATCH")  # fmt: skip
        with self._lock:
            known = self._remote.setdefault(agent_name, set())
            if len(known) >= _MAX_METADATA_PER_PEER:
                known.clear()  # NOTE: reloading a blob is harmless, it only costs microseconds
            known.add(metadata)

    def _load(self, agent_name: str, metadata: bytes) -> Any:
        """``add_remote_agent`` (under the prepared-list lock). A failed load may have erased
        what NIXL knew of the agent: its prepared lists and known blobs are dropped then."""
        try:
            return self._agent.add_remote_agent(metadata)
        except Exception:
            self._prepared.drop_agent(agent_name)
            with self._lock:
                self._remote.pop(agent_name, None)
            raise

    def read(self, local: Sequence[Region], remote: Sequence[Region], agent_name: str, *,
             remote_memory_type: str = "DRAM", notification: bytes = b"",
             timeout_s: float = 30.0, recurring: bool = False) -> None:  # fmt: skip
        """One-sided READ of ``remote`` regions of ``agent_name`` into registered ``local`` ones;
        ``notification`` reaches the peer when the READ completes. Blocks until done.
        ``recurring``: both sides are regions that come back (pooled blocks), so the READ is
        prepared once and reposted (see ``nixl_prepared``; ``num_prepared`` counts what is kept)."""
        readers = self._readers
        if (readers is not None and agent_name != self.name
                and sum(length for _, length, _ in remote) >= self.stripe_min_bytes):  # fmt: skip
            parts = split_regions(tuple(local), tuple(remote), readers.count)
            with self._poll_gate:
                readers.run_all([functools.partial(self._read_once, local_part, remote_part,
                                                   agent_name, remote_memory_type, b"", timeout_s)
                                 for local_part, remote_part in parts])  # fmt: skip
            if notification:
                self._notifications.send(agent_name, notification)
            return
        if recurring and agent_name != self.name:
            self._read_prepared(tuple(local), tuple(remote), agent_name, remote_memory_type,
                                notification, timeout_s)  # fmt: skip
            return
        self._read_once(local, remote, agent_name, remote_memory_type, notification, timeout_s)

    def _read_once(self, local: Sequence[Region], remote: Sequence[Region], agent_name: str,
                   memory_type: str, notification: bytes, timeout_s: float) -> None:  # fmt: skip
        """One READ request, built, posted, waited for and released."""
        try:
            handle = self._agent.initialize_xfer(
                "READ", self._agent.get_xfer_descs(list(local), "DRAM"),
                self._agent.get_xfer_descs(list(remote), memory_type), agent_name,
                notification)  # fmt: skip
        except Exception as e:
            raise _region_not_found(agent_name, e) from e
        try:
            self._complete(handle, b"", agent_name, timeout_s)
        finally:
            self._agent.release_xfer_handle(handle)

    def _read_prepared(self, local: Regions, remote: Regions,
                       agent_name: str, memory_type: str, notification: bytes,
                       timeout_s: float) -> None:  # fmt: skip
        with self._prepared_lock:
            try:
                key, handle, epoch = self._prepared.take(agent_name, memory_type, local, remote,
                                                         notification)  # fmt: skip
            except Exception as e:
                self._prepared.drop_agent(agent_name)
                raise _region_not_found(agent_name, e) from e
        try:
            self._complete(handle, notification, agent_name, timeout_s)
        except BaseException:
            with self._prepared_lock:
                self._prepared.drop_agent(agent_name)
            self._agent.release_xfer_handle(handle)
            raise
        with self._prepared_lock:
            self._prepared.give_back(key, handle, epoch)

    def _complete(self, handle: Any, notification: bytes, agent_name: str,
                  timeout_s: float) -> None:  # fmt: skip
        """Post ``handle`` (with ``notification`` when not empty) and wait for it; a peer that
        failed is forgotten."""
        try:
            try:
                state = self._agent.transfer(handle, notification)
            except Exception as e:
                # NOTE: NIXL raises (rather than returning "ERR") for a request whose remote
                # agent's record was erased or reloaded, or whose peer disconnected.
                if type(e).__name__ == "nixlNotFoundError":
                    raise _region_not_found(agent_name, e) from e
                raise Unavailable(f"NIXL READ from {agent_name!r} failed: {e}",
                                  reason="NIXL_TRANSFER_FAILED") from e  # fmt: skip
            if state != "DONE":  # NOTE: a small READ between processes of one host is done here
                self._wait(state, handle, agent_name, timeout_s)
        except Unavailable:
            self.forget(agent_name)
            raise

    def forget(self, agent_name: str) -> None:
        """Drop a remote agent (after a failure): the next reference reloads its metadata."""
        with self._lock:
            known = self._remote.pop(agent_name, None)
        if known is not None:
            with self._prepared_lock:
                self._prepared.drop_agent(agent_name)
                with contextlib.suppress(Exception):
                    self._agent.remove_remote_agent(agent_name)

    def drop_prepared(self) -> int:
        """Release every prepared READ of a remote agent (a consumer closing); returns how many
        handles. Those of local blocks alone go when their block is deregistered."""
        with self._prepared_lock:
            return self._prepared.drop_remote()

    @property
    def num_prepared(self) -> int:
        """Prepared descriptor lists and READ requests held now (leak checks)."""
        with self._prepared_lock:
            return len(self._prepared)

    def _wait(self, state: str, handle: Any, agent_name: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        spins = 0
        while state == "PROC":
            spins += 1
            if spins > _SPINS_BEFORE_SLEEP:
                # NOTE: spin first (transfers are micro- to milliseconds), then yield the core.
                time.sleep(0.0002)
                if time.monotonic() > deadline:
                    raise Unavailable(f"NIXL READ from {agent_name!r} did not finish in "
                                      f"{timeout_s} s", reason="NIXL_TRANSFER_TIMEOUT")  # fmt: skip
            state = self._agent.check_xfer_state(handle)
        if state != "DONE":
            raise Unavailable(f"NIXL READ from {agent_name!r} failed ({state})",
                              reason="NIXL_TRANSFER_FAILED")  # fmt: skip

    # -- notifications (``nixl_notifications``) ----------------------------------------------

    def notify(self, agent_name: str, message: bytes) -> None:
        """Send ``message`` to ``agent_name`` from the polling thread (see ``Notifications``)."""
        self._notifications.notify(agent_name, message)

    def flush_notifications(self) -> int:
        """Send every notification ``notify`` left; returns how many."""
        return self._notifications.flush()

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
    return NotFound(f"NIXL agent {agent_name!r} does not expose the referenced regions "
                    f"(released, or its process restarted): {error}",
                    reason="NIXL_REGION_NOT_FOUND")  # fmt: skip


_PROCESS_AGENT: NixlAgent | None = None
_PROCESS_AGENT_PID = 0
_PROCESS_LOCK = threading.Lock()


def process_agent() -> NixlAgent:
    """This process's agent, created on first call (named ``epd-<host hash>-<pid>-<random>``)."""
    global _PROCESS_AGENT, _PROCESS_AGENT_PID
    with _PROCESS_LOCK:
        if _PROCESS_AGENT is None or os.getpid() != _PROCESS_AGENT_PID:
            host = zlib.crc32(socket.gethostname().encode())
            name = f"epd-{host:08x}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            _PROCESS_AGENT, _PROCESS_AGENT_PID = NixlAgent(name), os.getpid()
            logger.info("NIXL agent %s created (%d read stripes)", name,
                        _PROCESS_AGENT.num_read_stripes)
        return _PROCESS_AGENT


def num_prepared() -> int:
    """Prepared NIXL READ handles this process holds now (0 if it never made an agent)."""
    agent = _PROCESS_AGENT
    return 0 if agent is None or os.getpid() != _PROCESS_AGENT_PID else agent.num_prepared


def num_registered_regions() -> int:
    """Regions this process has registered with NIXL now (0 if it never made an agent)."""
    agent = _PROCESS_AGENT
    return 0 if agent is None or os.getpid() != _PROCESS_AGENT_PID else agent.num_registered_regions
