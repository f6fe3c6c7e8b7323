"""Data-plane settings of one process, built by the services' command lines (``transfer_cli``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from epd.common.flags import flag
from epd.server.transfer.shm_mappings import DEFAULT_MAX_BYTES

UCX_ERROR_HANDLING_MODES = ("none", "peer")


@dataclass(frozen=True, slots=True)
class NixlOptions:
    """Settings of the process's NIXL agent (``nixl_agent``), fixed when it is created.

    ``ucx_error_handling``: ``none`` lets UCX pick shared-memory transports between processes of
    one host; ``peer`` trades them for detecting a failed peer. ``progress_thread``: NIXL's own
    progress thread (spins a whole core) instead of ours polling every ``poll_interval_s``.
    """

    ucx_error_handling: str = field(
        default="none",
        metadata=flag(
            "UCX error handling of the NIXL agent: none lets UCX use shared-memory transports on "
            "one host, peer detects failed peers instead",
            env="EPD_NIXL_UCX_ERROR_HANDLING",
            name="nixl-ucx-error-handling",
            choices=UCX_ERROR_HANDLING_MODES,
        ),
    )
    poll_interval_s: float = field(
        default=0.001,
        metadata=flag(
            "seconds between polls of the NIXL agent for connections, notifications and READs "
            "it serves",
            env="EPD_NIXL_POLL_INTERVAL_S",
            name="nixl-poll-interval-s",
        ),
    )
    progress_thread: bool = field(
        default=False,
        metadata=flag(
            "NIXL's own progress thread instead of polling; it spins a whole core",
            env="EPD_NIXL_PROGRESS_THREAD",
            name="nixl-progress-thread",
        ),
    )

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

    host_id: str = field(
        default="",
        metadata=flag(
            "this host's id: processes with equal ids hand payloads over in shared memory, "
            "others over NIXL or inline",
            env="EPD_HOST_ID",
            default_help="default: host name and boot id, equal exactly for processes sharing "
            "/dev/shm; give containers with their own /dev/shm their own",
        ),
    )
    shm_mapped_bytes: int = field(
        default=DEFAULT_MAX_BYTES,
        metadata=flag(
            "bytes of producers' shared-memory segments kept mapped for their next lease; 0 "
            "keeps none",
            env="EPD_SHM_MAPPED_BYTES",
            minimum=0,
        ),
    )
    nixl: NixlOptions = field(default_factory=NixlOptions)

    def __post_init__(self) -> None:
        if self.shm_mapped_bytes < 0:
            raise ValueError(f"shm mapped bytes must be 0 or more, got {self.shm_mapped_bytes}")
