"""What an encoder holds, as its heartbeats report it to the scheduler: the report both sides
share (``HeldReport``) and its wire form (``epd.v1.HeldItems``), so that the encoder's journal
and the scheduler's index of held items need not import each other (no grpc)."""

from __future__ import annotations

from dataclasses import dataclass

from epd.v1 import scheduler_service_pb2 as pb


@dataclass(frozen=True, slots=True)
class HeldReport:
    """What an encoder's cache took and evicted since its previous heartbeat, and what it wrote
    to the embedding store; ``is_snapshot``: ``added`` is the whole cache (epd.v1.HeldItems)."""

    is_snapshot: bool = False
    added: tuple[str, ...] = ()
    evicted: tuple[str, ...] = ()
    stored: tuple[str, ...] = ()


def held_from_proto(load: pb.WorkerLoad) -> HeldReport | None:
    """The held-items report of a heartbeat's load; None when it carries none."""
    if not load.HasField("held_items"):
        return None
    held = load.held_items
    return HeldReport(
        held.is_snapshot,
        tuple(held.added_mm_hashes),
        tuple(held.evicted_mm_hashes),
        tuple(held.stored_mm_hashes),
    )


def held_to_proto(held: HeldReport) -> pb.HeldItems:
    """An encoder's held-items report as sent with its heartbeat."""
    return pb.HeldItems(
        is_snapshot=held.is_snapshot,
        added_mm_hashes=held.added,
        evicted_mm_hashes=held.evicted,
        stored_mm_hashes=held.stored,
    )
