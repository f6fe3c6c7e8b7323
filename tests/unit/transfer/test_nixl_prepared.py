"""PreparedReads with a fake nixl_agent: what is kept, what is released, and when."""

from __future__ import annotations

import itertools

from epd.server.transfer.nixl_prepared import PreparedReads


class FakeNixl:
    """Counts live handles the way NIXL would hold them."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.lists: dict[int, tuple] = {}
        self.requests: dict[int, bytes] = {}

    def prep_xfer_dlist(self, agent_name: str, regions: list, memory_type: str) -> int:
        handle = next(self._ids)
        self.lists[handle] = (agent_name, tuple(regions))
        return handle

    def make_prepped_xfer(self, operation: str, local: int, local_indices: list, remote: int,
                          remote_indices: list, notification: bytes) -> int:  # fmt: skip
        assert operation == "READ" and local in self.lists and remote in self.lists
        assert local_indices == remote_indices == list(range(len(self.lists[local][1])))
        handle = next(self._ids)
        self.requests[handle] = notification
        return handle

    def release_dlist_handle(self, handle: int) -> None:
        del self.lists[handle]

    def release_xfer_handle(self, handle: int) -> None:
        del self.requests[handle]


LOCAL_A = ((0x1000, 68, 0),)
LOCAL_B = ((0x9000, 68, 0),)
REMOTE = ((0x5000, 68, 0),)


def test_a_request_given_back_is_reused_without_new_handles() -> None:
    nixl = FakeNixl()
    reads = PreparedReads(nixl)
    key, request, epoch = reads.take("peer", "DRAM", LOCAL_A, REMOTE, b"n1")
    reads.give_back(key, request, epoch)
    again = reads.take("peer", "DRAM", LOCAL_A, REMOTE, b"n2")
    assert again[1] == request and len(nixl.lists) == 2 and len(nixl.requests) == 1
    reads.give_back(*again)
    quiet = reads.take("peer", "DRAM", LOCAL_A, REMOTE, b"")  # never reposts a notification
    assert quiet[1] != request and nixl.requests[quiet[1]] == b""
    reads.give_back(*quiet)
    assert len(reads) == 4


def test_drops_release_exactly_what_names_the_agent_or_the_block() -> None:
    nixl = FakeNixl()
    reads = PreparedReads(nixl)
    for local in (LOCAL_A, LOCAL_B):
        reads.give_back(*reads.take("peer", "DRAM", local, REMOTE, b"n"))
    reads.give_back(*reads.take("other", "DRAM", LOCAL_A, REMOTE, b"n"))
    assert len(nixl.lists) == 4 and len(nixl.requests) == 3
    assert reads.drop_local(0x9000, 4096) == 2  # LOCAL_B's list and its request
    assert reads.drop_agent("peer") == 2  # its remote list and LOCAL_A's request
    assert sorted(nixl.lists.values()) == [("", LOCAL_A), ("other", REMOTE)]
    assert reads.drop_remote() == 2 and list(nixl.lists.values()) == [("", LOCAL_A)]
    assert len(reads) == 1 and nixl.requests == {}


def test_a_request_out_during_a_drop_is_released_not_kept() -> None:
    nixl = FakeNixl()
    reads = PreparedReads(nixl)
    key, request, epoch = reads.take("peer", "DRAM", LOCAL_A, REMOTE, b"n")
    reads.drop_agent("peer")  # e.g. another thread's READ from the peer failed meanwhile
    reads.give_back(key, request, epoch)
    assert nixl.requests == {} and len(reads) == 1


def test_the_caches_are_bounded_and_release_what_they_evict() -> None:
    nixl = FakeNixl()
    reads = PreparedReads(nixl, capacity=2)
    for i in range(5):
        local = ((0x1000 * (i + 1), 68, 0),)
        reads.give_back(*reads.take("peer", "DRAM", local, REMOTE, b"n"))
    assert len(nixl.requests) == 2 and len(nixl.lists) == 2 and len(reads) == 4
