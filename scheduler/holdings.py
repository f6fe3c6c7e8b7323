"""Where each item (mm_hash) can be had without running a tower: the encoders whose caches hold
it, the embedding store, and the encoder encoding it now (single flight). No grpc, no I/O.

Fed by the encoders' held-item reports (``HeldReport``, sent with their heartbeats: what their
caches took and evicted, what they wrote to the store) and by the route's outcomes (an item an
encoder answered is in its cache from then on, before its next heartbeat says so). The index is
a hint: bounded to ``max_items`` items, least recently used dropped first; an entry an encoder
evicted since costs one encoding there, never a failure. Not thread-safe: the scheduler's lock
serialises every call.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence

from epd.common.held_items import HeldReport
from epd.scheduler.model import EncodeItem

# The holder id of the embedding store (worker ids are never empty).
STORE = ""


class Holdings:
    """Item -> holders (encoder ids, ``STORE``), and item -> encoders encoding it now."""

    def __init__(self, max_items: int = 100_000) -> None:
        if max_items < 1:
            raise ValueError(f"max_items must be at least 1, got {max_items}")
        self.max_items = max_items
        self._holders: OrderedDict[str, set[str]] = OrderedDict()
        self._items_of: dict[str, set[str]] = {}
        self._encoding: dict[str, Counter[str]] = {}

    # ---- what is held
    def apply(self, worker_id: str, report: HeldReport) -> None:
        """Fold an encoder's report in: a snapshot replaces what was known of its cache."""
        if report.is_snapshot:
            self.forget(worker_id, keep_encoding=True)
        for mm_hash in report.evicted:
            self.drop(worker_id, mm_hash)
        for mm_hash in report.added:
            self.hold(worker_id, mm_hash)
        for mm_hash in report.stored:
            self.hold(STORE, mm_hash)

    def hold(self, holder: str, mm_hash: str) -> None:
        """Record that ``holder`` holds ``mm_hash`` (the least recently used item goes past
        the bound)."""
        self._holders.setdefault(mm_hash, set()).add(holder)
        self._holders.move_to_end(mm_hash)
        self._items_of.setdefault(holder, set()).add(mm_hash)
        while len(self._holders) > self.max_items:
            evicted, holders = self._holders.popitem(last=False)
            for other in holders:
                self._items_of[other].discard(evicted)

    def drop(self, holder: str, mm_hash: str) -> None:
        """Record that ``holder`` no longer holds ``mm_hash`` (unknown pairs are ignored)."""
        holders = self._holders.get(mm_hash)
        if holders is None:
            return
        holders.discard(holder)
        self._items_of.get(holder, set()).discard(mm_hash)
        if not holders:
            del self._holders[mm_hash]

    def forget(self, holder: str, *, keep_encoding: bool = False) -> None:
        """Drop everything ``holder`` held (it left, or its snapshot follows) and, unless
        ``keep_encoding``, what it was encoding."""
        for mm_hash in self._items_of.pop(holder, set()):
            self.drop(holder, mm_hash)
        if keep_encoding:
            return
        for mm_hash in [h for h, on in self._encoding.items() if holder in on]:
            del self._encoding[mm_hash][holder]
            if not self._encoding[mm_hash]:
                del self._encoding[mm_hash]

    def can_serve(self, worker_id: str, mm_hash: str) -> bool:
        """Whether ``worker_id`` answers ``mm_hash`` without its tower: held in its cache or in
        the store, or being encoded there now."""
        holders = self._holders.get(mm_hash, ())
        encoding = self._encoding.get(mm_hash, ())
        return worker_id in holders or STORE in holders or worker_id in encoding

    def held_by(self, holder: str, limit: int | None = None) -> list[str]:
        """The items ``holder`` is believed to hold (``limit``: at most that many), sorted."""
        return sorted(self._items_of.get(holder, ()))[:limit]

    def num_held(self) -> dict[str, int]:
        """How many items each holder is believed to hold (holders holding none left out)."""
        return {holder: len(items) for holder, items in self._items_of.items() if items}

    @property
    def num_encoding(self) -> int:
        """Items being encoded now (assigned to encode, not yet reported)."""
        return len(self._encoding)

    def __len__(self) -> int:
        return len(self._holders)

    # ---- what is being encoded
    def start_encoding(self, mm_hash: str, worker_id: str) -> None:
        """``worker_id`` was given ``mm_hash`` to encode (one more open assignment)."""
        self._encoding.setdefault(mm_hash, Counter())[worker_id] += 1

    def close(
        self, mm_hash: str, worker_id: str, *, was_encoding: bool, answered: bool, computed: bool
    ) -> None:
        """One assignment of ``mm_hash`` to ``worker_id`` closed: ``was_encoding``, it was
        given it to encode (``start_encoding``); ``answered``, it answered it (so its cache
        holds it now); ``computed``, its tower ran for it (so the store, if believed to hold it,
        did not)."""
        if was_encoding and (encoders := self._encoding.get(mm_hash)) is not None:
            encoders[worker_id] -= 1
            if encoders[worker_id] <= 0:
                del encoders[worker_id]
            if not encoders:
                del self._encoding[mm_hash]
        if answered:
            self.hold(worker_id, mm_hash)
        holders = self._holders[mm_hash] if answered else self._holders.get(mm_hash, set())
        if computed and STORE in holders:
            holders.discard(STORE)
            self._items_of[STORE].discard(mm_hash)

    # ---- placement
    def place(self, items: Sequence[EncodeItem], candidates: Iterable[str]) -> list[str | None]:
        """The encoder each item must go to, or None (the policy chooses): one encoding it now
        (it answers every request for it from that one encoding), else one whose cache holds
        it, the first in ``candidates``' order either way."""
        order = list(candidates)
        placed: list[str | None] = []
        for item in items:
            encoding = self._encoding.get(item.mm_hash, Counter())
            holders = self._holders.get(item.mm_hash, set())
            chosen = next((w for w in order if w in encoding), None)
            chosen = chosen or next((w for w in order if w in holders), None)
            if chosen is not None and item.mm_hash in self._holders:
                self._holders.move_to_end(item.mm_hash)
            placed.append(chosen if item.mm_hash else None)
        return placed
