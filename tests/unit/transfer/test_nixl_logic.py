"""NIXL backend logic with a fake agent: pool reuse and registration counts, leases released by
notification or expiry, descriptor validation. No real NIXL agent is created here."""

from __future__ import annotations

import gc
from typing import cast

import pytest
import torch

from epd.common.errors import InvalidArgument, NotFound
from epd.server.transfer.nixl import RELEASE_PREFIX, AgentFactory, NixlProducer
from epd.server.transfer.nixl_agent import NixlAgent
from epd.server.transfer.nixl_consumer import (
    SMALL_COPY_BYTES,
    NixlConsumer,
    mirror,
    remote_payload,
)
from epd.server.transfer.nixl_pool import RegisteredPool, StampArena
from epd.server.transfer.payload_layout import HEADER_BYTES
from epd.v1 import tensor_pb2


class FakeAgent:
    """Records registrations; ``read`` copies from this process's memory like a loopback READ."""

    name = "epd-fake-1-abc"

    def __init__(self) -> None:
        self.registered: set[int] = set()
        self.listeners: list = []
        self.pending: list[bytes] = []

    def register(self, address: int, length: int) -> None:
        self.registered.add(address)

    def deregister(self, address: int) -> None:
        self.registered.discard(address)

    def share(self, address: int, length: int, memory_type: str, device_id: int) -> bool:
        self.registered.add(address)
        return True

    def unshare(self, address: int) -> None:
        self.registered.discard(address)

    def metadata(self, address: int) -> bytes:
        assert address in self.registered
        return b"meta:%d" % address

    def connect(self, agent_name: str, metadata: bytes) -> None:
        pass

    def read(
        self,
        local,
        remote,
        agent_name,
        *,
        remote_memory_type="DRAM",
        local_memory_type="DRAM",
        timeout_s=30.0,
    ) -> None:
        import ctypes

        assert (remote_memory_type, local_memory_type) == ("DRAM", "DRAM")

        for (dst, length, _), (src, _, _) in zip(local, remote, strict=True):
            ctypes.memmove(dst, src, length)

    def notify(self, agent_name: str, message: bytes) -> None:
        self.pending.append(message)

    def add_listener(self, listener) -> None:
        self.listeners.append(listener)

    def remove_listener(self, listener) -> None:
        self.listeners.remove(listener)

    def poll(self) -> int:
        delivered, self.pending = self.pending, []
        for message in delivered:
            for listener in list(self.listeners):
                listener("peer", message)
        return len(delivered)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def agent() -> FakeAgent:
    return FakeAgent()


def make_producer(agent: FakeAgent, clock: FakeClock | None = None) -> NixlProducer:
    return NixlProducer(
        "host-a", ttl_s=10.0, clock=clock or FakeClock(), agent_factory=factory(agent)
    )


def factory(agent: FakeAgent) -> AgentFactory:
    """``agent`` as the agent factory of a producer or consumer."""
    return lambda: cast(NixlAgent, agent)


def test_pool_reuses_blocks_and_deregisters_on_close(agent: FakeAgent) -> None:
    pool = RegisteredPool(agent, max_idle_bytes=1 << 20)  # type: ignore[arg-type]
    first = pool.acquire(1000)
    pool.give_back(first)
    assert pool.acquire(900) is first and len(agent.registered) == 1
    big = pool.acquire(4 << 20)
    assert len(agent.registered) == 2 and pool.num_outstanding == 2
    pool.give_back(big)  # over the idle budget: deregistered at once
    assert agent.registered == {first.address}
    pool.close()
    pool.give_back(first)  # a block coming back after close is deregistered, not kept
    assert agent.registered == set() and pool.num_outstanding == 0


def test_notification_releases_and_release_stays_idempotent(agent: FakeAgent) -> None:
    producer = make_producer(agent)
    consumer = NixlConsumer(agent_factory=factory(agent))
    tensor = torch.randn(128, 128).to(torch.bfloat16)  # above SMALL_COPY_BYTES: a view
    ref = producer.put(tensor)
    # one descriptor: the stamp and the payload behind it, fetched by one READ
    assert [d.length for d in ref.nixl.descriptors] == [HEADER_BYTES + ref.byte_size]
    assert ref.nixl.agent_name == agent.name and ref.nixl.agent_metadata
    view = consumer.get(ref)
    assert torch.equal(view, tensor) and consumer.num_outstanding == 1
    assert agent.pending == [RELEASE_PREFIX + ref.lease_id.encode()]
    assert producer.held() == [] and producer.release(ref.lease_id) is False
    reshaped = view.reshape(-1)
    del view
    gc.collect()
    assert consumer.num_outstanding == 1  # a derived view still holds the block
    del reshaped
    gc.collect()
    assert consumer.num_outstanding == 0
    producer.close()
    consumer.close()
    assert agent.registered == set()


def test_copy_returns_the_block_at_once_and_expiry_is_reaped(agent: FakeAgent) -> None:
    clock = FakeClock()
    producer = make_producer(agent, clock)
    consumer = NixlConsumer(agent_factory=factory(agent), release_after_read=False)
    ref = producer.put(torch.arange(10, dtype=torch.int64))
    assert torch.equal(consumer.get(ref, copy=True), torch.arange(10))
    assert consumer.num_outstanding == 0 and len(producer.held()) == 1
    clock.now += 10.0
    assert producer.reap_expired() == 1 and producer.held() == []
    with pytest.raises(NotFound) as caught:
        consumer.get(ref)
    assert caught.value.reason == "LEASE_RELEASED"
    producer.close()
    consumer.close()
    assert agent.registered == set()


