"""Data-plane settings of one process, built by the services' command lines (``transfer_cli``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from epd.server.transfer.shm_mappings import DEFAULT_MAX_BYTES

UCX_ERROR_HANDLING_MODES = ("none", "peer")


@dataclass(frozen=True, slots=True)
class NixlOptions:
    """Settings of the process's NIXL agent (``nixl_agent``), fixed when it is created.

    ``ucx_error_handling``: ``none`` lets UCX pick shared-memory transports between processes of
    one host; ``peer`` trades them for detecting a failed peer. ``progress_thread``: NIXL's own
    progress thread (spins a whole core) instead of ours polling every ``poll_interval_s``.
    """

    ucx_error_handling: str = "none"
    poll_interval_s: float = 0.001
    progress_thread: bool = False

    def __post_init__(self) -> None:
        if self.ucx_error_handling not in UCX_ERROR_HANDLING_MODES:
            raise ValueError(f"UCX error handling {self.ucx_error_handling!r}: use none or peer")
        if self.poll_interval_s <= 0:
            raise ValueError(f"NIXL poll interval must be positive, got {self.poll_interval_s}")


@dataclass(frozen=True, slots=True)
class TransferOptions:
    """What a process's ``DataPlane`` needs besides its role's own choices (kinds, leases).

    ``host_id``: processes with equal ids hand payloads over in shared memory; empty means
    ``plane.default_host_id()`` (host name and boot id). ``shm_mapped_bytes``: how much of
    producers' segments a shared-memory consumer keeps mapped for their next lease (0: none).
    """

    host_id: str = ""
    shm_mapped_bytes: int = DEFAULT_MAX_BYTES
    nixl: NixlOptions = field(default_factory=NixlOptions)

    def __post_init__(self) -> None:
        if self.shm_mapped_bytes < 0:
            raise ValueError(f"shm mapped bytes must be 0 or more, got {self.shm_mapped_bytes}")
