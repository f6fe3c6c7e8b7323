"""Recycled buffers for large private copies: size classes, reuse once a tensor dies, the idle
bound, and tensors that outlive ``close``; the shm and nixl consumers copy into them."""

from __future__ import annotations

import gc

import pytest
import torch

from epd.server.transfer.idle_pool import WarmBuffers, buffer_class
from epd.server.transfer.shm import ShmConsumer, ShmProducer

MIN = 64 << 10


@pytest.mark.parametrize(
    "num_bytes", [1, 4095, 4096, MIN, MIN + 1, 3 << 20, (96 << 20) + 5, (128 << 20) - 1, 128 << 20]
)
def test_a_buffer_class_wastes_at_most_an_eighth(num_bytes: int) -> None:
    capacity = buffer_class(num_bytes)
    assert capacity >= num_bytes and capacity % 4096 == 0
    assert capacity <= max(4096, num_bytes * 9 // 8 + 4096)
    assert buffer_class(capacity) == capacity


def test_small_tensors_are_plain_allocations() -> None:
    buffers = WarmBuffers(min_bytes=MIN)
    tensor = buffers.empty(torch.float32, [4, 8], 128)
    del tensor
    gc.collect()
    assert buffers.idle_bytes == 0


def test_a_buffer_comes_back_when_its_tensor_dies_and_is_reused() -> None:
    buffers = WarmBuffers(min_bytes=MIN)
    tensor = buffers.empty(torch.bfloat16, [3, MIN], 6 * MIN)
    assert tensor.dtype == torch.bfloat16 and tensor.shape == (3, MIN)
    tensor.fill_(1.5)
    address = tensor.data_ptr()
    other = buffers.empty(torch.bfloat16, [3, MIN], 6 * MIN)
    addresses = {address, other.data_ptr()}
    assert len(addresses) == 2, "a buffer in use is never handed out twice"
    del tensor, other
    gc.collect()
    assert buffers.idle_bytes == 2 * buffer_class(6 * MIN)
    again = buffers.empty(torch.float32, [6 * MIN // 4], 6 * MIN)
    assert again.data_ptr() in addresses


def test_idle_buffers_keep_to_their_bound_and_close_unmaps_them() -> None:
    buffers = WarmBuffers(min_bytes=MIN, max_idle_bytes=buffer_class(MIN))
    first, second = (buffers.empty(torch.uint8, [MIN], MIN) for _ in range(2))
    del first, second
    gc.collect()
    assert buffers.idle_bytes == buffer_class(MIN)
    survivor = buffers.empty(torch.uint8, [MIN], MIN)
    survivor.fill_(7)
    buffers.close()
    assert buffers.idle_bytes == 0
    assert int(survivor.sum()) == 7 * MIN, "a tensor outlives close"
    del survivor
    gc.collect()
    assert buffers.idle_bytes == 0


def test_shm_copies_land_in_recycled_buffers() -> None:
    producer, consumer = ShmProducer("host-a"), ShmConsumer("host-a")
    consumer.buffers = WarmBuffers(min_bytes=MIN)
    try:
        addresses = set()
        for fill in (1.0, 2.0, 3.0):
            ref = producer.put(torch.full((2, MIN), fill))
            copy = consumer.get(ref, copy=True)
            producer.release(ref.lease_id)
            assert torch.equal(copy, torch.full((2, MIN), fill))
            addresses.add(copy.data_ptr())
            del copy
        assert len(addresses) == 1 and consumer.buffers.idle_bytes == buffer_class(2 * MIN * 4)
    finally:
        consumer.close()
        producer.close()