def test_a_lend_without_a_free_stamp_slot_is_undone_and_copied(
    agent: FakeAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(StampArena, "take", lambda self, lease_id: None)
    producer = NixlProducer("host-a", agent_factory=factory(agent), zero_copy_min_bytes=1)
    tensor = torch.arange(1024, dtype=torch.int64)
    ref = producer.put(tensor)
    assert [d.length for d in ref.nixl.descriptors] == [HEADER_BYTES + ref.byte_size]
    assert len(producer.held()) == 1
    assert tensor.data_ptr() not in agent.registered
    producer.close()
    assert agent.registered == set()


def nixl_ref(byte_size: int, lengths: list[int], **location: object) -> tensor_pb2.TensorRef:
    ref = tensor_pb2.TensorRef(
        dtype=tensor_pb2.SCALAR_TYPE_UINT8, shape=[byte_size], byte_size=byte_size
    )
    ref.nixl.CopyFrom(tensor_pb2.NixlLocation(**{"agent_name": "a", **location}))  # type: ignore[arg-type]
    for i, length in enumerate(lengths):
        ref.nixl.descriptors.add(address=4096 * (i + 1), length=length)
    return ref


def test_remote_payload_accepts_stamped_and_plain_layouts() -> None:
    assert remote_payload(nixl_ref(100, [HEADER_BYTES, 100]))[3] is True
    assert remote_payload(nixl_ref(100, [HEADER_BYTES + 100]))[3] is True  # stamp + payload
    assert remote_payload(nixl_ref(0, [HEADER_BYTES]))[3] is True
    assert remote_payload(nixl_ref(100, [60, 40]))[3] is False
    assert remote_payload(nixl_ref(100, [100], memory_type=2)) == (
        "a",
        "VRAM",
        ((4096, 100, 0),),
        False,
    )
    assert mirror(((1, 10, 0), (99, 5, 0)), 1000) == ((1000, 10, 0), (1010, 5, 0))
    assert mirror(((1, 10, 0),), 1000) == ((1000, 10, 0),)


@pytest.mark.parametrize(
    "ref, reason",
    [
        (nixl_ref(100, [HEADER_BYTES, 99]), "TENSOR_SIZE_MISMATCH"),
        (nixl_ref(100, [HEADER_BYTES + 99]), "TENSOR_SIZE_MISMATCH"),
        (nixl_ref(100, [HEADER_BYTES + 101]), "TENSOR_SIZE_MISMATCH"),
        (nixl_ref(100, [HEADER_BYTES - 1, 101]), "TENSOR_SIZE_MISMATCH"),  # a cut stamp
        (nixl_ref(100, []), "BAD_TENSOR_REF"),
        (nixl_ref(100, [100, 0]), "BAD_TENSOR_REF"),
        (nixl_ref(100, [1] * 100), "BAD_TENSOR_REF"),
        (nixl_ref(100, [100], memory_type=7), "BAD_TENSOR_REF"),
        (nixl_ref(100, [100], agent_name=""), "BAD_TENSOR_REF"),
    ],
)
def test_remote_payload_refuses_malformed_descriptors(
    ref: tensor_pb2.TensorRef, reason: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        remote_payload(ref)
    assert caught.value.reason == reason


def test_a_reference_without_location_is_refused_as_such(agent: FakeAgent) -> None:
    ref = nixl_ref(100, [100])
    ref.ClearField("nixl")
    consumer = NixlConsumer(agent_factory=factory(agent))
    with pytest.raises(InvalidArgument, match="no location") as caught:
        consumer.get(ref)
    assert caught.value.reason == "BAD_TENSOR_REF"


def test_small_payloads_come_back_as_private_copies(agent: FakeAgent) -> None:
    producer = make_producer(agent)
    consumer = NixlConsumer(agent_factory=factory(agent))
    tensor = torch.randn(64, 32).to(torch.bfloat16)
    assert tensor.numel() * 2 <= SMALL_COPY_BYTES
    received = consumer.get(producer.put(tensor))
    assert torch.equal(received, tensor) and consumer.num_outstanding == 0
    producer.close()
    consumer.close()
    assert agent.registered == set()


SMALL_TENSORS = [
    torch.tensor(2.5),
    torch.arange(6.0).reshape(2, 3),
    torch.zeros(0, 4),
    torch.arange(5, dtype=torch.int32),
]


@pytest.mark.parametrize("tensor", SMALL_TENSORS)
def test_small_payloads_come_back_as_private_tensors_of_their_shape(
    agent: FakeAgent, tensor: torch.Tensor
) -> None:
    producer = make_producer(agent)
    consumer = NixlConsumer(agent_factory=factory(agent))
    ref = producer.put(tensor)
    got = consumer.get(ref)
    assert got.shape == tensor.shape and got.dtype == tensor.dtype and torch.equal(got, tensor)
    assert consumer.num_outstanding == 0  # the receive block went back at once
    got.add_(1)  # private and writable
    agent.poll()
    assert producer.held() == []
    producer.close()
    consumer.close()
    assert agent.registered == set()
